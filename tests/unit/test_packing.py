"""The pool's packer: blocks alive at the same step never share bytes, offsets aligned,
buffers within capacity, conflicting blocks in different buffers; and how tight it packs."""

from __future__ import annotations

import itertools
import random

import pytest

from tensorgrad.packing import Block, pack_blocks, peak_alive


def check(blocks: list[Block], conflicts: list[tuple[int, int]], capacity: int, align: int
          ) -> int:
    """Assert every rule of a packing of `blocks`; return its total size."""
    p = pack_blocks(blocks, conflicts, capacity, align)
    for k, b in enumerate(blocks):
        assert p.offset[k] % align == 0
        assert p.offset[k] + b.size <= p.sizes[p.heap[k]] <= capacity
    for a, b in itertools.combinations(range(len(blocks)), 2):
        x, y = blocks[a], blocks[b]
        if p.heap[a] == p.heap[b] and x.start <= y.end and y.start <= x.end:
            assert p.offset[a] + x.size <= p.offset[b] or p.offset[b] + y.size <= p.offset[a]
    for a, b in conflicts:
        assert p.heap[a] != p.heap[b]
    total = sum(p.sizes)
    assert total >= peak_alive(blocks)
    return total


@pytest.mark.parametrize("seed", range(12))
def test_random_blocks_follow_every_rule(seed: int) -> None:
    rng = random.Random(seed)
    blocks = []
    for k in range(rng.randrange(1, 60)):
        start = rng.randrange(40)
        blocks.append(Block(4 * rng.randrange(1, 400), start, start + rng.randrange(12)))
    conflicts = [(a, b) for a, b in itertools.combinations(range(len(blocks)), 2)
                 if rng.random() < 0.05]
    check(blocks, conflicts, capacity=4096, align=256)


def test_a_chain_packs_as_tight_as_its_conflicts_allow() -> None:
    """f32 and f16 tensors of a chain, each read by the next, so in another buffer: 8192
    bytes, the least possible (a buffer holds the 4096-byte blocks 0, 3 and 7; blocks 1 and
    2 conflict with each other and with it), above the 6144 alive at one step."""
    sizes = [4096, 2048, 2048, 4096, 1024, 3072, 2048, 4096]
    blocks = [Block(s, k, k + 1) for k, s in enumerate(sizes)]
    conflicts = list(zip(range(len(sizes)), range(1, len(sizes))))
    assert check(blocks, conflicts, 1 << 20, 256) == 8192 and peak_alive(blocks) == 6144


def test_small_blocks_fill_a_dead_block_s_bytes() -> None:
    blocks = [Block(4096, 0, 1), Block(2048, 2, 3), Block(2048, 2, 3), Block(8, 1, 3)]
    p = pack_blocks(blocks, [(0, 3)], 1 << 20)
    assert p.heap[1] == p.heap[2] == p.heap[0] and {p.offset[1], p.offset[2]} == {0, 2048}
    assert sorted(p.sizes) == [8, 4096]


def test_no_blocks() -> None:
    assert pack_blocks([], [], 1024).sizes == ()
