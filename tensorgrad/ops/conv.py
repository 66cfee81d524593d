"""2-D convolution, max pooling and nearest upsampling (NCHW).

Primitives: `conv2d` with its backward ops `conv2d_input_grad` and `conv2d_weight_grad`,
`max_pool2d` with `max_pool2d_grad`. Output sizes follow `floor((in + 2 pad - k) / stride) + 1`.
Padding is zeros for convolution; for pooling padded cells never win, ties go to the first
cell of the row-major window scan, and the backward recomputes that scan (no stored indices).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Node, Shape
from ..tensor import Tensor
from .registry import GRAD_ERROR, define, public, record
from .rules import is_int, require_dtype

Pair = tuple[int, int]
IntOrPair = int | Sequence[int]

# The weight gradient uses one workgroup per weight element when there are few weights and
# a long reduction over batch and output pixels.
WEIGHT_GRAD_WG_MAX_WEIGHTS = 32_768
WEIGHT_GRAD_WG_MIN_LENGTH = 256
POOL_INIT = -3.4e38
MAX_UNROLL_TAPS = 49  # kernels with at most this many taps get straight-line tap code


def _np():
    import numpy as np
    return np


def _pair(op: str, name: str, v: IntOrPair) -> Pair:
    if is_int(v):
        return (v, v)  # type: ignore[return-value]
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


def _conv_geometry(op: str, x: Shape, w_shape: Shape, stride: Pair, pad: Pair,
                   groups: int) -> tuple[int, int]:
    """Checks a convolution's shapes; returns (Hout, Wout)."""
    cin, cout, cig = x[1], w_shape[0], w_shape[1]
    if not is_int(groups) or groups < 1:
        raise ShapeError(op, f"groups must be a positive int, got {groups!r}")
    if cin % groups or cout % groups:
        raise ShapeError(op, f"groups={groups} must divide the input channels ({cin}, x "
                         f"{list(x)}) and the output channels ({cout}, w {list(w_shape)})")
    if cin // groups != cig:
        raise ShapeError(op, f"weight {list(w_shape)} expects {cig} input channels per group "
                         f"but x {list(x)} has {cin} channels / {groups} groups = "
                         f"{cin // groups}")
    kernel = (w_shape[2], w_shape[3])
    _check_window(op, kernel, stride, pad)
    return (_out_size(op, "height", x[2], kernel[0], stride[0], pad[0]),
            _out_size(op, "width", x[3], kernel[1], stride[1], pad[1]))


# ---- shape rules -----------------------------------------------------------------------

def _infer_conv2d(inputs: Sequence[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    x, wt = inputs
    require_dtype("conv2d", x, "f32", what="input")
    require_dtype("conv2d", wt, "f32", what="weight")
    _require_rank4("conv2d", x, "input", "[B, Cin, H, W]")
    _require_rank4("conv2d", wt, "weight", "[Cout, Cin/groups, kH, kW]")
    ho, wo = _conv_geometry("conv2d", x.shape, wt.shape, attrs["stride"], attrs["padding"],
                            attrs["groups"])
    return (x.shape[0], wt.shape[0], ho, wo), "f32"


def _infer_conv2d_input_grad(inputs: Sequence[Node], attrs: dict[str, Any]
                             ) -> tuple[Shape, str]:
    wt, dy = inputs
    g = attrs["groups"]
    h, wd = attrs["in_hw"]
    x_shape = (dy.shape[0], wt.shape[1] * g, h, wd)
    out = _conv_geometry("conv2d_input_grad", x_shape, wt.shape, attrs["stride"],
                         attrs["padding"], g)
    if dy.shape != (x_shape[0], wt.shape[0], *out):
        raise ShapeError("conv2d_input_grad", f"dy {list(dy.shape)} does not match the "
                         f"output [{x_shape[0]}, {wt.shape[0]}, {out[0]}, {out[1]}]")
    return x_shape, "f32"


def _infer_conv2d_weight_grad(inputs: Sequence[Node], attrs: dict[str, Any]
                              ) -> tuple[Shape, str]:
    x, dy = inputs
    g = attrs["groups"]
    kh, kw = attrs["kernel"]
    w_shape = (dy.shape[1], x.shape[1] // g, kh, kw)
    out = _conv_geometry("conv2d_weight_grad", x.shape, w_shape, attrs["stride"],
                         attrs["padding"], g)
    if dy.shape != (x.shape[0], w_shape[0], *out):
        raise ShapeError("conv2d_weight_grad", f"dy {list(dy.shape)} does not match the "
                         f"output [{x.shape[0]}, {w_shape[0]}, {out[0]}, {out[1]}]")
    return w_shape, "f32"


def _pool_geometry(op: str, x: Shape, attrs: dict[str, Any]) -> tuple[int, int]:
    kernel, stride, pad = attrs["kernel"], attrs["stride"], attrs["padding"]
    _check_window(op, kernel, stride, pad)
    return (_out_size(op, "height", x[2], kernel[0], stride[0], pad[0]),
            _out_size(op, "width", x[3], kernel[1], stride[1], pad[1]))


def _infer_max_pool2d(inputs: Sequence[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    (x,) = inputs
    require_dtype("max_pool2d", x, "f32")
    _require_rank4("max_pool2d", x, "input", "[B, C, H, W]")
    return (*x.shape[:2], *_pool_geometry("max_pool2d", x.shape, attrs)), "f32"


def _infer_max_pool2d_grad(inputs: Sequence[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    x, dy = inputs
    out = (*x.shape[:2], *_pool_geometry("max_pool2d_grad", x.shape, attrs))
    if dy.shape != out:
        raise ShapeError("max_pool2d_grad", f"dy {list(dy.shape)} does not match the pooled "
                         f"shape {list(out)} of x {list(x.shape)}")
    return x.shape, "f32"


# ---- reference semantics (NumPy, any float dtype) ---------------------------------------

def _windows(xp: Any, i: int, j: int, out_hw: Pair, stride: Pair) -> Any:
    """The [.., Ho, Wo] view of padded `xp` read by kernel tap (i, j)."""
    (ho, wo), (sh, sw) = out_hw, stride
    return xp[..., i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]


def _pad(x: Any, pad: Pair, value: float = 0.0) -> Any:
    ph, pw = pad
    return _np().pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def _grouped(t: Any, groups: int) -> Any:
    """[B, C, H, W] -> [B, G, C/G, H, W]."""
    return t.reshape(t.shape[0], groups, t.shape[1] // groups, *t.shape[2:])


def _ref_conv2d(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    x, wt = args
    at, g = node.attrs, node.attrs["groups"]
    xg = _grouped(_pad(x, at["padding"]), g)
    wg = wt.reshape(g, wt.shape[0] // g, *wt.shape[1:])        # [G, Cout/G, Cin/G, kH, kW]
    out = np.zeros((x.shape[0], g, wg.shape[1], *node.shape[2:]), np.result_type(x, wt))
    for i in range(wt.shape[2]):
        for j in range(wt.shape[3]):
            patch = _windows(xg, i, j, node.shape[2:], at["stride"])
            out += np.einsum("bgchw,goc->bgohw", patch, wg[..., i, j])
    return out.reshape(node.shape)


def _ref_conv2d_input_grad(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    wt, dy = args
    at, g = node.attrs, node.attrs["groups"]
    (ph, pw), (h, wd) = at["padding"], at["in_hw"]
    wg = wt.reshape(g, wt.shape[0] // g, *wt.shape[1:])
    dyg = _grouped(dy, g)
    b, cin = node.shape[:2]
    dxp = np.zeros((b, g, cin // g, h + 2 * ph, wd + 2 * pw), np.result_type(wt, dy))
    for i in range(wt.shape[2]):
        for j in range(wt.shape[3]):
            _windows(dxp, i, j, dy.shape[2:], at["stride"])[...] += np.einsum(
                "bgohw,goc->bgchw", dyg, wg[..., i, j])
    return dxp[..., ph:ph + h, pw:pw + wd].reshape(node.shape)


def _ref_conv2d_weight_grad(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    x, dy = args
    at, g = node.attrs, node.attrs["groups"]
    xg = _grouped(_pad(x, at["padding"]), g)
    dyg = _grouped(dy, g)
    cout, cig, kh, kw = node.shape
    dw = np.zeros((g, cout // g, cig, kh, kw), np.result_type(x, dy))
    for i in range(kh):
        for j in range(kw):
            patch = _windows(xg, i, j, dy.shape[2:], at["stride"])
            dw[..., i, j] = np.einsum("bgchw,bgohw->goc", patch, dyg)
    return dw.reshape(node.shape)


def _pool_scan(x: Any, attrs: dict[str, Any], out_hw: Pair) -> tuple[Any, Any]:
    """(max, winning tap index i*kW + j or -1) of every window, scanning taps row-major."""
    np = _np()
    xp = _pad(x, attrs["padding"], -np.inf)
    kh, kw = attrs["kernel"]
    best = np.full((*x.shape[:2], *out_hw), POOL_INIT, dtype=x.dtype)
    arg = np.full(best.shape, -1, dtype=np.int64)
    for i in range(kh):
        for j in range(kw):
            v = _windows(xp, i, j, out_hw, attrs["stride"])
            wins = v > best
            best = np.where(wins, v, best)
            arg = np.where(wins, i * kw + j, arg)
    return best, arg


def _ref_max_pool2d(args: Sequence[Any], node: Node) -> Any:
    return _pool_scan(args[0], node.attrs, node.shape[2:])[0]


def _ref_max_pool2d_grad(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    x, dy = args
    at = node.attrs
    _, arg = _pool_scan(x, at, dy.shape[2:])
    (ph, pw), (kh, kw) = at["padding"], at["kernel"]
    dxp = np.zeros(_pad(x, at["padding"]).shape, dtype=np.result_type(x, dy))
    for i in range(kh):
        for j in range(kw):
            _windows(dxp, i, j, dy.shape[2:], at["stride"])[...] += np.where(
                arg == i * kw + j, dy, 0)
    return dxp[..., ph:ph + x.shape[2], pw:pw + x.shape[3]]


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


def _in_range(v: str, size: int) -> str:
    return f"({v} >= 0i && {v} < {size}i)"


def _mask(*conds: str) -> str:
    live = [c for c in conds if c != "true"]
    return " && ".join(live) if live else "true"


def _masked(value: str, mask: str) -> str:
    return value if mask == "true" else f"select(0.0f, {value}, {mask})"


def _emit_conv2d_direct(ctx: EmitContext) -> Kernel:
    x, wt = ctx.inputs
    b, cout, ho, wo = ctx.node.shape
    _, cin, h, wd = x.shape
    _, cig, kh, kw = wt.shape
    (sh, sw), (ph, pw) = ctx.node.attrs["stride"], ctx.node.attrs["padding"]
    cog = cout // ctx.node.attrs["groups"]
    head = f"""{_split("i", ["bi", "co", "oh", "ow"], [b, cout, ho, wo])}
  let cbase = (bi * {w.u(cin)} + (co / {w.u(cog)}) * {w.u(cig)}) * {w.u(h * wd)};"""
    if kh * kw <= MAX_UNROLL_TAPS:
        # Taps unrolled: per-tap offsets and padding masks hoisted out of the channel loop
        # (padding 0 needs no masks: every tap of a valid window is inside the image).
        lines = [head, f"  let h0 = i32(oh * {w.u(sh)}) - {ph}i;",
                 f"  let w0 = i32(ow * {w.u(sw)}) - {pw}i;"]
        for ki in range(kh):
            lines.append(f"  let ro{ki} = u32(clamp(h0 + {ki}i, 0i, {h - 1}i)) * {w.u(wd)};")
            if ph:
                lines.append(f"  let vh{ki} = {_in_range(f'h0 + {ki}i', h)};")
        for kj in range(kw):
            lines.append(f"  let cc{kj} = u32(clamp(w0 + {kj}i, 0i, {wd - 1}i));")
            if pw:
                lines.append(f"  let vw{kj} = {_in_range(f'w0 + {kj}i', wd)};")
        lines.append("  var acc = 0.0f;")
        lines.append(f"  for (var c = 0u; c < {w.u(cig)}; c = c + 1u) {{")
        lines.append(f"    let xc = cbase + c * {w.u(h * wd)};")
        lines.append(f"    let wc = (co * {w.u(cig)} + c) * {w.u(kh * kw)};")
        for ki in range(kh):
            for kj in range(kw):
                mask = _mask(f"vh{ki}" if ph else "true", f"vw{kj}" if pw else "true")
                xv = _masked(f"in0[xc + ro{ki} + cc{kj}]", mask)
                lines.append(f"    acc = fma({xv}, in1[wc + {w.u(ki * kw + kj)}], acc);")
        lines += ["  }", "  out[i] = acc;"]
        return w.thread_kernel(ctx, "\n".join(lines))
    body = f"""{head}
  var acc = 0.0f;
  for (var c = 0u; c < {w.u(cig)}; c = c + 1u) {{
    let xc = cbase + c * {w.u(h * wd)};
    let wc = (co * {w.u(cig)} + c) * {w.u(kh * kw)};
    for (var ki = 0u; ki < {w.u(kh)}; ki = ki + 1u) {{
      {_tap("hi", "oh", "ki", sh, ph, h)}
      for (var kj = 0u; kj < {w.u(kw)}; kj = kj + 1u) {{
      {_tap("wi", "ow", "kj", sw, pw, wd)}
        acc = fma(in0[xc + u32(hi) * {w.u(wd)} + u32(wi)], in1[wc + ki * {w.u(kw)} + kj], acc);
      }}
    }}
  }}
  out[i] = acc;"""
    return w.thread_kernel(ctx, body)


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


def _emit_conv2d_input_grad_direct(ctx: EmitContext) -> Kernel:
    wt, dy = ctx.inputs
    b, cin, h, wd = ctx.node.shape
    cout, cig, kh, kw = wt.shape
    _, _, ho, wo = dy.shape
    (sh, sw), (ph, pw) = ctx.node.attrs["stride"], ctx.node.attrs["padding"]
    cog = cout // ctx.node.attrs["groups"]
    head = f"""{_split("i", ["bi", "ci", "ih", "iw"], [b, cin, h, wd])}
  let co0 = (ci / {w.u(cig)}) * {w.u(cog)};
  let cl = ci % {w.u(cig)};"""
    if kh * kw <= MAX_UNROLL_TAPS:
        # Taps unrolled: the output position each tap reads, and whether it exists, hoisted
        # out of the output-channel loop.
        lines = [head]
        for axis, pos, k_len, st, pad, size in (("h", "ih", kh, sh, ph, ho),
                                                 ("w", "iw", kw, sw, pw, wo)):
            for k in range(k_len):
                n = f"n{axis}{k}"
                lines.append(f"  let {n} = i32({pos}) + {pad - k}i;")
                conds = [f"{n} >= 0i"]
                if st > 1:
                    conds.append(f"{n} % {st}i == 0i")
                conds.append(f"{n} < {size * st}i")
                lines.append(f"  let v{axis}{k} = {' && '.join(conds)};")
                lines.append(f"  let o{axis}{k} = u32(clamp({n}, 0i, {(size - 1) * st}i)) / "
                             f"{w.u(st)};")
        lines.append("  var acc = 0.0f;")
        lines.append(f"  for (var o = 0u; o < {w.u(cog)}; o = o + 1u) {{")
        lines.append("    let co = co0 + o;")
        lines.append(f"    let wc = (co * {w.u(cig)} + cl) * {w.u(kh * kw)};")
        lines.append(f"    let dc = (bi * {w.u(cout)} + co) * {w.u(ho * wo)};")
        for ki in range(kh):
            for kj in range(kw):
                dv = _masked(f"in1[dc + oh{ki} * {w.u(wo)} + ow{kj}]", f"vh{ki} && vw{kj}")
                lines.append(f"    acc = fma(in0[wc + {w.u(ki * kw + kj)}], {dv}, acc);")
        lines += ["  }", "  out[i] = acc;"]
        return w.thread_kernel(ctx, "\n".join(lines))
    body = f"""{head}
  var acc = 0.0f;
  for (var o = 0u; o < {w.u(cog)}; o = o + 1u) {{
    let co = co0 + o;
    let wc = (co * {w.u(cig)} + cl) * {w.u(kh * kw)};
    let dc = (bi * {w.u(cout)} + co) * {w.u(ho * wo)};
    for (var ki = 0u; ki < {w.u(kh)}; ki = ki + 1u) {{
        {_source("oh", "ih", "ki", sh, ph, ho)}
      for (var kj = 0u; kj < {w.u(kw)}; kj = kj + 1u) {{
        {_source("ow", "iw", "kj", sw, pw, wo)}
        acc = fma(in0[wc + ki * {w.u(kw)} + kj], in1[dc + oh * {w.u(wo)} + ow], acc);
      }}
    }}
  }}
  out[i] = acc;"""
    return w.thread_kernel(ctx, body)


def _emit_conv2d_weight_grad_direct(ctx: EmitContext) -> Kernel:
    x, dy = ctx.inputs
    cout, cig, kh, kw = ctx.node.shape
    b, cin, h, wd = x.shape
    _, _, ho, wo = dy.shape
    (sh, sw), (ph, pw) = ctx.node.attrs["stride"], ctx.node.attrs["padding"]
    cog = cout // ctx.node.attrs["groups"]
    length = b * ho * wo
    weights = ctx.node.size
    use_wg = weights < WEIGHT_GRAD_WG_MAX_WEIGHTS and length >= WEIGHT_GRAD_WG_MIN_LENGTH
    o = "g" if use_wg else "i"
    head = f"""{_split(o, ["co", "cl", "ki", "kj"], [cout, cig, kh, kw])}
  let xc = ((co / {w.u(cog)}) * {w.u(cig)} + cl) * {w.u(h * wd)};"""
    step = f"""    let ow = r % {w.u(wo)};
    let r1 = r / {w.u(wo)};
    let oh = r1 % {w.u(ho)};
    let bi = r1 / {w.u(ho)};
    let ih = i32(oh * {w.u(sh)} + ki) - {ph}i;
    let iw = i32(ow * {w.u(sw)} + kj) - {pw}i;
    if (ih >= 0i && ih < {h}i && iw >= 0i && iw < {wd}i) {{
      acc = fma(in0[bi * {w.u(cin * h * wd)} + xc + u32(ih) * {w.u(wd)} + u32(iw)],
                in1[(bi * {w.u(cout)} + co) * {w.u(ho * wo)} + oh * {w.u(wo)} + ow], acc);
    }}"""
    if use_wg:
        body = f"""{head}
  var acc = 0.0f;
  for (var r = lid; r < {w.u(length)}; r = r + {w.u(w.WG)}) {{
{step}
  }}
  scratch[lid] = acc;
  workgroupBarrier();
  for (var s = {w.u(w.WG // 2)}; s > 0u; s = s >> 1u) {{
    if (lid < s) {{ scratch[lid] = scratch[lid] + scratch[lid + s]; }}
    workgroupBarrier();
  }}
  if (lid == 0u) {{ out[g] = scratch[0]; }}"""
        return w.workgroup_kernel(ctx, body, weights,
                                  prelude=f"var<workgroup> scratch: array<f32, {w.WG}>;")
    body = f"""{head}
  var acc = 0.0f;
  for (var r = 0u; r < {w.u(length)}; r = r + 1u) {{
{step}
  }}
  out[i] = acc;"""
    return w.thread_kernel(ctx, body)


def _pool_scan_wgsl(at: dict[str, Any], x_shape: Shape, oh: str, ow: str, base: str,
                    track: bool) -> str:
    """WGSL: scan the window of output (oh, ow) over plane `base`; sets `best` (and `arg`,
    the winning tap i*kW + j, when `track`)."""
    (kh, kw), (sh, sw), (ph, pw) = at["kernel"], at["stride"], at["padding"]
    h, wd = x_shape[2], x_shape[3]
    arg_decl = "\n    var arg = -1i;" if track else ""
    arg_set = f" arg = i32(si * {w.u(kw)} + sj);" if track else ""
    return f"""    var best = {w.lit(POOL_INIT)};{arg_decl}
    for (var si = 0u; si < {w.u(kh)}; si = si + 1u) {{
      let ph_ = i32({oh} * {w.u(sh)} + si) - {ph}i;
      if (ph_ < 0i || ph_ >= {h}i) {{ continue; }}
      for (var sj = 0u; sj < {w.u(kw)}; sj = sj + 1u) {{
        let pw_ = i32({ow} * {w.u(sw)} + sj) - {pw}i;
        if (pw_ < 0i || pw_ >= {wd}i) {{ continue; }}
        let v = in0[{base} + u32(ph_) * {w.u(wd)} + u32(pw_)];
        if (v > best) {{ best = v;{arg_set} }}
      }}
    }}"""


def _emit_max_pool2d(ctx: EmitContext) -> Kernel:
    x = ctx.inputs[0]
    ho, wo = ctx.node.shape[2:]
    body = f"""  let ow = i % {w.u(wo)};
  let oh = (i / {w.u(wo)}) % {w.u(ho)};
  let base = (i / {w.u(ho * wo)}) * {w.u(x.shape[2] * x.shape[3])};
  {{
{_pool_scan_wgsl(ctx.node.attrs, x.shape, "oh", "ow", "base", False)}
    out[i] = best;
  }}"""
    return w.thread_kernel(ctx, body)


def _emit_max_pool2d_grad_direct(ctx: EmitContext) -> Kernel:
    x, dy = ctx.inputs
    at = ctx.node.attrs
    _, _, h, wd = x.shape
    _, _, ho, wo = dy.shape
    (kh, kw), (sh, sw), (ph, pw) = at["kernel"], at["stride"], at["padding"]
    body = f"""  let iw = i % {w.u(wd)};
  let ih = (i / {w.u(wd)}) % {w.u(h)};
  let plane = i / {w.u(h * wd)};
  let base = plane * {w.u(h * wd)};
  var acc = 0.0f;
  for (var ki = 0u; ki < {w.u(kh)}; ki = ki + 1u) {{
        {_source("oh", "ih", "ki", sh, ph, ho)}
    for (var kj = 0u; kj < {w.u(kw)}; kj = kj + 1u) {{
        {_source("ow", "iw", "kj", sw, pw, wo)}
{_pool_scan_wgsl(at, x.shape, "oh", "ow", "base", True)}
      if (arg == i32(ki * {w.u(kw)} + kj)) {{
        acc = acc + in1[plane * {w.u(ho * wo)} + oh * {w.u(wo)} + ow];
      }}
    }}
  }}
  out[i] = acc;"""
    return w.thread_kernel(ctx, body)


# ---- register-tiled kernels (software targets) ------------------------------------------
#
# On CPU rasterisers (lavapipe, SwiftShader) arithmetic runs 8 lanes wide but every storage
# buffer load is a per-lane scalar loop, so a kernel costs its loads per multiply-add. The
# direct kernels above do 2 loads per multiply-add; these give each thread a block of outputs
# and reuse every loaded value from registers. conv2d and its input gradient share one
# emitter (a thread: `chans` channels x `rows` x `cols` adjacent outputs; neighbouring taps
# share the source values along a row); the weight gradient gives each workgroup a block of
# output channels x taps for one input channel, its threads splitting the batch x pixel sum
# (one barrier, before the final reduction). Taps are unrolled, so kernels with more than
# TILED_MAX_TAPS taps keep the direct kernels. Measured on a 2-core machine (mnist_cnn
# conv2, B=64, 2026-12): lavapipe 0.07 -> 1.2-2 G multiply-adds/s for all three kernels
# (454 -> 30 ms forward, 600 -> 48 ms weight gradient); SwiftShader (Subzero) 0.01-0.09 ->
# 0.5-0.7, at ~0.6 s instead of ~30 ms to compile a 3x3 forward. Hardware targets keep the
# direct kernels (not measured there).

TILED_MAX_TAPS = 121
TILE_MAX_FMAS = 2_048    # multiply-adds per loop iteration: bounds code size and compile time
TILE_MAX_OUTPUTS = 128   # accumulators per thread
TILE_MAX_RUN = 8         # adjacent outputs along a row (channels) per thread
TILE_MAX_ROWS = 4
WGRAD_THREADS = 32
WGRAD_MAX_ACCS = 128     # WGRAD_THREADS x WGRAD_MAX_ACCS f32 partial sums: 16 KiB of shared
                         # memory; at least TILED_MAX_TAPS (one channel's taps)
WGRAD_MIN_GROUPS = 8     # fewer weight blocks per channel block when that leaves cores idle


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _run(size: int, most: int, step: int = 1) -> int:
    """Positions per thread along an axis of `size`: a multiple of `step`, at most `most` (but
    at least `step`), splitting the axis into as few runs as that allows, evenly."""
    runs = _cdiv(size, max(step, most - most % step))
    return step * _cdiv(_cdiv(size, runs), step)


def _name(offset: int) -> str:
    return str(offset) if offset >= 0 else f"m{-offset}"


@dataclass(frozen=True)
class _Axis:
    """One spatial axis of a tiled kernel: a thread covers outputs p0 + t for t < `run`; tap k
    of output t reads source position `base` + reads[(t, k)] (a pair not in `reads`
    contributes nothing). `base` is a WGSL i32 expression in p0; `size` is the source extent
    (positions outside it are zero padding)."""

    run: int
    reads: dict[tuple[int, int], int]
    base: str
    size: int

    @property
    def offsets(self) -> list[int]:
        return sorted(set(self.reads.values()))

    def hoist(self, tag: str, scale: int) -> list[str]:
        """WGSL lines: for each offset e, `{tag}{e}` (the clamped source position times
        `scale`, u32) and `v{tag}{e}` (whether it lies inside the source)."""
        lines = [f"  let {tag}0_ = {self.base};"]
        for e in self.offsets:
            pos, n = f"{tag}0_ + {e}i", _name(e)
            scaled = "" if scale == 1 else f" * {w.u(scale)}"
            lines.append(f"  let {tag}{n} = u32(clamp({pos}, 0i, {self.size - 1}i)){scaled};")
            lines.append(f"  let v{tag}{n} = {_in_range(pos, self.size)};")
        return lines


def _gather_axis(run: int, taps: int, stride: int, pad: int, size: int, p0: str) -> _Axis:
    """conv2d: output p reads source p*stride + k - pad."""
    reads = {(t, k): t * stride + k for t in range(run) for k in range(taps)}
    return _Axis(run, reads, f"i32({p0} * {w.u(stride)}) - {pad}i", size)


def _scatter_axis(run: int, taps: int, stride: int, pad: int, size: int, p0: str) -> _Axis:
    """The input gradient: position p gathers the outputs q with q*stride + k - pad = p. With
    p0 and `run` multiples of the stride, which taps exist is the same for every thread."""
    reads = {(t, k): (t + pad - k) // stride for t in range(run) for k in range(taps)
             if (t + pad - k) % stride == 0}
    return _Axis(run, reads, f"i32({p0} / {w.u(stride)})", size)


@dataclass(frozen=True)
class _Correlation:
    """out[b, q, y, x] = sum over l < `loop` and taps (ki, kj) of
    weight[g*group_stride + q'*q_stride + l*l_stride + ki*kW + kj] * src[b, g*loop + l, ...]
    where q = g*per_group + q' (group g): conv2d (q an output channel, l an input channel)
    and its input gradient (q an input channel, l an output channel). `src`, `weight`: the
    bindings; `src_shape` [B, C, H, W]."""

    src: str
    weight: str
    src_shape: Shape
    per_group: int
    loop: int
    q_stride: int
    l_stride: int
    group_stride: int
    kernel: Pair


def _tile_sizes(out_hw: Pair, per_group: int, taps: int, steps: Pair) -> tuple[int, int, int]:
    """(channels, rows, cols) of outputs per thread; rows and cols multiples of `steps`."""
    budget = max(1, min(TILE_MAX_OUTPUTS, TILE_MAX_FMAS // taps))
    cols = _run(out_hw[1], min(TILE_MAX_RUN, budget), steps[1])
    chans = _run(per_group, max(1, min(TILE_MAX_RUN, budget // cols)))
    rows = _run(out_hw[0], max(1, min(TILE_MAX_ROWS, budget // (cols * chans))), steps[0])
    return chans, rows, cols


def _tap_block(c: _Correlation, rows: _Axis, cols: _Axis, chans: int, ki: int) -> list[str]:
    """WGSL for kernel row `ki` inside the loop over l: load the source values and weights it
    uses, then every multiply-add of the tile."""
    kw = c.kernel[1]
    live = [r for r in range(rows.run) if (r, ki) in rows.reads]
    if not live:
        return []
    lines = ["    {"]
    for er in sorted({rows.reads[(r, ki)] for r in live}):
        for ec in cols.offsets:
            nr, nc = _name(er), _name(ec)
            load = f"{c.src}[sl + rr{nr} + cc{nc}]"
            lines.append(f"      let s{nr}_{nc} = {_masked(load, f'vrr{nr} && vcc{nc}')};")
    for j in range(chans):
        for kj in range(kw):
            lines.append(f"      let w{j}_{kj} = {c.weight}[wq{j} + wl + {w.u(ki * kw + kj)}];")
    for j in range(chans):
        for r in live:
            er = _name(rows.reads[(r, ki)])
            for t in range(cols.run):
                for kj in range(kw):
                    if (t, kj) in cols.reads:
                        s = f"s{er}_{_name(cols.reads[(t, kj)])}"
                        lines.append(f"      a{j}_{r}_{t} = fma({s}, w{j}_{kj}, a{j}_{r}_{t});")
    lines.append("    }")
    return lines


def _emit_correlation(ctx: EmitContext, c: _Correlation, rows: _Axis, cols: _Axis,
                      chans: int) -> Kernel:
    """The register-tiled kernel of a `_Correlation` (rows/cols: built for p0 = y0 / x0)."""
    b, qn, ho, wo = ctx.node.shape
    _, cs, hs, ws = c.src_shape
    groups = qn // c.per_group
    blocks = (_cdiv(c.per_group, chans), _cdiv(ho, rows.run), _cdiv(wo, cols.run))
    lines = [_split("i", ["bi", "qb", "yb", "xb"], [b, groups * blocks[0], *blocks[1:]]),
             f"  let grp = qb / {w.u(blocks[0])};",
             f"  let q0 = (qb % {w.u(blocks[0])}) * {w.u(chans)};",
             f"  let y0 = yb * {w.u(rows.run)};",
             f"  let x0 = xb * {w.u(cols.run)};",
             *rows.hoist("rr", ws), *cols.hoist("cc", 1)]
    for j in range(chans):
        q = f"q0 + {w.u(j)}" if c.per_group % chans == 0 else \
            f"min(q0 + {w.u(j)}, {w.u(c.per_group - 1)})"
        lines.append(f"  let wq{j} = grp * {w.u(c.group_stride)} + ({q}) * {w.u(c.q_stride)};")
    lines.append(f"  let sb = (bi * {w.u(cs)} + grp * {w.u(c.loop)}) * {w.u(hs * ws)};")
    lines += [f"  var a{j}_{r}_{t} = 0.0f;" for j in range(chans) for r in range(rows.run)
              for t in range(cols.run)]
    lines += [f"  for (var l = 0u; l < {w.u(c.loop)}; l = l + 1u) {{",
              f"    let sl = sb + l * {w.u(hs * ws)};",
              f"    let wl = l * {w.u(c.l_stride)};"]
    for ki in range(c.kernel[0]):
        lines += _tap_block(c, rows, cols, chans, ki)
    lines += ["  }", *_tile_store(c, ctx.node.shape, chans, rows.run, cols.run)]
    threads = b * groups * blocks[0] * blocks[1] * blocks[2]
    return w.thread_kernel(ctx, "\n".join(lines), threads)


def _tile_store(c: _Correlation, out: Shape, chans: int, rows: int, cols: int) -> list[str]:
    """WGSL: store the tile's accumulators, skipping those past the edges."""
    _, qn, ho, wo = out
    first = f"(bi * {w.u(qn)} + grp * {w.u(c.per_group)} + q0) * {w.u(ho)} + y0"
    lines = [f"  let ob = ({first}) * {w.u(wo)} + x0;"]
    for j in range(chans):
        for r in range(rows):
            for t in range(cols):
                conds = [f"q0 + {w.u(j)} < {w.u(c.per_group)}"] if c.per_group % chans else []
                conds += [f"y0 + {w.u(r)} < {w.u(ho)}"] if ho % rows else []
                conds += [f"x0 + {w.u(t)} < {w.u(wo)}"] if wo % cols else []
                store = f"out[ob + {w.u((j * ho + r) * wo + t)}] = a{j}_{r}_{t};"
                lines.append(f"  if ({' && '.join(conds)}) {{ {store} }}" if conds
                             else f"  {store}")
    return lines


def _tiled(ctx: EmitContext, taps: int) -> bool:
    """Whether to emit the register-tiled kernel: on software targets, for unrollable taps."""
    return ctx.target.software and taps <= TILED_MAX_TAPS


def _emit_conv2d_tiled(ctx: EmitContext) -> Kernel:
    x, wt = ctx.inputs
    cout, cig, kh, kw = wt.shape
    (sh, sw), (ph, pw) = ctx.node.attrs["stride"], ctx.node.attrs["padding"]
    cog = cout // ctx.node.attrs["groups"]
    taps = kh * kw
    chans, rows, cols = _tile_sizes(ctx.node.shape[2:], cog, taps, (1, 1))
    c = _Correlation("in0", "in1", x.shape, cog, cig, cig * taps, taps, cog * cig * taps,
                     (kh, kw))
    return _emit_correlation(ctx, c, _gather_axis(rows, kh, sh, ph, x.shape[2], "y0"),
                             _gather_axis(cols, kw, sw, pw, x.shape[3], "x0"), chans)


def _emit_conv2d_input_grad_tiled(ctx: EmitContext) -> Kernel:
    wt, dy = ctx.inputs
    cout, cig, kh, kw = wt.shape
    (sh, sw), (ph, pw) = ctx.node.attrs["stride"], ctx.node.attrs["padding"]
    cog = cout // ctx.node.attrs["groups"]
    taps = kh * kw
    chans, rows, cols = _tile_sizes(ctx.node.shape[2:], cig, taps, (sh, sw))
    c = _Correlation("in1", "in0", dy.shape, cig, cog, taps, cig * taps, cog * cig * taps,
                     (kh, kw))
    return _emit_correlation(ctx, c, _scatter_axis(rows, kh, sh, ph, dy.shape[2], "y0"),
                             _scatter_axis(cols, kw, sw, pw, dy.shape[3], "x0"), chans)


def _weight_grad_tile(ctx: EmitContext) -> tuple[int, int]:
    """(output channels of one workgroup's block of weights, which spans all taps of one
    input channel; the output run a thread takes per step of the sum)."""
    cout, cig, kh, kw = ctx.node.shape
    groups = ctx.node.attrs["groups"]
    cog = cout // groups
    chans = _run(cog, max(1, min(TILE_MAX_RUN, WGRAD_MAX_ACCS // (kh * kw))))
    while chans > 1 and groups * _cdiv(cog, chans) * cig < WGRAD_MIN_GROUPS:
        chans = _run(cog, chans - 1)
    return chans, _run(ctx.inputs[1].shape[3], TILE_MAX_RUN)


def _weight_grad_step(ctx: EmitContext, chans: int, run: int) -> list[str]:
    """WGSL body of one step of the sum: output row `oh` of image `bi`, columns x0 + t for
    t < run. Loads the x rows under every tap and the dy run of every channel, then
    accumulates a{j}_{ki}_{kj} += x * dy."""
    x, dy = ctx.inputs
    _, _, kh, kw = ctx.node.shape
    _, cin, h, wd = x.shape
    _, cout, ho, wo = dy.shape
    (sh, sw), (ph, pw) = ctx.node.attrs["stride"], ctx.node.attrs["padding"]
    cols = sorted({t * sw + kj for t in range(run) for kj in range(kw)})
    lines = [f"    let x0 = xr * {w.u(run)};",
             f"    let r0 = i32(oh * {w.u(sh)}) - {ph}i;",
             f"    let c0 = i32(x0 * {w.u(sw)}) - {pw}i;",
             f"    let xs = bi * {w.u(cin * h * wd)} + xc;",
             f"    let ds = bi * {w.u(cout * ho * wo)} + oh * {w.u(wo)} + x0;"]
    for ki in range(kh):
        lines += [f"    let rr{ki} = u32(clamp(r0 + {ki}i, 0i, {h - 1}i)) * {w.u(wd)};",
                  f"    let vr{ki} = {_in_range(f'r0 + {ki}i', h)};"]
    for e in cols:
        lines += [f"    let cc{e} = u32(clamp(c0 + {e}i, 0i, {wd - 1}i));",
                  f"    let vc{e} = {_in_range(f'c0 + {e}i', wd)};"]
    for ki in range(kh):
        for e in cols:
            load = _masked(f"in0[xs + rr{ki} + cc{e}]", f"vr{ki} && vc{e}")
            lines.append(f"    let x{ki}_{e} = {load};")
    for j in range(chans):
        for t in range(run):
            load = f"in1[dq{j} + ds + {w.u(t)}]"
            if wo % run:
                load = _masked(load, f"x0 + {w.u(t)} < {w.u(wo)}")
            lines.append(f"    let d{j}_{t} = {load};")
    for j in range(chans):
        for ki in range(kh):
            for kj in range(kw):
                acc = f"a{j}_{ki}_{kj}"
                lines += [f"    {acc} = fma(x{ki}_{t * sw + kj}, d{j}_{t}, {acc});"
                          for t in range(run)]
    return lines


def _weight_grad_reduce(ctx: EmitContext, chans: int) -> list[str]:
    """WGSL: the workgroup's partial sums through shared memory (one barrier), then one thread
    per weight of the block sums its column and stores it."""
    cout, cig, kh, kw = ctx.node.shape
    cog = cout // ctx.node.attrs["groups"]
    n, taps = WGRAD_THREADS, kh * kw
    lines = [f"  scratch[{w.u((j * taps + k) * n)} + lid] = a{j}_{k // kw}_{k % kw};"
             for j in range(chans) for k in range(taps)]
    return [*lines, "  workgroupBarrier();",
            f"  for (var a = lid; a < {w.u(chans * taps)}; a = a + {w.u(n)}) {{",
            "    var acc = 0.0f;",
            f"    for (var k = 0u; k < {w.u(n)}; k = k + 1u) {{",
            f"      acc = acc + scratch[a * {w.u(n)} + k];",
            "    }",
            f"    let q = q0 + a / {w.u(taps)};",
            f"    if (q < {w.u(cog)}) {{",
            (f"      out[((grp * {w.u(cog)} + q) * {w.u(cig)} + cl) * {w.u(taps)} + "
             f"a % {w.u(taps)}] = acc;"),
            "    }",
            "  }"]


def _emit_conv2d_weight_grad_tiled(ctx: EmitContext) -> Kernel:
    """One workgroup per block of `chans` output channels x all taps of one input channel;
    its threads take turns over the (image, output row, run of columns) steps of the sum."""
    x, dy = ctx.inputs
    cout, cig, kh, kw = ctx.node.shape
    b, _, h, wd = x.shape
    _, _, ho, wo = dy.shape
    groups = ctx.node.attrs["groups"]
    cog = cout // groups
    chans, run = _weight_grad_tile(ctx)
    blocks = _cdiv(cog, chans)
    lines = [_split("g", ["qb", "cl"], [groups * blocks, cig]),
             f"  let grp = qb / {w.u(blocks)};",
             f"  let q0 = (qb % {w.u(blocks)}) * {w.u(chans)};",
             f"  let xc = (grp * {w.u(cig)} + cl) * {w.u(h * wd)};"]
    for j in range(chans):
        q = f"q0 + {w.u(j)}" if cog % chans == 0 else f"min(q0 + {w.u(j)}, {w.u(cog - 1)})"
        lines.append(f"  let dq{j} = (grp * {w.u(cog)} + {q}) * {w.u(ho * wo)};")
    lines += [f"  var a{j}_{ki}_{kj} = 0.0f;"
              for j in range(chans) for ki in range(kh) for kj in range(kw)]
    steps = (b, ho, _cdiv(wo, run))
    lines += [f"  for (var s = lid; s < {w.u(prod(steps))}; s = s + {w.u(WGRAD_THREADS)}) {{",
              _split("s", ["bi", "oh", "xr"], steps).replace("\n", "\n  "),
              *_weight_grad_step(ctx, chans, run), "  }", *_weight_grad_reduce(ctx, chans)]
    prelude = f"var<workgroup> scratch: array<f32, {WGRAD_THREADS * chans * kh * kw}>;"
    return w.workgroup_kernel(ctx, "\n".join(lines), groups * blocks * cig, prelude=prelude,
                              size=WGRAD_THREADS)


def _emit_conv2d(ctx: EmitContext) -> Kernel:
    wt = ctx.inputs[1].shape
    return _emit_conv2d_tiled(ctx) if _tiled(ctx, wt[2] * wt[3]) else _emit_conv2d_direct(ctx)


def _emit_conv2d_input_grad(ctx: EmitContext) -> Kernel:
    wt = ctx.inputs[0].shape
    if _tiled(ctx, wt[2] * wt[3]):
        return _emit_conv2d_input_grad_tiled(ctx)
    return _emit_conv2d_input_grad_direct(ctx)


def _emit_conv2d_weight_grad(ctx: EmitContext) -> Kernel:
    if _tiled(ctx, ctx.node.shape[2] * ctx.node.shape[3]):
        return _emit_conv2d_weight_grad_tiled(ctx)
    return _emit_conv2d_weight_grad_direct(ctx)


def _emit_max_pool2d_grad_cells(ctx: EmitContext) -> Kernel:
    """Non-overlapping windows (stride >= kernel): one thread per stride x stride cell of the
    padded input scans the cell's window once and writes every input element of the cell
    (dy at the first maximum, else 0), where the direct kernel rescans the window per
    element."""
    x, dy = ctx.inputs
    at = ctx.node.attrs
    b, c, h, wd = x.shape
    _, _, ho, wo = dy.shape
    (kh, kw), (sh, sw), (ph, pw) = at["kernel"], at["stride"], at["padding"]
    cells = (_cdiv(h + ph, sh), _cdiv(wd + pw, sw))
    lines = [_split("i", ["plane", "oh", "ow"], [b * c, *cells]),
             f"  let h0 = i32(oh * {w.u(sh)}) - {ph}i;",
             f"  let w0 = i32(ow * {w.u(sw)}) - {pw}i;",
             f"  let base = plane * {w.u(h * wd)};",
             f"  var best = {w.lit(POOL_INIT)};",
             "  var arg = -1i;"]
    for i in range(kh):
        for j in range(kw):
            hi, wi = f"h0 + {i}i", f"w0 + {j}i"
            pos = (f"u32(clamp({hi}, 0i, {h - 1}i)) * {w.u(wd)} + "
                   f"u32(clamp({wi}, 0i, {wd - 1}i))")
            inside = f"{_in_range(hi, h)} && {_in_range(wi, wd)}"
            lines += [f"  let v{i}_{j} = in0[base + {pos}];",
                      f"  let b{i}_{j} = {inside} && v{i}_{j} > best;",
                      f"  best = select(best, v{i}_{j}, b{i}_{j});",
                      f"  arg = select(arg, {i * kw + j}i, b{i}_{j});"]
    at_dy = f"plane * {w.u(ho * wo)} + min(oh, {w.u(ho - 1)}) * {w.u(wo)} + min(ow, {w.u(wo - 1)})"
    lines += [f"  let win = oh < {w.u(ho)} && ow < {w.u(wo)};",
              f"  let g = select(0.0f, in1[{at_dy}], win);"]
    for i in range(sh):
        for j in range(sw):
            hi, wi = f"h0 + {i}i", f"w0 + {j}i"
            value = f"select(0.0f, g, arg == {i * kw + j}i)" if i < kh and j < kw else "0.0f"
            lines.append(f"  if ({_in_range(hi, h)} && {_in_range(wi, wd)}) {{ "
                         f"out[base + u32({hi}) * {w.u(wd)} + u32({wi})] = {value}; }}")
    return w.thread_kernel(ctx, "\n".join(lines), b * c * cells[0] * cells[1])


def _emit_max_pool2d_grad(ctx: EmitContext) -> Kernel:
    (kh, kw), (sh, sw) = ctx.node.attrs["kernel"], ctx.node.attrs["stride"]
    if ctx.target.software and sh >= kh and sw >= kw and sh * sw <= TILED_MAX_TAPS:
        return _emit_max_pool2d_grad_cells(ctx)
    return _emit_max_pool2d_grad_direct(ctx)


# ---- definitions -----------------------------------------------------------------------

def _vjp_conv2d(ins: Sequence[Tensor], out: Tensor, dy: Tensor, at: dict) -> list[Tensor]:
    x, wt = ins
    common = {"stride": at["stride"], "padding": at["padding"], "groups": at["groups"]}
    dx = record("conv2d_input_grad", [wt, dy], in_hw=tuple(x.shape[2:]), **common)
    dw = record("conv2d_weight_grad", [x, dy], kernel=tuple(wt.shape[2:]), **common)
    return [dx, dw]


def _vjp_max_pool2d(ins: Sequence[Tensor], out: Tensor, dy: Tensor, at: dict) -> list[Tensor]:
    return [record("max_pool2d_grad", [ins[0], dy], **at)]


def _torch_pair(name: str, v: Any, default: Any) -> list[str]:
    """`name=v` (one number where both are equal), or nothing at the default."""
    v = tuple(v)
    return [] if v == default else [f"{name}={v[0] if v[0] == v[1] else v}"]


def _torch_conv2d(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    at = n.attrs
    args = [a[0].text, a[1].text, *_torch_pair("stride", at["stride"], (1, 1)),
            *_torch_pair("padding", at["padding"], (0, 0))]
    if at["groups"] != 1:
        args.append(f"groups={at['groups']}")
    return tx.call("F.conv2d", *args)


def _torch_max_pool2d(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    """F.max_pool2d, or a helper where the padding exceeds half the kernel (torch refuses)."""
    kernel, stride, pad = (tuple(n.attrs[k]) for k in ("kernel", "stride", "padding"))
    one = (lambda v: str(v[0]) if v[0] == v[1] else str(v))
    if pad[0] * 2 > kernel[0] or pad[1] * 2 > kernel[1]:
        return tx.call(cx.helper("max_pool2d_padded"), a[0].text, one(kernel), one(stride),
                       str(pad))
    args = [a[0].text, one(kernel)]
    if stride != kernel:
        args.append(f"stride={one(stride)}")
    if pad != (0, 0):
        args.append(f"padding={one(pad)}")
    return tx.call("F.max_pool2d", *args)


define("conv2d", infer=_infer_conv2d, ref=_ref_conv2d, vjp=_vjp_conv2d, emit=_emit_conv2d,
       torch=_torch_conv2d,
       doc="NCHW convolution x[B,Cin,H,W] * w[Cout,Cin/G,kH,kW] -> [B,Cout,Ho,Wo] "
           "(register-tiled on software targets).")
define("conv2d_input_grad", infer=_infer_conv2d_input_grad, ref=_ref_conv2d_input_grad,
       vjp=GRAD_ERROR, emit=_emit_conv2d_input_grad,
       doc="d conv2d / d x from (w, dy): gathering, one thread per input element (a "
           "register tile of them on software targets).")
define("conv2d_weight_grad", infer=_infer_conv2d_weight_grad, ref=_ref_conv2d_weight_grad,
       vjp=GRAD_ERROR, emit=_emit_conv2d_weight_grad,
       doc="d conv2d / d w from (x, dy): a sum over batch and output pixels per weight "
           "(a workgroup per block of weights on software targets).")
define("max_pool2d", infer=_infer_max_pool2d, ref=_ref_max_pool2d, vjp=_vjp_max_pool2d,
       emit=_emit_max_pool2d, torch=_torch_max_pool2d,
       doc="Window max over [B,C,H,W]; padding never wins.")
define("max_pool2d_grad", infer=_infer_max_pool2d_grad, ref=_ref_max_pool2d_grad,
       vjp=GRAD_ERROR, emit=_emit_max_pool2d_grad,
       doc="dy routed to each window's first maximum (recomputed scan).")


@public
def conv2d(x: Tensor, w: Tensor, stride: IntOrPair = 1, padding: IntOrPair = 0,
           groups: int = 1) -> Tensor:
    """2-D convolution (no bias), NCHW: x [B, Cin, H, W], w [Cout, Cin/groups, kH, kW]
    -> [B, Cout, Ho, Wo]. `stride` and `padding` are ints or (h, w) pairs; zero padding."""
    return record("conv2d", [x, w], stride=_pair("conv2d", "stride", stride),
                  padding=_pair("conv2d", "padding", padding), groups=groups)


@public
def max_pool2d(x: Tensor, kernel_size: IntOrPair, stride: IntOrPair | None = None,
               padding: IntOrPair = 0) -> Tensor:
    """Max pooling over [B, C, H, W] windows (stride defaults to the kernel size); padded
    cells never win and ties go to the first cell in row-major window order."""
    kernel = _pair("max_pool2d", "kernel_size", kernel_size)
    st = kernel if stride is None else _pair("max_pool2d", "stride", stride)
    return record("max_pool2d", [x], kernel=kernel, stride=st,
                  padding=_pair("max_pool2d", "padding", padding))


@public
def nearest_upsample2d(x: Tensor, factor: int) -> Tensor:
    """Repeat every pixel of [B, C, H, W] `factor` times in both directions
    -> [B, C, H*factor, W*factor] (factor 1 returns x)."""
    from .broadcast import broadcast_to
    from .shape import reshape

    if not isinstance(x, Tensor) or x.ndim != 4:
        shape = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ShapeError("nearest_upsample2d", f"x must be a rank-4 [B, C, H, W] tensor, "
                         f"got {shape}")
    if not is_int(factor) or factor < 1:
        raise ShapeError("nearest_upsample2d", f"factor must be an int >= 1, got {factor!r}")
    if factor == 1:
        return x
    b, c, h, wd = x.shape
    grid = broadcast_to(reshape(x, (b, c, h, 1, wd, 1)), (b, c, h, factor, wd, factor))
    return reshape(grid, (b, c, h * factor, wd * factor))


__all__ = ["conv2d", "max_pool2d", "nearest_upsample2d"]
