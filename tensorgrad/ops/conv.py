"""2-D convolution (NCHW).

Primitives: `conv2d` with its backward ops `conv2d_input_grad` and `conv2d_weight_grad`.
Output sizes follow `floor((in + 2 pad - k) / stride) + 1`; padding is zeros. The direct
kernels here serve every target; software targets get the register-tiled ones of
:mod:`.conv_tiled`. Max pooling and upsampling are in :mod:`.pool`, the window helpers both
use in :mod:`.window`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Attrs, DType, Node, Shape
from ..tensor import Tensor
from .conv_tiled import (
    _emit_conv2d_input_grad_tiled,
    _emit_conv2d_tiled,
    _emit_conv2d_weight_grad_tiled,
    _tiled,
)
from .registry import GRAD_ERROR, define, public, record
from .rules import is_int, require_dtype
from .window import (
    IntOrPair,
    Pair,
    _check_window,
    _in_range,
    _mask,
    _masked,
    _np,
    _out_size,
    _pad,
    _pair,
    _require_rank4,
    _source,
    _split,
    _tap,
    _windows,
)

# The weight gradient uses one workgroup per weight element when there are few weights and
# a long reduction over batch and output pixels.
WEIGHT_GRAD_WG_MAX_WEIGHTS = 32_768
WEIGHT_GRAD_WG_MIN_LENGTH = 256
MAX_UNROLL_TAPS = 49  # kernels with at most this many taps get straight-line tap code


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

def _infer_conv2d(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    x, wt = inputs
    require_dtype("conv2d", x, "f32", what="input")
    require_dtype("conv2d", wt, "f32", what="weight")
    _require_rank4("conv2d", x, "input", "[B, Cin, H, W]")
    _require_rank4("conv2d", wt, "weight", "[Cout, Cin/groups, kH, kW]")
    ho, wo = _conv_geometry("conv2d", x.shape, wt.shape, attrs["stride"], attrs["padding"],
                            attrs["groups"])
    return (x.shape[0], wt.shape[0], ho, wo), "f32"


def _infer_conv2d_input_grad(inputs: Sequence[Node], attrs: Attrs
                             ) -> tuple[Shape, DType]:
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


def _infer_conv2d_weight_grad(inputs: Sequence[Node], attrs: Attrs
                              ) -> tuple[Shape, DType]:
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


# ---- reference semantics (NumPy, any float dtype) ---------------------------------------

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


# ---- kernels ---------------------------------------------------------------------------

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


# ---- definitions -----------------------------------------------------------------------

def _vjp_conv2d(ins: Sequence[Tensor], out: Tensor, dy: Tensor, at: Attrs) -> list[Tensor]:
    x, wt = ins
    common = {"stride": at["stride"], "padding": at["padding"], "groups": at["groups"]}
    dx = record("conv2d_input_grad", [wt, dy], in_hw=tuple(x.shape[2:]), **common)
    dw = record("conv2d_weight_grad", [x, dy], kernel=tuple(wt.shape[2:]), **common)
    return [dx, dw]


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


@public
def conv2d(x: Tensor, w: Tensor, stride: IntOrPair = 1, padding: IntOrPair = 0,
           groups: int = 1) -> Tensor:
    """2-D convolution (no bias), NCHW: x [B, Cin, H, W], w [Cout, Cin/groups, kH, kW]
    -> [B, Cout, Ho, Wo]. `stride` and `padding` are ints or (h, w) pairs; zero padding."""
    return record("conv2d", [x, w], stride=_pair("conv2d", "stride", stride),
                  padding=_pair("conv2d", "padding", padding), groups=groups)


__all__ = ["conv2d"]
