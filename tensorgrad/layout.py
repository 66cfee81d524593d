"""Arena layout: many f32 tensors side by side in one flat buffer, each at an offset a
kernel can bind on its own (256 bytes: WebGPU's storage offset alignment).

Plain arithmetic, below the op table and the runtime: the optimizer packs params and their
gradients at these offsets (:mod:`tensorgrad.ops.arena`), and the param store
(:mod:`tensorgrad.runtime`) lays its arena out the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

ALIGN = 64  # elements: 256 bytes of f32


def arena_layout(sizes: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """(element offset of each tensor, the arena's element count) for tensors of `sizes`
    side by side, each at a multiple of ALIGN."""
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-int(n) // ALIGN) * ALIGN
    return tuple(offsets), max(end, ALIGN)
