"""Normalization over the last axis: layer_norm and rms_norm, each one row kernel.

`normalize_last` writes x̂ = (x - mean) / sqrt(var + eps) (LayerNorm, `center=True`) or
x̂ = x / sqrt(mean(x²) + eps) (RMSNorm) for each row in one kernel; its backward,
`normalize_last_grad`, recomputes the row's statistics from x and writes dx in one more. The
scale and shift (`* weight + bias`) stay elementwise, so the stitching pass can merge them
into the kernels around them.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Attrs, DType, Node, Shape
from ..tensor import Tensor
from .elementwise import add, mul
from .reduce import ROW_STITCH, RowStat, row_kernel
from .registry import GRAD_ERROR, InferFn, Stitch, define, public, record
from .rules import is_finite_number, require_dtype


def _np() -> ModuleType:
    import numpy as np
    return np


def _infer_normalize(op: str) -> InferFn:
    def infer(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
        x = inputs[0]
        for k, node in enumerate(inputs):
            require_dtype(op, node, "f32", what="x" if k == 0 else "dy")
            if node.shape != x.shape:
                raise ShapeError(op, f"dy {list(node.shape)} must have the shape of x "
                                 f"{list(x.shape)}")
        if not x.shape:
            raise ShapeError(op, "input must have rank >= 1, got a 0-d tensor")
        return x.shape, "f32"
    return infer


def _ref_stats(x: Any, node: Node) -> tuple[Any, Any]:
    """(x - mean, or x for RMS) and sqrt(var + eps) per row, in x's dtype."""
    np = _np()
    eps = x.dtype.type(node.attrs["eps"])
    c = x - np.mean(x, axis=-1, keepdims=True) if node.attrs["center"] else x
    return c, np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)


def _ref_normalize(args: Sequence[Any], node: Node) -> Any:
    c, s = _ref_stats(args[0], node)
    return c / s


def _ref_normalize_grad(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    x, g = args
    c, s = _ref_stats(x, node)
    xhat = c / s
    inner = g - xhat * np.mean(g * xhat, axis=-1, keepdims=True)
    if node.attrs["center"]:
        inner = inner - np.mean(g, axis=-1, keepdims=True)
    return inner / s


def _centered_stats(ctx: EmitContext) -> tuple[list[RowStat], str]:
    """Stats `s` = sqrt(var + eps) (and `m`, the mean, when centering) and the expression
    of x - m (or x) at column j."""
    length = w.lit(float(ctx.inputs[0].shape[-1]))
    eps = w.lit(ctx.node.attrs["eps"])
    x = "in0[base + j]"
    if not ctx.node.attrs["center"]:
        return [RowStat("s", f"{x} * {x}", finish=f"sqrt(acc / {length} + {eps})")], x
    c = f"({x} - m)"
    return [RowStat("m", x, finish=f"acc / {length}"),
            RowStat("s", f"{c} * {c}", finish=f"sqrt(acc / {length} + {eps})")], c


def _emit_normalize(ctx: EmitContext) -> Kernel:
    stats, c = _centered_stats(ctx)
    return row_kernel(ctx, stats, f"out[base + j] = {c} / s;")


def _emit_normalize_grad(ctx: EmitContext) -> Kernel:
    """dx = (g - mean(g) - x̂·mean(g·x̂)) / s with g = in1 (the mean(g) term only when
    centering), x̂ = (x - m) / s."""
    stats, c = _centered_stats(ctx)
    length = w.lit(float(ctx.inputs[0].shape[-1]))
    g = "in1[base + j]"
    stats.append(RowStat("b", f"{g} * {c}", finish=f"acc / ({length} * s)"))
    inner = f"{g} - {c} / s * b"
    if ctx.node.attrs["center"]:
        stats.append(RowStat("a", g, finish=f"acc / {length}"))
        inner += " - a"
    return row_kernel(ctx, stats, f"out[base + j] = ({inner}) / s;")


def _vjp_normalize(ins: Sequence[Tensor], out: Tensor, dy: Tensor, at: Attrs) -> list[Tensor]:
    return [record("normalize_last_grad", [ins[0], dy], eps=at["eps"], center=at["center"])]


define("normalize_last", infer=_infer_normalize("normalize_last"), ref=_ref_normalize,
       vjp=_vjp_normalize, emit=_emit_normalize, stitch=ROW_STITCH,
       torch=lambda n, a, cx: tx.call(cx.helper("normalize_last"), a[0].text,
                                      tx.literal(float(n.attrs["eps"])),
                                      repr(bool(n.attrs["center"]))),
       doc="(x - mean) / sqrt(var + eps) over the last axis (center), or x / sqrt(mean(x²) "
           "+ eps); one row kernel.")
define("normalize_last_grad", infer=_infer_normalize("normalize_last_grad"),
       ref=_ref_normalize_grad, vjp=GRAD_ERROR, emit=_emit_normalize_grad,
       stitch=Stitch(prologue=(0, 1), prologue_ops=2, epilogue=True),
       doc="The gradient of normalize_last wrt x, given x and dy; one row kernel that "
           "recomputes the row's statistics.")


def _check_norm(op: str, x: Tensor, eps: float, **affine: Tensor | None) -> None:
    if not isinstance(x, Tensor):
        raise ShapeError(op, f"x must be a Tensor, got {type(x).__name__}")
    require_dtype(op, x.node, "f32", what="x")
    if x.ndim == 0:
        raise ShapeError(op, "x must have rank >= 1 (it is normalized over its last axis), "
                         "got a 0-d tensor")
    if not (is_finite_number(eps) and eps >= 0):
        raise ShapeError(op, f"eps must be a finite Python number >= 0, got {eps!r}")
    for name, t in affine.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise ShapeError(op, f"{name} must be a Tensor or None, got {type(t).__name__}")
        require_dtype(op, t.node, "f32", what=name)
        if t.shape != x.shape[-1:]:
            raise ShapeError(op, f"{name} {list(t.shape)} must be [{x.shape[-1]}], the last "
                             f"axis of x {list(x.shape)}")


@public
def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Layer normalization over the last axis of x [..., D]:
    (x - mean) / sqrt(var + eps) * weight + bias, with the biased variance (as PyTorch's
    `F.layer_norm(x, (D,), weight, bias, eps)`); weight and bias are [D] or None."""
    _check_norm("layer_norm", x, eps, weight=weight, bias=bias)
    y = record("normalize_last", [x], eps=float(eps), center=True)
    y = y if weight is None else mul(y, weight)
    return y if bias is None else add(y, bias)


@public
def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """RMS normalization over the last axis of x [..., D]: x / sqrt(mean(x²) + eps) * weight
    (as PyTorch's `F.rms_norm(x, (D,), weight, eps)`); weight is [D] or None."""
    _check_norm("rms_norm", x, eps, weight=weight)
    y = record("normalize_last", [x], eps=float(eps), center=False)
    return y if weight is None else mul(y, weight)


__all__ = ["layer_norm", "rms_norm"]
