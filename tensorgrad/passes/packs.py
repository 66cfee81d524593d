"""Arena members that the buffer plan cannot place get a copy of their own.

A `pack` runs no kernel: the plan places each input in the pack's buffer. That fails for an
input placed twice (two params with one gradient node), an input or a state (their buffers
are the host's), and an input computed from another one (its kernel would read and write the
arena in one dispatch). Such an input is packed through a `copy` node instead: one small
kernel, and the pack stays without one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..ir import Graph


def _copied(graph: Graph) -> set[tuple[int, int]]:
    """(pack id, input slot) of each pack input to copy: every occurrence of an input packed
    more than once, inputs and states, then each remaining member whose node reads another
    remaining member of its pack (through reshapes, which read their input's buffer)."""
    packs = [n for n in graph.nodes if n.op == "pack" and graph[n.inputs[0]].op != "param"]
    count = Counter(x for n in packs for x in n.inputs)
    copied = {(n.id, k) for n in packs for k, x in enumerate(n.inputs)
              if count[x] > 1 or graph[x].op in ("input", "state")}
    for n in packs:
        members = {x for k, x in enumerate(n.inputs) if (n.id, k) not in copied}
        for k, x in enumerate(n.inputs):
            if (n.id, k) in copied:
                continue
            frontier = list(graph[x].inputs)
            while frontier:
                i = frontier.pop()
                if i in members:
                    copied.add((n.id, k))
                    break
                if graph[i].op == "reshape":
                    frontier.extend(graph[i].inputs)
    return copied


def separate_pack_members(graph: Graph, protected: Iterable[int]
                          ) -> tuple[Graph, dict[int, int]]:
    """A new graph where every pack input can be placed; returns it and the map old id ->
    new id."""
    copied = _copied(graph)
    if not copied:
        return graph, {n.id: n.id for n in graph.nodes}
    out = Graph()
    remap: dict[int, int] = {}
    for node in graph.nodes:
        inputs = [remap[i] for i in node.inputs]
        for k, x in enumerate(node.inputs):
            if (node.id, k) in copied:
                src = graph[x]
                inputs[k] = out.add("copy", (remap[x],), {}, src.shape, src.dtype, src.site).id
        remap[node.id] = out.add(node.op, tuple(inputs), node.attrs, node.shape, node.dtype,
                                 node.site).id
    out.outputs = [remap[i] for i in graph.outputs]
    out.captures = {k: remap[v] for k, v in graph.captures.items()}
    return out, remap
