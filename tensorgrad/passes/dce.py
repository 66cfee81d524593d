"""Dead-code elimination: keep what the roots need, plus every named leaf."""

from __future__ import annotations

from collections.abc import Iterable

from ..ir import LEAF_OPS, Graph


def eliminate_dead_code(graph: Graph, roots: Iterable[int]) -> tuple[Graph, dict[int, int]]:
    """A dense copy of `graph` without nodes that no root (nor output, nor capture) needs.

    Named leaves (params, inputs, state) are always kept. Returns the new graph and the map
    old id -> new id."""
    live = [False] * len(graph.nodes)
    stack = [*roots, *graph.outputs, *graph.captures.values()]
    stack += [n.id for n in graph.nodes if n.op in LEAF_OPS]
    while stack:
        i = stack.pop()
        if live[i]:
            continue
        live[i] = True
        stack.extend(graph[i].inputs)
    out = Graph()
    remap: dict[int, int] = {}
    for n in graph.nodes:
        if live[n.id]:
            new = out.add(n.op, tuple(remap[i] for i in n.inputs), n.attrs, n.shape, n.dtype,
                          n.site)
            remap[n.id] = new.id
    out.outputs = [remap[i] for i in graph.outputs]
    out.captures = {k: remap[v] for k, v in graph.captures.items()}
    return out, remap
