"""Window geometry and helpers shared by convolution (:mod:`.conv`, :mod:`.conv_tiled`) and
pooling (:mod:`.pool`), NCHW: the (h, w) pairs of kernels, strides and padding, output sizes
`floor((in + 2 pad - k) / stride) + 1`, the NumPy views of a window's taps, and the WGSL
snippets that index, mask and bound-check taps.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import tensorgrad.codegen.wgsl as w

from ..errors import ShapeError
from ..ir import Node
from .rules import is_int

Pair = tuple[int, int]
IntOrPair = int | Sequence[int]


def _np() -> ModuleType:
    import numpy as np
    return np


def _pair(op: str, name: str, v: IntOrPair) -> Pair:
    if is_int(v):
        return (v, v)
    if isinstance(v, Sequence) and len(v) == 2 and all(is_int(x) for x in v):
        return (v[0], v[1])
    raise ShapeError(op, f"{name} must be an int or a pair of ints (h, w), got {v!r}")


def _out_size(op: str, what: str, size: int, k: int, stride: int, pad: int) -> int:
    out = (size + 2 * pad - k) // stride + 1
    if out < 1:
        raise ShapeError(op, f"output {what} would be {out} (input {size}, kernel {k}, "
                         f"stride {stride}, padding {pad}); it must be >= 1")
    return out


def _check_window(op: str, kernel: Pair, stride: Pair, pad: Pair) -> None:
    if min(kernel) < 1:
        raise ShapeError(op, f"kernel size must be >= 1, got {list(kernel)}")
    if min(stride) < 1:
        raise ShapeError(op, f"stride must be >= 1, got {list(stride)}")
    if min(pad) < 0:
        raise ShapeError(op, f"padding must be >= 0, got {list(pad)}")


def _require_rank4(op: str, node: Node, what: str, layout: str) -> None:
    if len(node.shape) != 4:
        raise ShapeError(op, f"{what} must be rank 4 {layout}, got shape {list(node.shape)}")


# ---- reference semantics (NumPy, any float dtype) ---------------------------------------

def _windows(xp: Any, i: int, j: int, out_hw: Sequence[int], stride: Pair) -> Any:
    """The [.., Ho, Wo] view of padded `xp` read by kernel tap (i, j)."""
    (ho, wo), (sh, sw) = out_hw, stride
    return xp[..., i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]


def _pad(x: Any, pad: Pair, value: float = 0.0) -> Any:
    ph, pw = pad
    return _np().pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


# ---- kernels ---------------------------------------------------------------------------

def _split(var: str, names: Sequence[str], dims: Sequence[int]) -> str:
    """WGSL lines decomposing flat index `var` row-major over `dims` into `names`."""
    lines, rest = [], var
    for k in range(len(dims) - 1, 0, -1):
        lines.append(f"  let {names[k]} = {rest} % {w.u(dims[k])};")
        lines.append(f"  let {names[k]}_r = {rest} / {w.u(dims[k])};")
        rest = f"{names[k]}_r"
    lines.append(f"  let {names[0]} = {rest};")
    return "\n".join(lines)


def _tap(coord: str, out: str, k: str, stride: int, pad: int, size: int) -> str:
    """WGSL: `let {coord} = out*stride + k - pad` as i32, then skip when out of [0, size)."""
    return (f"let {coord} = i32({out} * {w.u(stride)} + {k}) - {pad}i;\n"
            f"      if ({coord} < 0i || {coord} >= {size}i) {{ continue; }}")


def _source(coord: str, pos: str, k: str, stride: int, pad: int, size: int) -> str:
    """WGSL: the output position `coord` whose window puts tap `k` on input position `pos`
    (skip when there is none)."""
    lines = [f"let {coord}_n = i32({pos}) + {pad}i - i32({k});",
             f"if ({coord}_n < 0i) {{ continue; }}"]
    if stride > 1:
        lines.append(f"if ({coord}_n % {stride}i != 0i) {{ continue; }}")
    lines.append(f"let {coord} = u32({coord}_n) / {w.u(stride)};")
    lines.append(f"if ({coord} >= {w.u(size)}) {{ continue; }}")
    return "\n        ".join(lines)


def _in_range(v: str, size: int) -> str:
    return f"({v} >= 0i && {v} < {size}i)"


def _mask(*conds: str) -> str:
    live = [c for c in conds if c != "true"]
    return " && ".join(live) if live else "true"


def _masked(value: str, mask: str) -> str:
    return value if mask == "true" else f"select(0.0f, {value}, {mask})"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
