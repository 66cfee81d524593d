"""f16 storage: kernels compute in f32 and read and write f16 tensors through conversions.

Mixed precision (``precision="mixed"``) stores activations as f16 (2 bytes an element) but
every kernel still computes in f32: op emitters write f32 code whatever their tensors' dtypes,
and :func:`half_storage` rewrites the finished WGSL of a kernel whose bindings hold f16:

* each read of an f16 input, ``in{k}[x]``, becomes ``f32(in{k}[x])`` (``vec4<f32>(...)`` for an
  input read as vec4s), so the arithmetic and any accumulation stay f32;
* each write to an f16 output, ``out[x] = y;``, becomes ``out[x] = f16(y);`` (a read of ``out``,
  ``f32(out[x])``); a compound assignment (``out[x] += y;``) is refused;
* ``enable f16;`` goes first (the WGSL extension of WebGPU's ``shader-f16`` feature).

The bindings themselves are declared ``array<f16>`` by :func:`tensorgrad.codegen.wgsl.bindings`.
The text matches the conventions every kernel follows (``tensorgrad/codegen/wgsl.py``): inputs
are read only as ``in{k}[...]``, the output written as ``out[...] = ...;``.
"""

from __future__ import annotations

import re
from collections.abc import Collection

_ACCESS = re.compile(r"\bin(\d+)\[|\bout\[")
_ASSIGN = re.compile(r"\s*=(?!=)\s*")
_COMPOUND = re.compile(r"\s*[-+*/%&|^]=")
ENABLE = "enable f16;"
_F16 = re.compile(r"\bf16\b")


def closing(text: str, start: int) -> int:
    """Index of the bracket that closes the one opened just before `start`."""
    depth = 1
    for j in range(start, len(text)):
        if text[j] in "[(":
            depth += 1
        elif text[j] in "])":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced brackets in a kernel")


def half_storage(wgsl: str, half_inputs: Collection[int], vector_inputs: Collection[int],
                 half_output: bool, op: str = "") -> str:
    """`wgsl` with the reads of the f16 inputs (slots `half_inputs`) and the reads and writes
    of an f16 output (`half_output`) converted from and to f32, and ``enable f16;`` first;
    unchanged but for ``enable f16;`` when no binding is f16 (a fused program that rounds a
    value it holds to f16 names the type too). `op` names the kernel in errors."""
    body = wgsl
    if half_inputs or half_output:
        body = _convert(wgsl, frozenset(half_inputs), frozenset(vector_inputs), half_output, op)
    return f"{ENABLE}\n{body}" if _F16.search(body) else body


def _convert(text: str, half: frozenset[int], vector: frozenset[int], half_out: bool,
             op: str) -> str:
    out: list[str] = []
    pos = 0
    while (m := _ACCESS.search(text, pos)) is not None:
        end = closing(text, m.end())
        index = _convert(text[m.end():end], half, vector, half_out, op)
        access = f"{text[m.start():m.end()]}{index}]"
        out.append(text[pos:m.start()])
        pos = end + 1
        if m.group(1) is not None:  # an input
            slot = int(m.group(1))
            if slot in half:
                access = f"vec4<f32>({access})" if slot in vector else f"f32({access})"
            out.append(access)
            continue
        if not half_out:
            out.append(access)
            continue
        if _COMPOUND.match(text, pos):
            raise ValueError(f"the '{op}' kernel updates `out` in place ({access} ...), which "
                             "an f16 output cannot take: write `out[x] = value;` once")
        assign = _ASSIGN.match(text, pos)
        if assign is None:  # a read of the output
            out.append(f"f32({access})")
            continue
        semi = text.find(";", assign.end())
        if semi < 0:
            raise ValueError(f"the '{op}' kernel writes {access} without a closing ';'")
        value = _convert(text[assign.end():semi], half, vector, half_out, op)
        out.append(f"{access} = f16({value});")
        pos = semi + 1
    out.append(text[pos:])
    return "".join(out)


__all__ = ["ENABLE", "closing", "half_storage"]
