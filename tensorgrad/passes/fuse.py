"""Elementwise fusion: inline chains of elementwise ops (and the reshapes between them) into
one kernel.

Groups grow backwards from a root (an elementwise op whose result someone needs), taking in
producers that are elementwise (their op has an `expr`), reshapes or permutes, while nothing outside
the graph needs them (outputs, captures, param gradients, writeback sources stay
materialised) and every other user of the producer is in the group too. A cheap producer (one
elementwise op on materialised inputs, such as a bias add) may also be recomputed inside a
group when it has users elsewhere; it then stays materialised for them, or vanishes when
every user recomputes it. Each group becomes one `fused` node whose kernel evaluates the
whole expression per output element: every node is evaluated at an index of its own shape,
derived from its consumer's by right-aligned broadcasting (unchanged through a reshape,
moved through a permute), and each external input is read at that index
(:mod:`tensorgrad.codegen.program`). Runs after autograd and the optimizer, so
`fused` needs no VJP.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..codegen.kernel import EmitContext, Kernel
from ..codegen.program import emit_program
from ..ir import LEAF_OPS, Attrs, DType, FusedProgram, Graph, Node, Shape
from ..ops.registry import GRAD_ERROR, OPS, define

MAX_GROUP_OPS = 64
MAX_INPUTS = 7  # storage bindings per kernel: 8 (WebGPU's default limit), one for the output


def _elementwise(node: Node) -> bool:
    return node.op not in LEAF_OPS and OPS[node.op].expr is not None


def _fusable(node: Node) -> bool:
    return _elementwise(node) or node.op in ("reshape", "permute")


def _cheap(graph: Graph, node: Node, users: list[int]) -> bool:
    """Worth recomputing in each group that reads it: one elementwise op on at most two
    inputs (which the group then reads), all of whose readers are elementwise, so that it
    can vanish. (One that a matmul or a reduction reads stays stored anyway: recomputing it
    would only keep its inputs alive.)"""
    return (_elementwise(node) and len(node.inputs) <= 2
            and all(_fusable(graph[u]) for u in users))


def _grow(graph: Graph, root: Node, users: list[list[int]], protected: set[int],
          max_inputs: int) -> tuple[list[int], list[int], set[int]]:
    """The members of root's group (topological order), its external inputs, and which
    members are recomputed copies (their node is needed elsewhere too)."""
    group, recomputed = {root.id}, set()
    changed = True
    while changed:
        changed = False
        frontier = sorted({i for m in group for i in graph[m].inputs} - group, reverse=True)
        for cand in frontier:
            node = graph[cand]
            if cand in protected or not _fusable(node) or len(group) >= MAX_GROUP_OPS:
                continue
            own = all(u in group for u in users[cand])
            if not own and not _cheap(graph, node, users[cand]):
                continue
            trial = group | {cand}
            if len(_externals(graph, trial)) > max_inputs:
                continue
            group = trial
            if not own:
                recomputed.add(cand)
            changed = True
    members = sorted(group)
    return members, _externals(graph, group), recomputed


def _externals(graph: Graph, group: set[int]) -> list[int]:
    return list(dict.fromkeys(i for m in sorted(group) for i in graph[m].inputs
                              if i not in group))


def fuse_elementwise(graph: Graph, protected: Iterable[int], max_inputs: int = MAX_INPUTS
                     ) -> tuple[Graph, dict[int, int]]:
    """A new graph with elementwise groups fused; returns it and the map old id -> new id
    for every surviving node (group roots map to their fused node)."""
    protected = set(protected) | set(graph.outputs) | set(graph.captures.values())
    users = graph.users()
    groups: dict[int, tuple[list[int], list[int]]] = {}  # root -> (members, externals)
    inlined: set[int] = set()  # nodes that live only inside groups

    for root in reversed(graph.nodes):
        if root.id in inlined or root.id in groups or not _elementwise(root):
            continue
        members, ext, recomputed = _grow(graph, root, users, protected, max_inputs)
        if len(members) == 1:
            continue
        groups[root.id] = (members, ext)
        inlined.update(m for m in members if m != root.id and m not in recomputed)

    # A node some group reads from outside (a recomputed node's inputs) or some kept node
    # reads must exist on its own: walking backwards, such a node is kept, and so are its
    # own inputs in turn.
    for node in reversed(graph.nodes):
        if node.id in inlined:
            continue
        reads = groups[node.id][1] if node.id in groups else node.inputs
        inlined.difference_update(reads)

    # A recomputed node survives only where some node still reads it.
    return merge_groups(graph, {root: members for root, (members, _) in groups.items()},
                        inlined, protected)


def group_program(graph: Graph, members: list[int]) -> tuple[FusedProgram, list[int]]:
    """The program of `members` (topological order, the result last; `fused` members are
    expanded into their own programs) and its external inputs (graph ids)."""
    nodes: list[Node] = []
    value: dict[int, int] = {}  # graph id -> local index of its value
    externals: list[int] = []

    def ref(i: int) -> int:
        if i in value:
            return value[i]
        if i not in externals:
            externals.append(i)
        return -(externals.index(i) + 1)

    def add(op: str, inputs: tuple[int, ...], like: Node) -> int:
        nodes.append(Node(len(nodes), op, inputs, like.attrs, like.shape, like.dtype))
        return len(nodes) - 1

    for m in members:
        node = graph[m]
        if node.op == "fused":
            inner: dict[int, int] = {}
            for pn in node.attrs["program"].nodes:
                inner[pn.id] = add(pn.op, tuple(inner[r] if r >= 0 else ref(node.inputs[-r - 1])
                                                for r in pn.inputs), pn)
            value[m] = inner[len(node.attrs["program"].nodes) - 1]
        else:
            value[m] = add(node.op, tuple(ref(i) for i in node.inputs), node)
    return FusedProgram(tuple(nodes)), externals


def merge_groups(graph: Graph, groups: Mapping[int, list[int]], absorbed: set[int],
                 protected: set[int]) -> tuple[Graph, dict[int, int]]:
    """The graph with each group (the member where it goes -> its members, topological
    order, the result last; usually the last member's place) made one `fused` node that
    stands for its last member; `absorbed` nodes go, and so does any other node that nothing
    reads any more. Returns it and the map old id -> new id."""
    out = Graph()
    remap: dict[int, int] = {}
    for node in graph.nodes:
        if node.id in groups:
            program, externals = group_program(graph, groups[node.id])
            last = graph[groups[node.id][-1]]
            remap[last.id] = out.add("fused", tuple(remap[i] for i in externals),
                                     {"program": program}, last.shape, last.dtype,
                                     last.site).id
        elif node.id not in absorbed:
            remap[node.id] = out.add(node.op, tuple(remap[i] for i in node.inputs),
                                     node.attrs, node.shape, node.dtype, node.site).id
    out.outputs = [remap[i] for i in graph.outputs]
    out.captures = {k: remap[v] for k, v in graph.captures.items()}
    return drop_unread(out, remap, protected)


def drop_unread(out: Graph, remap: dict[int, int], protected: set[int]
                 ) -> tuple[Graph, dict[int, int]]:
    """The graph without the non-leaf nodes that nothing (alive) reads or keeps."""
    keep = {remap[i] for i in protected if i in remap} | set(out.outputs) | \
        set(out.captures.values())
    live = [False] * len(out.nodes)
    for n in reversed(out.nodes):  # readers come after what they read
        live[n.id] = live[n.id] or n.op in LEAF_OPS or n.id in keep
        if live[n.id]:
            for i in n.inputs:
                live[i] = True
    dead = {n.id for n in out.nodes if not live[n.id]}
    if not dead:
        return out, remap
    final = Graph()
    renum: dict[int, int] = {}
    for n in out.nodes:
        if n.id in dead:
            continue
        renum[n.id] = final.add(n.op, tuple(renum[i] for i in n.inputs), n.attrs, n.shape,
                                n.dtype, n.site).id
    final.outputs = [renum[i] for i in out.outputs]
    final.captures = {k: renum[v] for k, v in out.captures.items()}
    return final, {old: renum[new] for old, new in remap.items() if new in renum}


# ---- the `fused` op ---------------------------------------------------------------------

def _infer_fused(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    last = attrs["program"].nodes[-1]
    return last.shape, last.dtype


def _ref_fused(args: Sequence[Any], node: Node) -> Any:
    """Each inlined node's reference, its value cast as the unfused graph would hold it (the
    float type of the inputs for f32, float16 for f16), so that fusion changes no bit of the
    result."""
    import numpy as np

    floats = [np.asarray(a).dtype for a in args if np.asarray(a).dtype.kind == "f"
              and np.asarray(a).dtype != np.float16]
    compute = floats[0] if floats else np.float32
    types = {"f32": compute, "i32": np.int32, "bool": np.bool_, "f16": np.float16}
    values: list[Any] = []
    for n in node.attrs["program"].nodes:
        operands = [args[-r - 1] if r < 0 else values[r] for r in n.inputs]
        operands = [o.astype(compute) if isinstance(o, np.ndarray) and o.dtype == np.float16
                    else o for o in operands]  # f16 values are computed with as f32
        values.append(np.asarray(OPS[n.op].ref(operands, n)).astype(types[n.dtype],
                                                                    copy=False))
    return values[-1]


def _emit_fused(ctx: EmitContext) -> Kernel:
    return emit_program(ctx, ctx.node.attrs["program"], OPS)


define("fused", infer=_infer_fused, ref=_ref_fused, vjp=GRAD_ERROR, emit=_emit_fused,
       doc="several elementwise ops evaluated in one kernel (made by the fusion pass)")
