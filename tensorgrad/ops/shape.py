"""Shape ops: reshape, permute, slicing, concatenation and the helpers built on them.

Primitives: `reshape` (flat copy), `permute` (gather through input strides), `slice_range`,
`scatter_axis` (its backward; not differentiable) and `concat` (at most 7 inputs, so one
kernel binds at most 8 storage buffers). They work for every dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from types import ModuleType
from typing import Any

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import ITEMSIZE, Attrs, DType, Node, Shape
from ..tensor import Tensor
from .registry import GRAD_ERROR, define, public, record
from .rules import flip_triangle, is_int, normalize_axis, same_dtype, same_last_two

MAX_CONCAT_INPUTS = 7  # 7 inputs + 1 output = 8 storage buffers per kernel


def _np() -> ModuleType:
    import numpy as np
    return np


def _split3(shape: Shape, axis: int) -> tuple[int, int, int]:
    """(outer, axis length, inner) of `shape` around `axis`."""
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


# ---- reshape ---------------------------------------------------------------------------

def resolve_shape(op: str, src: Shape, shape: Sequence[int]) -> Shape:
    """`shape` with its one optional -1 inferred so the sizes match `src`."""
    shape = tuple(shape)
    if any(not is_int(d) or (d <= 0 and d != -1) for d in shape):
        raise ShapeError(op, f"target shape {list(shape)} must hold positive ints and at most "
                         f"one -1 (input shape {list(src)})")
    if shape.count(-1) > 1:
        raise ShapeError(op, f"target shape {list(shape)} has more than one -1 "
                         f"(input shape {list(src)})")
    size = prod(src)
    if -1 in shape:
        known = prod(d for d in shape if d != -1)
        if size % known:
            raise ShapeError(op, f"cannot reshape {list(src)} ({size} elements) to "
                             f"{list(shape)}: {size} is not divisible by {known}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    if prod(shape) != size:
        raise ShapeError(op, f"cannot reshape {list(src)} ({size} elements) to {list(shape)} "
                         f"({prod(shape)} elements)")
    return shape


def _infer_reshape(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (a,) = inputs
    return resolve_shape("reshape", a.shape, attrs["shape"]), a.dtype


def _torch_reshape(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    """`.reshape(...)` with -1 for the size that follows the None dim (or, when none does,
    for the one dim that is not 1)."""
    target = list(n.attrs["shape"])
    syms = [k for k, d in enumerate(target) if isinstance(d, tx.Sym)]
    if len(syms) == 1:
        target[syms[0]] = -1
    elif not syms:
        big = [k for k, d in enumerate(target) if d != 1]
        if len(big) == 1:
            target[big[0]] = -1   # the same size whatever the input's size
    return tx.method(a[0], f"reshape({cx.dims(target)})")


define("reshape", infer=_infer_reshape,
       ref=lambda args, node: args[0].reshape(node.shape).copy(),
       vjp=lambda ins, out, dy, at: [reshape(dy, ins[0].shape)],
       emit=lambda ctx: w.thread_kernel(ctx, "  out[i] = in0[i];"),
       view=lambda node, src: 0, zeros=same_last_two, torch=_torch_reshape,
       doc="Same elements in row-major order, new shape (a view of the input's buffer; a "
           "copy only where the result needs a buffer of its own).")


@public
def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    """x with a new `shape` of the same size; one dim may be -1 (inferred)."""
    if isinstance(shape, int):
        shape = (shape,)
    target = resolve_shape("reshape", x.shape, shape)
    return x if target == x.shape else record("reshape", [x], shape=target)


# ---- permute ---------------------------------------------------------------------------

def _check_perm(op: str, perm: Sequence[int], shape: Shape) -> tuple[int, ...]:
    perm = tuple(perm)
    if not all(is_int(p) for p in perm) or sorted(perm) != list(range(len(shape))):
        raise ShapeError(op, f"perm {list(perm)} must be a permutation of "
                         f"0..{len(shape) - 1} for a tensor of shape {list(shape)}")
    return perm


def _infer_permute(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (a,) = inputs
    perm = _check_perm("permute", attrs["perm"], a.shape)
    return tuple(a.shape[p] for p in perm), a.dtype


def _inverse(perm: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for k, p in enumerate(perm):
        inv[p] = k
    return tuple(inv)


def _emit_permute(ctx: EmitContext) -> Kernel:
    src = w.strides(ctx.inputs[0].shape)
    perm = ctx.node.attrs["perm"]
    index = w.decompose("i", ctx.node.shape, [src[p] for p in perm])
    return w.thread_kernel(ctx, f"  out[i] = in0[{index}];")


def _permute_zeros(node: Node, inputs: Sequence[Node], zeros: Sequence[str | None]
                   ) -> str | None:
    """A permute that keeps the last two axes last keeps their triangle; one that swaps
    them flips it."""
    perm, rank = tuple(node.attrs["perm"]), len(node.shape)
    if rank < 2 or sorted(perm[-2:]) != [rank - 2, rank - 1]:
        return None
    return zeros[0] if perm[-1] == rank - 1 else flip_triangle(zeros[0])


def _torch_permute(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    """`.transpose(i, j)` for a swap of two axes, else `.permute(...)`."""
    perm = list(n.attrs["perm"])
    moved = [k for k, p in enumerate(perm) if p != k]
    if len(moved) == 2 and perm[moved[0]] == moved[1]:
        i, j = moved
        if (i, j) == (len(perm) - 2, len(perm) - 1):
            i, j = -2, -1
        return tx.method(a[0], f"transpose({i}, {j})")
    return tx.method(a[0], f"permute({', '.join(map(str, perm))})")


define("permute", infer=_infer_permute,
       ref=lambda args, node: _np().transpose(args[0], node.attrs["perm"]).copy(),
       vjp=lambda ins, out, dy, at: [permute(dy, _inverse(at["perm"]))],
       emit=_emit_permute, doc="Reorder axes: out axis k is input axis perm[k].",
       zeros=_permute_zeros, torch=_torch_permute)


@public
def permute(x: Tensor, perm: Sequence[int]) -> Tensor:
    """Reorder the axes of x: output axis k is input axis perm[k] (no negative entries)."""
    perm = _check_perm("permute", perm, x.shape)
    return x if perm == tuple(range(x.ndim)) else record("permute", [x], perm=perm)


@public
def swap_axes(x: Tensor, a: int, b: int) -> Tensor:
    """x with axes `a` and `b` exchanged (negative axes allowed); a == b returns x."""
    a = normalize_axis("swap_axes", a, x.ndim)
    b = normalize_axis("swap_axes", b, x.ndim)
    if a == b:
        return x
    perm = list(range(x.ndim))
    perm[a], perm[b] = b, a
    return record("permute", [x], perm=tuple(perm))


def move_to_last(x: Tensor, axis: int) -> Tensor:
    """x with (normalized) `axis` moved to the end, the other axes in order."""
    perm = [k for k in range(x.ndim) if k != axis] + [axis]
    return permute(x, perm)


@public
def split_heads(x: Tensor, heads: int) -> Tensor:
    """[..., T, D] -> [..., heads, T, D // heads]."""
    if x.ndim < 2:
        raise ShapeError("split_heads", f"input must have rank >= 2 ([..., T, D]), got shape "
                         f"{list(x.shape)}")
    if not is_int(heads) or heads <= 0 or x.shape[-1] % heads:
        raise ShapeError("split_heads", f"last dim {x.shape[-1]} of shape {list(x.shape)} is "
                         f"not divisible by heads={heads!r}")
    *lead, t, d = x.shape
    return swap_axes(reshape(x, (*lead, t, heads, d // heads)), -3, -2)


@public
def merge_heads(x: Tensor) -> Tensor:
    """[..., H, T, d] -> [..., T, H * d] (the inverse of split_heads)."""
    if x.ndim < 3:
        raise ShapeError("merge_heads", f"input must have rank >= 3 ([..., H, T, d]), got "
                         f"shape {list(x.shape)}")
    *lead, h, t, d = x.shape
    return reshape(swap_axes(x, -3, -2), (*lead, t, h * d))


# ---- slicing ---------------------------------------------------------------------------

def _check_range(op: str, shape: Shape, axis: int, start: int, end: int) -> None:
    if not (is_int(start) and is_int(end) and 0 <= start < end <= shape[axis]):
        raise ShapeError(op, f"range [{start}, {end}) is not a non-empty range inside axis "
                         f"{axis} of size {shape[axis]} (shape {list(shape)})")


def _infer_slice(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (a,) = inputs
    axis = normalize_axis("slice_range", attrs["axis"], len(a.shape))
    _check_range("slice_range", a.shape, axis, attrs["start"], attrs["end"])
    shape = list(a.shape)
    shape[axis] = attrs["end"] - attrs["start"]
    return tuple(shape), a.dtype


def _ref_slice(args: Sequence[Any], node: Node) -> Any:
    at = node.attrs
    index = [slice(None)] * args[0].ndim
    index[at["axis"]] = slice(at["start"], at["end"])
    return args[0][tuple(index)].copy()


def _emit_slice(ctx: EmitContext) -> Kernel:
    at = ctx.node.attrs
    _, length, inner = _split3(ctx.node.shape, at["axis"])
    dim = ctx.inputs[0].shape[at["axis"]]
    body = f"""  let outer = i / {w.u(length * inner)};
  let a = (i / {w.u(inner)}) % {w.u(length)};
  let inner = i % {w.u(inner)};
  out[i] = in0[outer * {w.u(dim * inner)} + (a + {w.u(at['start'])}) * {w.u(inner)} + inner];"""
    return w.thread_kernel(ctx, body)


def _slice_view(node: Node, src: Node) -> int | None:
    """A slice is a view when it is contiguous (every axis before `axis` has size 1) and
    starts at a 256-byte boundary (WebGPU's storage binding alignment)."""
    at = node.attrs
    if any(d != 1 for d in src.shape[:at["axis"]]):
        return None
    offset = ITEMSIZE[src.dtype] * at["start"] * prod(src.shape[at["axis"] + 1:])
    return offset if offset % 256 == 0 else None


def _torch_slice(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    at, rank = n.attrs, len(n.shape)
    span = f"{cx.dim(at['start']) if at['start'] != 0 else ''}:{cx.dim(at['end'])}"
    index = f"..., {span}" if at["axis"] == rank - 1 and rank > 1 else \
        ", ".join([":"] * at["axis"] + [span])
    return tx.Expr(f"{tx.paren(a[0], tx.ATOM)}[{index}]")


define("slice_range", infer=_infer_slice, ref=_ref_slice,
       vjp=lambda ins, out, dy, at: [scatter_axis(dy, ins[0].shape, at["axis"], at["start"],
                                                  at["end"])],
       emit=_emit_slice, view=_slice_view, torch=_torch_slice,
       doc="x[..., start:end, ...] along `axis` (axis >= 0); a view when contiguous and "
           "256-byte aligned.")


def _infer_scatter(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (a,) = inputs
    shape = tuple(attrs["shape"])
    axis = normalize_axis("scatter_axis", attrs["axis"], len(shape))
    _check_range("scatter_axis", shape, axis, attrs["start"], attrs["end"])
    want = list(shape)
    want[axis] = attrs["end"] - attrs["start"]
    if tuple(want) != a.shape:
        raise ShapeError("scatter_axis", f"input shape {list(a.shape)} must be {want} to fill "
                         f"[{attrs['start']}, {attrs['end']}) of axis {axis} of {list(shape)}")
    return shape, a.dtype


def _ref_scatter(args: Sequence[Any], node: Node) -> Any:
    at = node.attrs
    out = _np().zeros(node.shape, dtype=args[0].dtype)
    index = [slice(None)] * len(node.shape)
    index[at["axis"]] = slice(at["start"], at["end"])
    out[tuple(index)] = args[0]
    return out


def _emit_scatter(ctx: EmitContext) -> Kernel:
    at = ctx.node.attrs
    _, dim, inner = _split3(ctx.node.shape, at["axis"])
    length = at["end"] - at["start"]
    zero = w.lit(0, ctx.node.dtype)
    body = f"""  let outer = i / {w.u(dim * inner)};
  let a = (i / {w.u(inner)}) % {w.u(dim)};
  let inner = i % {w.u(inner)};
  var v = {zero};
  if (a >= {w.u(at['start'])} && a < {w.u(at['end'])}) {{
    v = in0[outer * {w.u(length * inner)} + (a - {w.u(at['start'])}) * {w.u(inner)} + inner];
  }}
  out[i] = v;"""
    return w.thread_kernel(ctx, body)


define("scatter_axis", infer=_infer_scatter, ref=_ref_scatter, vjp=GRAD_ERROR,
       emit=_emit_scatter,
       doc="Zeros of `shape` with x written into [start, end) of `axis` (slice backward).")


def scatter_axis(x: Tensor, shape: Sequence[int], axis: int, start: int, end: int) -> Tensor:
    """Zeros of `shape` holding `x` in [start, end) along `axis` (the slice_range backward)."""
    return record("scatter_axis", [x], shape=tuple(shape), axis=axis, start=start, end=end)


@public
def narrow(x: Tensor, axis: int, start: int, length: int) -> Tensor:
    """x[..., start:start+length, ...] along `axis` (negative axis allowed)."""
    if x.ndim == 0:
        raise ShapeError("narrow", "cannot narrow a 0-d tensor")
    axis = normalize_axis("narrow", axis, x.ndim)
    if not (is_int(start) and is_int(length)) or start < 0 or length <= 0 or \
            start + length > x.shape[axis]:
        raise ShapeError("narrow", f"start={start!r}, length={length!r} do not fit axis {axis} "
                         f"of size {x.shape[axis]} (shape {list(x.shape)}); need 0 <= start "
                         f"and 0 < length and start + length <= {x.shape[axis]}")
    if start == 0 and length == x.shape[axis]:
        return x
    return record("slice_range", [x], axis=axis, start=start, end=start + length)


@public
def split(x: Tensor, sizes: Sequence[int] | int, axis: int = 0) -> list[Tensor]:
    """Pieces of x along `axis` with the given sizes (summing to the axis length); an int
    gives pieces of that size (the last may be shorter), like torch.split."""
    if x.ndim == 0:
        raise ShapeError("split", "cannot split a 0-d tensor")
    axis = normalize_axis("split", axis, x.ndim)
    dim = x.shape[axis]
    if is_int(sizes):
        if sizes <= 0:
            raise ShapeError("split", f"split size must be a positive int, got {sizes}")
        sizes = [min(sizes, dim - s) for s in range(0, dim, sizes)]
    sizes = list(sizes)  # type: ignore[arg-type]
    if not sizes or any(not is_int(s) or s <= 0 for s in sizes) or \
            sum(sizes) != dim:
        raise ShapeError("split", f"sizes {sizes} must be positive ints summing to {dim}, the "
                         f"size of axis {axis} of shape {list(x.shape)}")
    pieces, start = [], 0
    for s in sizes:
        pieces.append(narrow(x, axis, start, s))
        start += s
    return pieces



# ---- concat and stack ------------------------------------------------------------------

def _check_concat(op: str, shapes: Sequence[Shape], axis: int) -> None:
    first = shapes[0]
    for s in shapes[1:]:
        if len(s) != len(first) or any(a != b for k, (a, b) in enumerate(zip(s, first))
                                        if k != axis):
            listed = ", ".join(str(list(x)) for x in shapes)
            raise ShapeError(op, f"shapes must match except on axis {axis}, got {listed}")


def _infer_concat(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    if not 1 <= len(inputs) <= MAX_CONCAT_INPUTS:
        raise ShapeError("concat", f"the primitive takes 1..{MAX_CONCAT_INPUTS} inputs, got "
                         f"{len(inputs)}")
    dtype = same_dtype("concat", inputs)
    axis = normalize_axis("concat", attrs["axis"], len(inputs[0].shape))
    _check_concat("concat", [n.shape for n in inputs], axis)
    shape = list(inputs[0].shape)
    shape[axis] = sum(n.shape[axis] for n in inputs)
    return tuple(shape), dtype


def _vjp_concat(ins: Sequence[Tensor], out: Tensor, dy: Tensor, at: Attrs) -> list[Tensor]:
    grads, offset = [], 0
    for t in ins:
        size = t.shape[at["axis"]]
        grads.append(record("slice_range", [dy], axis=at["axis"], start=offset,
                            end=offset + size))
        offset += size
    return grads


def _emit_concat(ctx: EmitContext) -> Kernel:
    axis = ctx.node.attrs["axis"]
    _, total, inner = _split3(ctx.node.shape, axis)
    lines = [f"  let outer = i / {w.u(total * inner)};",
             f"  let a = (i / {w.u(inner)}) % {w.u(total)};",
             f"  let inner = i % {w.u(inner)};"]
    offset = 0
    for k, n in enumerate(ctx.inputs):
        size = n.shape[axis]
        read = (f"out[i] = in{k}[outer * {w.u(size * inner)} + (a - {w.u(offset)}) * "
                f"{w.u(inner)} + inner];")
        if k == len(ctx.inputs) - 1:
            lines.append(f"  {'} else { ' if k else ''}{read}{' }' if k else ''}")
        else:
            lines.append(f"  {'} else if' if k else 'if'} (a < {w.u(offset + size)}) {{ {read}")
        offset += size
    return w.thread_kernel(ctx, "\n".join(lines))


def _torch_concat(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    items = ", ".join(cx.tensor(e, n.dtype).text for e in a)
    axis = n.attrs["axis"]
    if axis == len(n.shape) - 1 and len(n.shape) > 1:
        axis = -1
    return tx.call("torch.cat", f"[{items}]", f"dim={axis}")


define("concat", infer=_infer_concat,
       ref=lambda args, node: _np().concatenate(args, axis=node.attrs["axis"]),
       vjp=_vjp_concat, emit=_emit_concat, torch=_torch_concat,
       doc="Join 1..7 tensors along `axis` (axis >= 0).")


def _tensor_list(op: str, xs: Sequence[Tensor]) -> list[Tensor]:
    """`xs` as a non-empty list of Tensors, else a ShapeError naming `op`."""
    xs = list(xs)
    if not xs:
        raise ShapeError(op, "needs at least one tensor, got an empty list")
    if any(not isinstance(t, Tensor) for t in xs):
        kinds = ", ".join(type(t).__name__ for t in xs)
        raise ShapeError(op, f"expected a list of Tensors, got [{kinds}]")
    return xs


@public
def concat(xs: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along `axis`; dtypes equal, shapes equal except on `axis`. Any number of
    inputs (more than 7 are joined in layers so no kernel binds more than 8 buffers)."""
    xs = _tensor_list("concat", xs)
    if xs[0].ndim == 0:
        raise ShapeError("concat", "cannot concatenate 0-d tensors (use stack)")
    axis = normalize_axis("concat", axis, xs[0].ndim)
    same_dtype("concat", [t.node for t in xs])
    _check_concat("concat", [t.shape for t in xs], axis)
    while len(xs) > 1:
        groups = [xs[k:k + MAX_CONCAT_INPUTS] for k in range(0, len(xs), MAX_CONCAT_INPUTS)]
        xs = [g[0] if len(g) == 1 else record("concat", g, axis=axis) for g in groups]
    return xs[0]


@public
def stack(xs: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join equal-shaped tensors along a new axis (`axis` in -(rank+1)..rank)."""
    xs = _tensor_list("stack", xs)
    if any(t.shape != xs[0].shape for t in xs):
        listed = ", ".join(str(list(t.shape)) for t in xs)
        raise ShapeError("stack", f"all tensors must have the same shape, got {listed}")
    axis = normalize_axis("stack", axis, xs[0].ndim, extra=1)
    shape = (*xs[0].shape[:axis], 1, *xs[0].shape[axis:])
    return concat([reshape(t, shape) for t in xs], axis)


__all__ = [
    "concat",
    "merge_heads",
    "move_to_last",
    "narrow",
    "permute",
    "reshape",
    "resolve_shape",
    "scatter_axis",
    "split",
    "split_heads",
    "stack",
    "swap_axes",
]
