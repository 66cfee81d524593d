"""Small helpers the op emitters share: types, literals, bindings, index math, kernel shells.

Conventions: bind group 0, inputs first (`in0`, `in1`, ... read-only), output last (`out`,
read_write). `bool` is stored as u32. All shapes are baked into the text as literals. An f16
tensor (mixed precision) is bound as `array<f16>` but computed with as f32: emitters write
f32 code, and :func:`tensorgrad.codegen.storage.half_storage` converts its reads and writes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from math import prod

from ..ir import DType, Node
from .kernel import MAX_GROUPS_X, EmitContext, Kernel

WG = 256

# `is_nan(x)` for kernels that must keep a NaN where WGSL leaves it to the driver (max, min
# and comparisons: several drivers let the other operand win). A bit test: a comparison
# x != x may be compiled away by drivers that assume no NaN.
IS_NAN_WGSL = """fn is_nan(x: f32) -> bool {
  return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}"""

# The WGSL type a kernel computes with: f16 values are read into f32s.
_TYPES = {"f32": "f32", "i32": "i32", "bool": "u32", "f16": "f32"}
# The element type of a binding.
_STORAGE = {**_TYPES, "f16": "f16"}


def wgsl_type(dtype: DType) -> str:
    """The WGSL type of a value of `dtype` in a kernel (f32 for f16: kernels compute in f32)."""
    return _TYPES[dtype]


def storage_type(dtype: DType) -> str:
    """The WGSL element type of a binding of `dtype`."""
    return _STORAGE[dtype]


def lit(value: float | bool, dtype: DType = "f32") -> str:
    """A WGSL literal of `dtype` (f16: an f32 literal, the type f16 values are computed in).
    Non-finite floats become +-1e30."""
    if dtype in ("f32", "f16"):
        v = float(value)
        if not math.isfinite(v):
            v = 1e30 if (v > 0 or math.isnan(v)) else -1e30
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        return f"{text}f" if not text.startswith("-") else f"({text}f)"
    if dtype == "i32":
        return f"{int(value)}i" if int(value) >= 0 else f"({int(value)}i)"
    return "1u" if value else "0u"


def u(n: int) -> str:
    return f"{int(n)}u"


def strides(shape: Sequence[int]) -> list[int]:
    out = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        out[k] = out[k + 1] * shape[k + 1]
    return out


def broadcast_index(out_shape: Sequence[int], in_shape: Sequence[int], var: str = "i") -> str:
    """WGSL expression: the flat index into `in_shape` read by output flat index `var` under
    right-aligned broadcasting (size-1 and missing axes contribute nothing)."""
    if tuple(in_shape) == tuple(out_shape):
        return var
    if prod(in_shape) == 1:
        return "0u"
    out_st = strides(out_shape)
    in_st = strides(in_shape)
    offset = len(out_shape) - len(in_shape)
    terms = []
    for k, dim in enumerate(in_shape):
        if dim == 1:
            continue
        ok = k + offset
        coord = f"(({var} / {u(out_st[ok])}) % {u(out_shape[ok])})" if ok > 0 else \
            f"({var} / {u(out_st[ok])})"
        terms.append(f"{coord} * {u(in_st[k])}")
    return " + ".join(terms) if terms else "0u"


def bindings(inputs: Sequence[Node], out: Node, vector_inputs: frozenset[int] = frozenset()
             ) -> str:
    """The binding declarations: `in{k}` (read) per input, then `out` (read_write); inputs
    in `vector_inputs` (f32 or f16) are declared as arrays of vec4s. f16 tensors are declared
    `f16` (the kernel needs `enable f16;`, which :func:`~tensorgrad.codegen.storage.half_storage`
    adds with the conversions of their reads and writes)."""
    def element(k: int, n: Node) -> str:
        if k not in vector_inputs:
            return storage_type(n.dtype)
        if n.dtype not in ("f32", "f16"):
            raise ValueError(f"only float inputs can be read as vec4s, input {k} is {n.dtype}")
        return f"vec4<{storage_type(n.dtype)}>"

    lines = [f"@group(0) @binding({k}) var<storage, read> in{k}: array<{element(k, n)}>;"
             for k, n in enumerate(inputs)]
    lines.append(f"@group(0) @binding({len(inputs)}) var<storage, read_write> out: "
                 f"array<{storage_type(out.dtype)}>;")
    return "\n".join(lines)


def thread_kernel(ctx: EmitContext, body: str, threads: int | None = None,
                  prelude: str = "", size: int = WG,
                  vector_inputs: frozenset[int] = frozenset()) -> Kernel:
    """One invocation per index `i` in [0, threads) (default: one per output element), in
    workgroups of `size`; `vector_inputs` as for :func:`bindings`."""
    n = ctx.node.size if threads is None else threads
    wgsl = f"""{bindings(ctx.inputs, ctx.node, vector_inputs)}
{prelude}
@compute @workgroup_size({size})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
  let i = gid.x + gid.y * {u(MAX_GROUPS_X * size)};
  if (i >= {u(n)}) {{ return; }}
{body}
}}
"""
    return Kernel(wgsl, n, size, vector_inputs=vector_inputs)


def workgroup_kernel(ctx: EmitContext, body: str, groups: int, prelude: str = "",
                     size: int = WG) -> Kernel:
    """One workgroup of `size` invocations per index `g` in [0, groups); `lid` is the local
    index. The early return is uniform across the workgroup, so barriers are allowed."""
    wgsl = f"""{bindings(ctx.inputs, ctx.node)}
{prelude}
@compute @workgroup_size({size})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
  let g = wid.x + wid.y * {u(MAX_GROUPS_X)};
  if (g >= {u(groups)}) {{ return; }}
{body}
}}
"""
    return Kernel(wgsl, groups * size, size)


OWN_INDEX = re.compile(r"\bix\b")


def elementwise(ctx: EmitContext, expr: str, prelude: str = "") -> Kernel:
    """out[i] = expr, where `expr` may use a0, a1, ... (each input read with broadcasting)
    and `ix` (the output index)."""
    expr = OWN_INDEX.sub("i", expr)
    loads = "\n".join(
        f"  let a{k} = in{k}[{broadcast_index(ctx.node.shape, n.shape)}];"
        for k, n in enumerate(ctx.inputs))
    return thread_kernel(ctx, f"{loads}\n  out[i] = {expr};", prelude=prelude)


def decompose(var: str, dims: Sequence[int], weights: Sequence[int]) -> str:
    """WGSL expression sum_k coord_k * weights[k], where coords are `var` decomposed
    row-major over `dims` (dims of size 1 contribute nothing)."""
    st = strides(dims)
    terms = []
    for k, (d, w) in enumerate(zip(dims, weights)):
        if d == 1 or w == 0:
            continue
        coord = f"({var} / {u(st[k])})" if k == 0 else f"(({var} / {u(st[k])}) % {u(d)})"
        if st[k] == 1 and k > 0:
            coord = f"({var} % {u(d)})"
        terms.append(coord if w == 1 else f"{coord} * {u(w)}")
    return " + ".join(terms) if terms else "0u"


# Variant choice for reductions: one workgroup per output when there are few outputs and
# long rows, else one thread per output with a serial loop.
WORKGROUP_REDUCE_MAX_OUTPUTS = 32_768
WORKGROUP_REDUCE_MIN_LENGTH = 256
# Software targets (CPU rasterisers) reduce rows up to this long with a serial loop, since a
# barrier there suspends and resumes every invocation of the workgroup (SwiftShader: ~200 us
# per 256-wide workgroup, the cost of a 30,000-element serial loop). The bound stays under
# lavapipe's budget of 65,535 loop iterations per invocation, past which it quietly stops.
SOFTWARE_SERIAL_MAX_LENGTH = 32_768
# Workgroup size of the serial-loop reductions on software targets: small, so that a few
# hundred outputs still spread over the CPU's cores.
SOFTWARE_REDUCE_WG = 32


def use_workgroup_reduce(ctx: EmitContext, outputs: int, length: int) -> bool:
    """Whether a reduction of `outputs` rows of `length` takes a workgroup per row (a
    strided loop and a shared-memory tree) rather than a thread per row (a serial loop)."""
    if ctx.target.software:
        return length > SOFTWARE_SERIAL_MAX_LENGTH
    return outputs < WORKGROUP_REDUCE_MAX_OUTPUTS and length >= WORKGROUP_REDUCE_MIN_LENGTH


def serial_reduce_size(ctx: EmitContext) -> int:
    """Workgroup size of a one-thread-per-output reduction on `ctx`'s target."""
    return SOFTWARE_REDUCE_WG if ctx.target.software else WG


def reduce_kernel(ctx: EmitContext, outputs: int, length: int, index: str,
                  finalize: str = "acc", prelude: str = "") -> Kernel:
    """out[o] = finalize(sum over r in [0, length) of in0[index]), where `index` is a WGSL
    expression in `o` (output index) and `r` (reduction index); `finalize` uses `acc`."""
    if use_workgroup_reduce(ctx, outputs, length):
        body = f"""  let o = g;
  var part = 0.0f;
  for (var r = lid; r < {u(length)}; r = r + {u(WG)}) {{ part = part + in0[{index}]; }}
  scratch[lid] = part;
  workgroupBarrier();
  for (var s = {u(WG // 2)}; s > 0u; s = s >> 1u) {{
    if (lid < s) {{ scratch[lid] = scratch[lid] + scratch[lid + s]; }}
    workgroupBarrier();
  }}
  if (lid == 0u) {{ let acc = scratch[0]; out[o] = {finalize}; }}"""
        return workgroup_kernel(ctx, body, outputs,
                                prelude=f"var<workgroup> scratch: array<f32, {WG}>;\n{prelude}")
    body = f"""  let o = i;
  var acc = 0.0f;
  for (var r = 0u; r < {u(length)}; r = r + 1u) {{ acc = acc + in0[{index}]; }}
  out[o] = {finalize};"""
    return thread_kernel(ctx, body, outputs, prelude=prelude, size=serial_reduce_size(ctx))
