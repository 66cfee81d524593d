"""Shared shape and dtype rules for op definitions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeGuard

from ..errors import ShapeError
from ..ir import DType, Node, Shape


def broadcast_shapes(op: str, *shapes: Shape) -> Shape:
    """Right-aligned NumPy broadcasting; a size-1 dim on either side stretches."""
    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        dims = {s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0}
        dims.discard(1)
        if len(dims) > 1:
            listed = " and ".join(str(list(s)) for s in shapes)
            raise ShapeError(op, f"shapes {listed} do not broadcast (axis {k - rank} has sizes "
                             f"{sorted(dims)}; each must be equal or 1)")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def is_int(value: object) -> TypeGuard[int]:
    """Whether `value` is a Python int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """Whether `value` is a finite Python int or float (not a bool)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value))


def require_dtype(op: str, node: Node, *dtypes: DType, what: str = "input") -> None:
    if node.dtype not in dtypes:
        want = " or ".join(dtypes)
        raise ShapeError(op, f"{what} must be {want}, got {node.dtype} "
                         f"(shape {list(node.shape)})")


def same_dtype(op: str, nodes: Sequence[Node]) -> DType:
    dtypes = {n.dtype for n in nodes}
    if len(dtypes) != 1:
        described = ", ".join(f"{n.dtype}{list(n.shape)}" for n in nodes)
        raise ShapeError(op, f"operands must have the same dtype, got {described}")
    return nodes[0].dtype


def normalize_axis(op: str, axis: object, rank: int, extra: int = 0) -> int:
    """`axis` in [-(rank+extra), rank+extra) mapped to [0, rank+extra); ShapeError for
    anything else (a tuple of axes included: the reductions take one)."""
    n = rank + extra
    if isinstance(axis, (tuple, list)):
        raise ShapeError(op, f"axis must be one int, got {type(axis).__name__} {axis!r}: "
                         "reduce one axis at a time (e.g. sum(sum(x, 2), 1))")
    if isinstance(axis, bool) or not isinstance(axis, int) or not -n <= axis < n:
        raise ShapeError(op, f"axis {axis} is out of range for a tensor of rank {rank} "
                         f"(valid: {-n}..{n - 1})")
    return axis + n if axis < 0 else axis


# Which triangle of a tensor's last two axes is known to hold exact zeros: "above" (column >
# row, as a causal softmax leaves it), "below" (column < row) or None (not known). A matmul
# whose operand has such a triangle skips that part of its contraction (passes/triangles.py).
TRIANGLES = ("above", "below")


def flip_triangle(triangle: str | None) -> str | None:
    """The triangle of the transpose of the last two axes."""
    return {"above": "below", "below": "above"}.get(triangle or "")


def same_last_two(node: Node, inputs: Sequence[Node], zeros: Sequence[str | None]
                  ) -> str | None:
    """Zeros rule of a layout op that moves only leading axes (a reshape or broadcast that
    keeps the last two axes as they are): input 0's triangle."""
    (a,) = inputs[:1]
    keeps = len(a.shape) >= 2 and len(node.shape) >= 2 and node.shape[-2:] == a.shape[-2:]
    return zeros[0] if keeps else None


def check_dims(op: str, shape: Sequence[int]) -> Shape:
    if any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in shape):
        raise ShapeError(op, f"dims must be positive ints, got {list(shape)}")
    return tuple(shape)
