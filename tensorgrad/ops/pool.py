"""Max pooling and nearest upsampling (NCHW).

Primitives: `max_pool2d` with `max_pool2d_grad`. Output sizes follow
`floor((in + 2 pad - k) / stride) + 1`. Padded cells never win, ties go to the first cell of
the row-major window scan, and the backward recomputes that scan (no stored indices).
`nearest_upsample2d` is a reshape and a broadcast.
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
from .conv_tiled import TILED_MAX_TAPS
from .registry import GRAD_ERROR, define, public, record
from .rules import is_int, require_dtype
from .window import (
    IntOrPair,
    _cdiv,
    _check_window,
    _in_range,
    _np,
    _out_size,
    _pad,
    _pair,
    _require_rank4,
    _source,
    _split,
    _windows,
)

POOL_INIT = -3.4e38


# ---- shape rules -----------------------------------------------------------------------

def _pool_geometry(op: str, x: Shape, attrs: Attrs) -> tuple[int, int]:
    kernel, stride, pad = attrs["kernel"], attrs["stride"], attrs["padding"]
    _check_window(op, kernel, stride, pad)
    return (_out_size(op, "height", x[2], kernel[0], stride[0], pad[0]),
            _out_size(op, "width", x[3], kernel[1], stride[1], pad[1]))


def _infer_max_pool2d(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (x,) = inputs
    require_dtype("max_pool2d", x, "f32")
    _require_rank4("max_pool2d", x, "input", "[B, C, H, W]")
    return (*x.shape[:2], *_pool_geometry("max_pool2d", x.shape, attrs)), "f32"


def _infer_max_pool2d_grad(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    x, dy = inputs
    out = (*x.shape[:2], *_pool_geometry("max_pool2d_grad", x.shape, attrs))
    if dy.shape != out:
        raise ShapeError("max_pool2d_grad", f"dy {list(dy.shape)} does not match the pooled "
                         f"shape {list(out)} of x {list(x.shape)}")
    return x.shape, "f32"


# ---- reference semantics (NumPy, any float dtype) ---------------------------------------

def _pool_scan(x: Any, attrs: Attrs, out_hw: Sequence[int]) -> tuple[Any, Any]:
    """(max, winning tap index i*kW + j or -1) of every window, scanning taps row-major."""
    np = _np()
    xp = _pad(x, attrs["padding"], -np.inf)
    kh, kw = attrs["kernel"]
    best = np.full((*x.shape[:2], *out_hw), POOL_INIT, dtype=x.dtype)
    arg = np.full(best.shape, -1, dtype=np.int64)
    for i in range(kh):
        for j in range(kw):
            v = _windows(xp, i, j, out_hw, attrs["stride"])
            wins = (v > best) | (np.isnan(v) & ~np.isnan(best))  # the first NaN wins
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
        if (v > best || (is_nan(v) && !is_nan(best))) {{ best = v;{arg_set} }}
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
    return w.thread_kernel(ctx, body, prelude=w.IS_NAN_WGSL)


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
    return w.thread_kernel(ctx, body, prelude=w.IS_NAN_WGSL)


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
            wins = f"v{i}_{j} > best || (is_nan(v{i}_{j}) && !is_nan(best))"
            lines += [f"  let v{i}_{j} = in0[base + {pos}];",
                      f"  let b{i}_{j} = {inside} && ({wins});",
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
    return w.thread_kernel(ctx, "\n".join(lines), b * c * cells[0] * cells[1],
                           prelude=w.IS_NAN_WGSL)


def _emit_max_pool2d_grad(ctx: EmitContext) -> Kernel:
    (kh, kw), (sh, sw) = ctx.node.attrs["kernel"], ctx.node.attrs["stride"]
    if ctx.target.software and sh >= kh and sw >= kw and sh * sw <= TILED_MAX_TAPS:
        return _emit_max_pool2d_grad_cells(ctx)
    return _emit_max_pool2d_grad_direct(ctx)


# ---- definitions -----------------------------------------------------------------------

def _vjp_max_pool2d(ins: Sequence[Tensor], out: Tensor, dy: Tensor, at: Attrs) -> list[Tensor]:
    return [record("max_pool2d_grad", [ins[0], dy], **at)]


def _torch_max_pool2d(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    """F.max_pool2d, or a helper where the padding exceeds half the kernel (torch refuses)."""
    kernel, stride, pad = (tuple(n.attrs[k]) for k in ("kernel", "stride", "padding"))

    def one(v: tuple[int, ...]) -> str:
        return str(v[0]) if v[0] == v[1] else str(v)
    if pad[0] * 2 > kernel[0] or pad[1] * 2 > kernel[1]:
        return tx.call(cx.helper("max_pool2d_padded"), a[0].text, one(kernel), one(stride),
                       str(pad))
    args = [a[0].text, one(kernel)]
    if stride != kernel:
        args.append(f"stride={one(stride)}")
    if pad != (0, 0):
        args.append(f"padding={one(pad)}")
    return tx.call("F.max_pool2d", *args)


define("max_pool2d", infer=_infer_max_pool2d, ref=_ref_max_pool2d, vjp=_vjp_max_pool2d,
       emit=_emit_max_pool2d, torch=_torch_max_pool2d,
       doc="Window max over [B,C,H,W]; padding never wins, a NaN does (the first).")
define("max_pool2d_grad", infer=_infer_max_pool2d_grad, ref=_ref_max_pool2d_grad,
       vjp=GRAD_ERROR, emit=_emit_max_pool2d_grad,
       doc="dy routed to each window's first maximum (recomputed scan).")


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


__all__ = ["max_pool2d", "nearest_upsample2d"]
