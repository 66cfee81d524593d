"""Index ops: one_hot, arange, and the gathers built on them (embedding, take_along_axis).

Gathers are one-hot products, so their backward needs no scatter; an index outside the
valid range selects nothing (a zero row) instead of failing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import DTYPES, Node, Shape
from ..tensor import Tensor
from .elementwise import mul
from .registry import NO_GRAD, PUBLIC, define, public, record
from .rules import normalize_axis, require_dtype
from .shape import move_to_last, permute, reshape

_NP_DTYPES = {"i32": "int32", "bool": "bool"}


def _np():
    import numpy as np
    return np


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_dtype(op: str, dtype: Any) -> None:
    if dtype not in DTYPES:
        raise ShapeError(op, f"dtype must be one of {DTYPES}, got {dtype!r}")


def _np_out(dtype: str, like: Any) -> Any:
    """NumPy dtype for an op output: f32 follows the float inputs (float32 or float64)."""
    return _NP_DTYPES.get(dtype, like)


# ---- one_hot ---------------------------------------------------------------------------

def _infer_one_hot(inputs: Sequence[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    (idx,) = inputs
    require_dtype("one_hot", idx, "i32", what="indices")
    depth = attrs["depth"]
    if not _is_int(depth) or depth <= 0:
        raise ShapeError("one_hot", f"depth must be a positive int, got {depth!r}")
    _check_dtype("one_hot", attrs["dtype"])
    return (*idx.shape, depth), attrs["dtype"]


def _ref_one_hot(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    idx = args[0]
    hot = idx[..., None] == np.arange(node.attrs["depth"])
    return hot.astype(_np_out(node.dtype, np.float32))


def _emit_one_hot(ctx: EmitContext) -> Kernel:
    depth = ctx.node.attrs["depth"]
    dt = ctx.node.dtype
    body = (f"  out[i] = select({w.lit(0, dt)}, {w.lit(1, dt)}, "
            f"u32(in0[i / {w.u(depth)}]) == i % {w.u(depth)});")
    return w.thread_kernel(ctx, body)


define("one_hot", infer=_infer_one_hot, ref=_ref_one_hot, vjp=NO_GRAD, emit=_emit_one_hot,
       doc="[...] i32 -> [..., depth]: 1 at the index, 0 elsewhere (no 1 when out of range).")


@public
def one_hot(idx: Tensor, depth: int, dtype: str = "f32") -> Tensor:
    """[...] i32 indices -> [..., depth] of `dtype`; out-of-range indices give a zero row."""
    return record("one_hot", [idx], depth=depth, dtype=dtype)


# ---- arange ----------------------------------------------------------------------------

def _infer_arange(inputs: Sequence[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    n = attrs["n"]
    if not _is_int(n) or n <= 0:
        raise ShapeError("arange", f"n must be a positive int, got {n!r}")
    if attrs["dtype"] not in ("f32", "i32"):
        raise ShapeError("arange", f"dtype must be 'f32' or 'i32', got {attrs['dtype']!r}")
    return (n,), attrs["dtype"]


define("arange", infer=_infer_arange,
       ref=lambda args, node: _np().arange(node.attrs["n"]),
       vjp=NO_GRAD,
       emit=lambda ctx: w.thread_kernel(ctx, f"  out[i] = {w.wgsl_type(ctx.node.dtype)}(i);"),
       doc="[n] of 0..n-1.")


@public
def arange(n: int, dtype: str = "i32") -> Tensor:
    """[n] holding 0, 1, ..., n-1 as i32 (or f32)."""
    return record("arange", [], n=n, dtype=dtype)


# ---- gathers ---------------------------------------------------------------------------

@public
def embedding(table: Tensor, idx: Tensor) -> Tensor:
    """Rows of table [V, D] picked by i32 idx [...] -> [..., D] (out of range: zeros).
    Computed as one_hot(idx, V) @ table, so the table gradient needs no scatter."""
    if table.ndim != 2:
        raise ShapeError("embedding", f"table must have rank 2 [V, D], got shape "
                         f"{list(table.shape)}")
    require_dtype("embedding", table.node, "f32", what="table")
    require_dtype("embedding", idx.node, "i32", what="indices")
    vocab, dim = table.shape
    hot = reshape(one_hot(idx, vocab), (-1, vocab))  # [N, V]
    rows = PUBLIC["matmul"](hot, table)  # the linear-algebra family's op, looked up late
    return reshape(rows, (*idx.shape, dim))


@public
def take_along_axis(x: Tensor, idx: Tensor, axis: int) -> Tensor:
    """out[..., k, ...] = x[..., idx[..., k, ...], ...] along `axis`: f32 x and i32 idx of
    the same rank, shapes equal except on `axis`; the output has idx's shape
    (out-of-range indices give 0)."""
    from .reduce import sum as reduce_sum

    require_dtype("take_along_axis", x.node, "f32", what="input")
    require_dtype("take_along_axis", idx.node, "i32", what="indices")
    if x.ndim != idx.ndim or x.ndim == 0:
        raise ShapeError("take_along_axis", f"input {list(x.shape)} and indices "
                         f"{list(idx.shape)} must have the same rank >= 1")
    axis = normalize_axis("take_along_axis", axis, x.ndim)
    if any(a != b for k, (a, b) in enumerate(zip(x.shape, idx.shape)) if k != axis):
        raise ShapeError("take_along_axis", f"input {list(x.shape)} and indices "
                         f"{list(idx.shape)} must match except on axis {axis}")
    xs = move_to_last(x, axis)                       # [..., D]
    ids = move_to_last(idx, axis)                    # [..., K]
    depth = x.shape[axis]
    hot = one_hot(ids, depth)                        # [..., K, D]
    rows = reshape(xs, (*xs.shape[:-1], 1, depth))   # [..., 1, D]
    picked = reduce_sum(mul(hot, rows), axis=-1)     # [..., K]
    perm = list(range(x.ndim - 1))
    perm.insert(axis, x.ndim - 1)
    return permute(picked, perm)


__all__ = ["arange", "embedding", "one_hot", "take_along_axis"]
