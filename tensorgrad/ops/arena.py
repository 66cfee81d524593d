"""Arenas: many tensors side by side in one flat buffer, so one kernel can update them all.

``arena_layout(sizes)`` (from :mod:`tensorgrad.layout`) gives each tensor's element offset
(aligned to 64 elements, the 256 bytes of WebGPU's storage binding alignment, so each one
still binds on its own) and the arena's size. ``pack(xs, offsets, size)`` is the arena as a
tensor: its value is every input flattened at its offset (zeros between). It runs no kernel:
the buffer plan places each input straight into the pack's buffer. The optimizer packs the params and their gradients this way
(see :mod:`tensorgrad.optim`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Attrs, DType, Node, Shape
from ..layout import ALIGN, arena_layout
from ..tensor import Tensor
from .registry import GRAD_ERROR, define, record


def _infer_pack(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    offsets, size = tuple(attrs.get("offsets", ())), attrs.get("size")
    if not inputs or len(offsets) != len(inputs) or not isinstance(size, int):
        raise ShapeError("pack", f"expected one offset per input and a size, got {len(inputs)} "
                         f"inputs, offsets {list(offsets)} and size {size!r}")
    end = 0
    for node, offset in sorted(zip(inputs, offsets), key=lambda p: p[1]):
        if node.dtype != "f32":
            raise ShapeError("pack", f"inputs must be f32, got {node.dtype}{list(node.shape)}")
        if offset % ALIGN or offset < end:
            raise ShapeError("pack", f"offset {offset} overlaps the tensor before it or is not "
                             f"a multiple of {ALIGN}")
        end = offset + node.size
    if end > size:
        raise ShapeError("pack", f"the tensors end at {end}, past the arena's size {size}")
    return (size,), "f32"


def _ref_pack(args: Sequence[Any], node: Node) -> Any:
    import numpy as np

    out = np.zeros(node.shape[0], dtype=args[0].dtype)
    for x, offset in zip(args, node.attrs["offsets"]):
        flat = np.asarray(x).reshape(-1)
        out[offset:offset + flat.size] = flat
    return out


def _emit_pack(ctx: EmitContext) -> Kernel:
    raise ShapeError("pack", "a pack runs no kernel: the buffer plan places its inputs in its "
                     "buffer (this graph was planned without it)")


define("pack", infer=_infer_pack, ref=_ref_pack, vjp=GRAD_ERROR, emit=_emit_pack, pack=True,
       doc="Tensors side by side in one flat f32 arena (placed by the buffer plan, no kernel).")


define("copy", infer=lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype),
       ref=lambda args, node: __import__("numpy").array(args[0], copy=True), vjp=GRAD_ERROR,
       expr=lambda node: "a0",
       doc="The input in a buffer of its own (an arena member the plan cannot place).")


def pack(xs: Sequence[Tensor], offsets: Sequence[int], size: int) -> Tensor:
    """The arena [size] holding each of `xs` (flattened) at its element offset."""
    return record("pack", list(xs), offsets=tuple(int(o) for o in offsets), size=int(size))


__all__ = ["ALIGN", "arena_layout", "pack"]
