"""broadcast_to and sum_to_shape: the pair that implements broadcasting and its gradient;
and sum_partials, the first stage of a column sum that passes/split_reduce.py splits."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Attrs, DType, Node, Shape
from ..tensor import Tensor
from .registry import GRAD_ERROR, Stitch, define, record
from .rules import is_int, same_last_two


def _infer_broadcast_to(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (a,), target = inputs, tuple(attrs["shape"])
    off = len(target) - len(a.shape)
    if off < 0 or any(d not in (1, target[k + off]) for k, d in enumerate(a.shape)):
        raise ShapeError("broadcast_to", f"cannot broadcast {list(a.shape)} to {list(target)}")
    return target, a.dtype


def _infer_sum_to_shape(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (a,), target = inputs, tuple(attrs["shape"])
    off = len(a.shape) - len(target)
    if off < 0 or any(d not in (1, a.shape[k + off]) for k, d in enumerate(target)):
        raise ShapeError("sum_to_shape", f"cannot sum {list(a.shape)} down to {list(target)}")
    return target, a.dtype


def reduced_axes(src: Shape, target: Shape) -> tuple[int, ...]:
    """The axes of `src` that summing it down to `target` reduces (right-aligned)."""
    off = len(src) - len(target)
    return tuple(k for k in range(len(src)) if k < off or (target[k - off] == 1 and src[k] != 1))


def _ref_sum_to_shape(args: Sequence[Any], node: Node) -> Any:
    (a,) = args
    return a.sum(axis=reduced_axes(a.shape, node.shape)).reshape(node.shape)


def _emit_sum_to_shape(ctx: EmitContext) -> Kernel:
    src = ctx.inputs[0].shape
    red = reduced_axes(src, ctx.node.shape)
    kept = [k for k in range(len(src)) if k not in red]
    st = w.strides(src)
    length = prod(src[k] for k in red)
    index = " + ".join([
        w.decompose("o", [src[k] for k in kept], [st[k] for k in kept]),
        w.decompose("r", [src[k] for k in red], [st[k] for k in red])])
    return w.reduce_kernel(ctx, ctx.node.size, length, index)


define("broadcast_to", infer=_infer_broadcast_to,
       ref=lambda args, node: __import__("numpy").broadcast_to(args[0], node.shape).copy(),
       vjp=lambda ins, out, dy, attrs: [sum_to_shape(dy, ins[0].shape)],
       expr=lambda node: "a0", doc="Repeat size-1 / missing leading axes up to `shape`.",
       torch=lambda n, a, cx: tx.method(cx.tensor(a[0], n.dtype),
                                        f"expand({cx.dims(n.attrs['shape'])})"),
       zeros=same_last_two)
define("sum_to_shape", infer=_infer_sum_to_shape, ref=_ref_sum_to_shape,
       vjp=lambda ins, out, dy, attrs: [broadcast_to(dy, ins[0].shape)],
       emit=_emit_sum_to_shape, doc="Sum the axes broadcasting added, down to `shape`.",
       torch=lambda n, a, cx: tx.call(cx.helper("sum_to_shape"), a[0].text,
                                      cx.tuple_(n.attrs["shape"])),
       stitch=Stitch(prologue=(0,), epilogue=True))


# ---- sum_partials ------------------------------------------------------------------------

def _infer_sum_partials(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (a,) = inputs
    rows, parts = attrs["rows"], attrs["parts"]
    ints = all(is_int(v) and v > 0 for v in (rows, parts))
    prefixes = {prod(a.shape[:k]) for k in range(len(a.shape) + 1)}
    if not ints or rows % parts or rows not in prefixes:
        raise ShapeError("sum_partials", f"rows={rows!r} must be the product of leading axes "
                         f"of {list(a.shape)} and a multiple of parts={parts!r}")
    return (parts, prod(a.shape) // rows), a.dtype


def _ref_sum_partials(args: Sequence[Any], node: Node) -> Any:
    (a,) = args
    parts = node.attrs["parts"]
    return a.reshape(parts, node.attrs["rows"] // parts, -1).sum(axis=1)


def _emit_sum_partials(ctx: EmitContext) -> Kernel:
    parts, cols = ctx.node.shape
    chunk = ctx.node.attrs["rows"] // parts
    index = f"((o / {w.u(cols)}) * {w.u(chunk)} + r) * {w.u(cols)} + o % {w.u(cols)}"
    return w.reduce_kernel(ctx, ctx.node.size, chunk, index)


define("sum_partials", infer=_infer_sum_partials, ref=_ref_sum_partials, vjp=GRAD_ERROR,
       emit=_emit_sum_partials, stitch=Stitch(prologue=(0,), epilogue=True),
       doc="x [R..., N...] (R = `rows`, leading axes) -> [parts, N]: partial sums of "
           "R / parts consecutive rows each, one thread per output (reads coalesced).")


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Broadcast `x` to `shape` (no-op when equal)."""
    return x if tuple(shape) == x.shape else record("broadcast_to", [x], shape=tuple(shape))


def sum_to_shape(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Sum `x` down to `shape`, undoing a broadcast (no-op when equal)."""
    return x if tuple(shape) == x.shape else record("sum_to_shape", [x], shape=tuple(shape))
