"""Split column sums: a long sum over leading axes becomes P partial sums and a short sum.

A bias or norm-weight gradient sums dY [R, N] over its R = B·T rows into [N]. One thread
per output walks a column and reads coalesced (neighbouring threads, neighbouring columns),
but N = 768 threads leave a large GPU idle; one workgroup per output (what the reduction
kernel picks for few, long outputs) keeps it busy but reads each column with a stride of N
floats, so a warp touches 32 memory sectors for 32 values. Summing P chunks of R/P rows
first needs no copy (`sum_partials` reads x as it is), and the rewrite is

    sum_to_shape(x [R..., N...], N...)  ->  sum_to_shape(sum_partials(x) [P, N], N...)

whose first stage has P·N coalesced threads (at least :data:`FILL_THREADS` where the rows
allow, each summing R/P rows) and whose second sums at most :data:`MAX_PARTS` partials per output (one read per
invocation of a workgroup). Sums under :data:`MIN_ELEMENTS` inputs are left alone: a second
kernel costs more than they gain (splitting the GPT's [4096, 256] sums as well was measured
no faster on an H200). Like split-K it only adds parallelism, so it is off on CPU
rasterisers. On an H200, GPT-2's 122 split sums and the 73 left whole took 5.9 ms of a step,
against 8.5 ms unsplit (same call).
"""

from __future__ import annotations

from collections.abc import Iterable
from math import prod

from ..ir import Graph, Node
from ..ops.broadcast import reduced_axes

MIN_ELEMENTS = 1 << 21   # summed values (8 MB): a [2048, 1024] bias gradient
FILL_THREADS = 1 << 17   # first-stage threads that keep a large GPU busy
MAX_PARTS = 256          # partials per output: one per invocation of the second stage
MIN_ROWS = 16            # rows per partial, at least


def column_split(src: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(rows R, columns N, parts P) when summing `src` down to `target` reduces a leading
    block of axes only and is worth splitting into P partial sums; None otherwise."""
    reduced = [k for k in reduced_axes(src, target) if src[k] != 1]
    if not reduced:
        return None
    lead = max(reduced) + 1
    if any(src[k] != 1 and k not in reduced for k in range(lead)):
        return None  # a kept axis before a reduced one: not a column sum
    rows, cols = prod(src[:lead]), prod(src[lead:])
    if rows * cols < MIN_ELEMENTS or cols >= FILL_THREADS:
        return None
    parts = 1
    while parts < MAX_PARTS and parts * cols < FILL_THREADS and rows % (parts * 2) == 0 \
            and rows // (parts * 2) >= MIN_ROWS:
        parts *= 2
    return (rows, cols, parts) if parts > 1 else None


def split_column_sums(graph: Graph, protected: Iterable[int]) -> tuple[Graph, dict[int, int]]:
    """A new graph with long column sums split in two stages; returns it and the map old id
    -> new id (a split sum maps to its second stage)."""
    out = Graph()
    remap: dict[int, int] = {}
    for node in graph.nodes:
        inputs = tuple(remap[i] for i in node.inputs)
        split = None
        if node.op == "sum_to_shape":
            split = column_split(graph[node.inputs[0]].shape, node.shape)
        if split is None:
            remap[node.id] = out.add(node.op, inputs, node.attrs, node.shape, node.dtype,
                                     node.site).id
            continue
        remap[node.id] = _two_stages(out, node, inputs[0], *split).id
    out.outputs = [remap[i] for i in graph.outputs]
    out.captures = {k: remap[v] for k, v in graph.captures.items()}
    return out, remap


def _two_stages(out: Graph, node: Node, x: int, rows: int, cols: int, parts: int) -> Node:
    # x is read as it is (no reshape in between), so fusion groups its producers as before
    partial = out.add("sum_partials", (x,), {"rows": rows, "parts": parts}, (parts, cols),
                      node.dtype, node.site)
    total = out.add("sum_to_shape", (partial.id,), {"shape": (cols,)}, (cols,), node.dtype,
                    node.site)
    if node.shape == (cols,):
        return total
    return out.add("reshape", (total.id,), {"shape": node.shape}, node.shape, node.dtype,
                   node.site)
