"""Offline packing of blocks with known lifetimes into a few buffers at byte offsets.

Plain arithmetic, below the planner (:mod:`tensorgrad.plan`). Every block (a tensor, or an
arena of tensors) has a size in bytes and a lifetime, an inclusive span of steps; two blocks
whose lifetimes overlap never share bytes. Two more rules make the buffers usable as WebGPU
storage bindings: every offset is a multiple of `align` (the device's
min_storage_buffer_offset_alignment, 256 bytes in WebGPU) and no buffer grows past
`capacity` (its max_buffer_size); and blocks joined by a conflict (a kernel reads one and
writes the other) go to different buffers, since WebGPU forbids a dispatch to bind one
buffer both read-only and writable, whatever the ranges.

How: the blocks are first coloured, conflicting blocks apart, each block (the largest, or
the largest in size times lifetime, first) taking the colour whose peak (the most bytes
alive at one step) it raises least; then each colour's blocks are packed on their own, in
the manner of TFLite's "greedy by size" arena planner and XLA's heap simulator: largest
first, each at the tightest gap that fits among the blocks already placed whose lifetimes
overlap its own (else above them), in the buffer that grows least, else in a new one. A few
colour counts and both orders are tried and the smallest total kept (the first that reaches
the most bytes alive at one step, which no packing can beat): the colouring is what costs
memory (the most bytes alive at one step, summed over colours, can exceed that of all
blocks), and no one count or order is best for every graph.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil

TRIED_COLOURS = 6
"""How many colour counts are tried, from the fewest the capacity allows."""


@dataclass(frozen=True)
class Block:
    """`size` bytes alive from step `start` to step `end`, both included."""

    size: int
    start: int
    end: int


@dataclass(frozen=True)
class Packing:
    """The buffer (`heap`) and byte offset of each block, and each buffer's size."""

    heap: tuple[int, ...]
    offset: tuple[int, ...]
    sizes: tuple[int, ...]


def peak_alive(blocks: Sequence[Block]) -> int:
    """The most bytes of `blocks` alive at one step: what no packing can go below."""
    delta: dict[int, int] = {}
    for b in blocks:
        delta[b.start] = delta.get(b.start, 0) + b.size
        delta[b.end + 1] = delta.get(b.end + 1, 0) - b.size
    best = alive = 0
    for step in sorted(delta):
        alive += delta[step]
        best = max(best, alive)
    return best


def _best_offset(placed: Sequence[tuple[int, int, int, int]], block: Block, need: int,
                 capacity: int) -> tuple[int, int] | None:
    """(offset, bytes of the gap left unused, 0 above everything) for `block` (`need` bytes
    with its alignment padding) among the `placed` (offset, top, start, end) of a buffer,
    sorted by offset, or None when it fits nowhere below `capacity`."""
    best: tuple[int, int] | None = None
    low = 0
    for lo, hi, s, e in placed:
        if s > block.end or block.start > e:
            continue
        gap = lo - low
        if gap >= need and (best is None or gap - need < best[1]):
            best = (low, gap - need)
        low = max(low, hi)
    if best is not None:
        return best
    return (low, 0) if low + block.size <= capacity else None


def _greedy(blocks: Sequence[Block], which: Sequence[int], capacity: int, align: int,
            heap: list[int], offset: list[int], sizes: list[int]) -> None:
    """Pack blocks `which` (no two in conflict) into new buffers appended to `sizes`,
    largest first (see the module docstring), filling in their `heap` and `offset`."""
    first = len(sizes)
    placed: list[list[tuple[int, int, int, int]]] = []
    for k in sorted(which, key=lambda k: (-blocks[k].size, blocks[k].start, k)):
        block = blocks[k]
        need = -(-block.size // align) * align
        choice: tuple[int, int, int, int] | None = None  # (growth, waste, buffer, offset)
        for h, held in enumerate(placed):
            fit = _best_offset(held, block, need, capacity)
            if fit is not None:
                key = (max(0, fit[0] + block.size - sizes[first + h]), fit[1], h, fit[0])
                choice = key if choice is None or key < choice else choice
        if choice is None or choice[0] > block.size:  # a new buffer grows less
            placed.append([])
            sizes.append(0)
            choice = (block.size, 0, len(placed) - 1, 0)
        _, _, h, off = choice
        heap[k], offset[k] = first + h, off
        insort(placed[h], (off, off + need, block.start, block.end))
        sizes[first + h] = max(sizes[first + h], off + block.size)


def _colour(blocks: Sequence[Block], apart: Sequence[set[int]], colours: int,
            order: Sequence[int]) -> list[int]:
    """A colour for each block, none shared across a conflict, taken in `order`: the colour
    whose peak the block raises least (then the one with the fewest bytes alive over its
    lifetime), a new one while fewer than `colours` are used and every one would grow."""
    # The bytes alive only rise where a block starts: track them at those steps alone.
    starts = sorted({b.start for b in blocks})
    rank = {s: k for k, s in enumerate(starts)}
    spans = [(rank[b.start], bisect_right(starts, b.end)) for b in blocks]
    colour = [-1] * len(blocks)
    alive: list[list[int]] = []
    peak: list[int] = []
    for k in order:
        size, (lo, hi) = blocks[k].size, spans[k]
        banned = {colour[j] for j in apart[k]}
        best: tuple[int, int, int] | None = None
        for c, held in enumerate(alive):
            if c not in banned:
                top = max(held[lo:hi]) + size
                key = (max(top, peak[c]) - peak[c], top, c)
                best = key if best is None or key < best else best
        if best is None or (len(alive) < colours and best[0] > 0):
            alive.append([0] * len(starts))
            peak.append(0)
            best = (size, size, len(alive) - 1)
        c = best[2]
        colour[k] = c
        alive[c][lo:hi] = [v + size for v in alive[c][lo:hi]]
        peak[c] = max(peak[c], best[1])
    return colour


def _pack_coloured(blocks: Sequence[Block], colour: Sequence[int], capacity: int,
                   align: int) -> Packing:
    heap, offset = [-1] * len(blocks), [0] * len(blocks)
    sizes: list[int] = []
    for c in sorted(set(colour)):
        _greedy(blocks, [k for k, x in enumerate(colour) if x == c], capacity, align, heap,
                offset, sizes)
    return Packing(tuple(heap), tuple(offset), tuple(sizes))


def pack_blocks(blocks: Sequence[Block], conflicts: Sequence[tuple[int, int]], capacity: int,
                align: int = 256) -> Packing:
    """Place `blocks` (see the module docstring); `conflicts` are pairs of block indices that
    must land in different buffers. A buffer's size is the top of its highest block (blocks
    are padded to `align` only where another one lies above them)."""
    if not blocks:
        return Packing((), (), ())
    apart: list[set[int]] = [set() for _ in blocks]
    for a, b in conflicts:
        apart[a].add(b)
        apart[b].add(a)
    bound = peak_alive(blocks)
    least = max(1, ceil(bound / capacity))
    orders = (sorted(range(len(blocks)), key=lambda k: (-blocks[k].size, blocks[k].start, k)),
              sorted(range(len(blocks)), key=lambda k: (
                  -blocks[k].size * (blocks[k].end - blocks[k].start + 1), k)))
    best: Packing | None = None
    tried: set[tuple[int, ...]] = set()
    for colours in range(least, least + TRIED_COLOURS):
        for order in orders:
            colour = tuple(_colour(blocks, apart, colours, order))
            if colour in tried:
                continue
            tried.add(colour)
            packing = _pack_coloured(blocks, colour, capacity, align)
            if best is None or (sum(packing.sizes), len(packing.sizes)) < \
                    (sum(best.sizes), len(best.sizes)):
                best = packing
            if sum(best.sizes) == bound:  # none can do better
                return best
    assert best is not None
    return best


__all__ = ["Block", "Packing", "pack_blocks", "peak_alive"]
