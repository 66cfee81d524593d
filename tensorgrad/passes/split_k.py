"""Split-K: a weight-gradient matmul with a long contraction becomes S partial matmuls and a sum.

`Xᵀ @ dY` contracts the rows of a batch (K = B·T, thousands) into a small [M, N] result: one
output tile per workgroup leaves a large GPU mostly idle while each workgroup walks all of K.
Both operands are stored [K, M] and [K, N] (the `transpose_a` form the backward emits), so
splitting K into S chunks is a free view, `[S, K/S, M]`, and the rewrite is

    matmul(a, b, transpose_a=True)  ->  sum_to_shape(matmul_batched(a', b', transpose_a=True))

with S times more workgroups, each doing 1/S of the work, and one reduction of S partials per
output. Two reasons to split: a big product (at least :data:`MIN_WORK` multiply-adds) is cut
into chunks of :data:`CHUNK` rows; a small output (fewer than :data:`FILL_TILES` 64x64 tiles,
e.g. an LM head's [D, vocab] or a narrow model's [D, 4D] gradient) is split until it has
that many, down to chunks of :data:`MIN_CHUNK` rows; a big product whose partials have
fewer than :data:`BIG_TILES` 128x128 tiles (the largest tiling's) is split into chunks of at
least :data:`CHUNK` rows until they have them, when K is at least twice M and N. Products
under :data:`MIN_FILL_WORK` multiply-adds are left alone: a second kernel costs more than
they gain.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..ir import Graph

MIN_WORK = 1 << 28     # multiply-adds (a 256 x 1024 weight gradient over 1,024 rows)
CHUNK = 512            # rows of K per partial product, at least
MAX_SPLITS = 16
FILL_TILES = 128       # 64x64 output tiles that keep a large GPU busy
MIN_FILL_WORK = 1 << 22
MIN_CHUNK = 128
BIG_TILES = 768        # 128x128 output tiles the largest matmul tiling wants (linalg.py)


def splits_for(m: int, k: int, n: int) -> int:
    """How many chunks to split K into (1: leave the matmul as it is)."""
    def halvings(until: int, chunk: int) -> int:
        s = 1
        while s < until and s * 2 <= MAX_SPLITS and k % (s * 2) == 0 and \
                k // (s * 2) >= chunk:
            s *= 2
        return s

    # A big product whose output has too few 128x128 tiles for the largest matmul tiling
    # is split until the partials have enough: GPT-2's [768, 3072] MLP gradients over 8,192
    # rows (144 tiles) ran 24.5 TFLOP/s whole, 28.4 / 33.8 / 36.9 split 2 / 4 / 8 ways
    # (H100, 2026-12-06; its step 218.7 -> 211.6 ms from 2 to 8; 16 ways, BIG_TILES 1536,
    # gave the step back 1.3 ms).
    big_tiles = -(-m // 128) * -(-n // 128)
    by_big = halvings(-(-BIG_TILES // big_tiles), CHUNK) \
        if m * n * k >= MIN_WORK and big_tiles < BIG_TILES and k >= 2 * max(m, n) else 1
    if k < 4 * max(m, n):
        return by_big
    by_work = halvings(MAX_SPLITS, CHUNK) if m * n * k >= MIN_WORK else 1
    tiles = -(-m // 64) * -(-n // 64)
    by_fill = halvings(-(-FILL_TILES // tiles), MIN_CHUNK) \
        if m * n * k >= MIN_FILL_WORK and tiles < FILL_TILES else 1
    return max(by_work, by_fill, by_big)


def split_long_contractions(graph: Graph, protected: Iterable[int]
                            ) -> tuple[Graph, dict[int, int]]:
    """A new graph with long-K `Xᵀ @ dY` matmuls split; returns it and the map old id ->
    new id (a split matmul maps to its sum)."""
    out = Graph()
    remap: dict[int, int] = {}
    for node in graph.nodes:
        inputs = tuple(remap[i] for i in node.inputs)
        s = 1
        if node.op == "matmul" and node.attrs.get("transpose_a") and \
                not node.attrs.get("transpose_b"):
            a, b = graph[node.inputs[0]], graph[node.inputs[1]]
            (k, m), n = a.shape, b.shape[1]
            s = splits_for(m, k, n)
        if s == 1:
            remap[node.id] = out.add(node.op, inputs, node.attrs, node.shape, node.dtype,
                                     node.site).id
            continue
        # the operands keep their dtypes (f16 under mixed precision), the partials are f32
        a3 = out.add("reshape", (inputs[0],), {"shape": (s, k // s, m)}, (s, k // s, m),
                     a.dtype, node.site)
        b3 = out.add("reshape", (inputs[1],), {"shape": (s, k // s, n)}, (s, k // s, n),
                     b.dtype, node.site)
        parts = out.add("matmul_batched", (a3.id, b3.id),
                        {"transpose_a": True, "transpose_b": False}, (s, m, n), "f32",
                        node.site)
        remap[node.id] = out.add("sum_to_shape", (parts.id,), {"shape": (m, n)}, (m, n),
                                 node.dtype, node.site).id
    out.outputs = [remap[i] for i in graph.outputs]
    out.captures = {k: remap[v] for k, v in graph.captures.items()}
    return out, remap
