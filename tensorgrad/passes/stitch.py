"""Stitching: merge elementwise work into the kernels of matmuls and reductions.

Runs after elementwise fusion. For each node whose op allows it (its op-table entry has a
:class:`~tensorgrad.ops.registry.Stitch`), two rewrites, both generic over the op table:

* prologue: an input computed by elementwise/layout nodes (a `fused` group, a lone
  elementwise op, permutes and reshapes) that nothing else reads is evaluated inside the
  kernel at each read, instead of being stored by a kernel of its own;
* epilogue: when the only reader of the node's result is an elementwise node (or group) that
  reads it at its own output index, that node is applied to each value as the kernel writes
  it (a bias add and relu after a matmul, the scale after a sum).

The merged nodes become one `fused` node whose program holds the core op between its
prologues and its epilogue (:class:`tensorgrad.ir.FusedProgram`); the reference evaluates it
node by node, so the values are those of the unstitched graph.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..codegen.program import LAYOUT_OPS, count_arithmetic, is_core, program_reads
from ..ir import LEAF_OPS, FusedProgram, Graph, Node
from ..ops.registry import OPS
from .fuse import MAX_INPUTS, group_program, merge_groups


def _inlinable(node: Node) -> bool:
    """Elementwise or layout work that a program can hold."""
    if node.op in LEAF_OPS:
        return False
    if node.op == "fused":
        return node.attrs["program"].core(_is_core) is None
    return node.op in LAYOUT_OPS or OPS[node.op].expr is not None


def _is_core(node: Node) -> bool:
    return is_core(node, OPS)


def _arithmetic(node: Node) -> int:
    if node.op == "fused":
        return count_arithmetic(node.attrs["program"])
    return 0 if node.op in (*LAYOUT_OPS, "broadcast_to") else 1


def _permutes(node: Node) -> bool:
    """Whether `node` is or holds a permute."""
    if node.op == "fused":
        return any(n.op == "permute" for n in node.attrs["program"].nodes)
    return node.op == "permute"


def _prologue(graph: Graph, core: Node, slot: int, users: list[list[int]],
              blocked: set[int], max_ops: int | None, permutes: bool = True
              ) -> tuple[set[int], set[int]]:
    """The nodes that compute input `slot` of `core` and can move into its kernel, and which
    of them are copies (both empty: none). A node moves when only the core (once) or other
    moving nodes read it. Layout nodes (permutes, reshapes) are copied as well when others
    read them: they cost nothing to recompute, and stay only for readers that still need
    them (so the permutes of q, k and v go into each attention matmul that reads them).
    `permutes`: False keeps every node that is or holds a permute out."""
    start = core.inputs[slot]
    if core.inputs.count(start) != 1:
        return set(), set()
    group: set[int] = set()
    copied: set[int] = set()
    ops = 0
    frontier = [(start, False)]
    while frontier:
        i, below_copy = frontier.pop()
        node = graph[i]
        if i in group or i in blocked or not _inlinable(node) or \
                not permutes and _permutes(node):
            continue
        owned = all(u in group and u not in copied or (u == core.id and i == start)
                    for u in users[i])
        copy = below_copy or not owned
        if copy and node.op not in LAYOUT_OPS:
            continue
        if max_ops is not None and ops + _arithmetic(node) > max_ops:
            continue
        group.add(i)
        if copy:
            copied.add(i)
        ops += _arithmetic(node)
        frontier.extend((j, copy) for j in node.inputs)
    # Layout alone is worth moving only when it saves a kernel: a permute does, a reshape
    # (a view) does not.
    if all(graph[i].op == "reshape" for i in group):
        return set(), set()
    return group, copied


def _epilogue(graph: Graph, core: Node, users: list[list[int]], blocked: set[int]
              ) -> int | None:
    """The consumer that can be applied as `core`'s result is written, or None."""
    readers = set(users[core.id])
    if len(readers) != 1:
        return None
    consumer = graph[readers.pop()]
    if consumer.id in blocked or not _inlinable(consumer) or consumer.op in LAYOUT_OPS:
        return None
    if consumer.size != core.size:
        return None
    if consumer.op == "fused":
        program = consumer.attrs["program"]
    else:
        program = FusedProgram((Node(0, consumer.op, tuple(-(k + 1) for k in
                                                            range(len(consumer.inputs))),
                                     consumer.attrs, consumer.shape, consumer.dtype),))
    reads = program_reads(program, lambda k: graph[consumer.inputs[k]].shape)
    at = [k for k, i in enumerate(consumer.inputs) if i == core.id]
    if not all(reads.get(k) == {True} for k in at):
        return None
    return consumer.id


def _place(members: list[int], core: int, externals: list[int]) -> int:
    """Where a stitched kernel goes: at its core, unless an input of its epilogue is made
    later (then at the first member after it). An epilogue has the core's size, so running
    it with the core ends its inputs' lives sooner and no value lives longer than unmerged
    (mixed precision's gradients, unscaled by a late multiply, would otherwise hold their
    split-K partials to the end of the backward)."""
    after = max(externals, default=-1)
    return next(m for m in members if m >= core and m > after)


def stitch_kernels(graph: Graph, protected: Iterable[int], max_inputs: int = MAX_INPUTS,
                   software: bool = False) -> tuple[Graph, dict[int, int]]:
    """A new graph with prologues and epilogues merged into the kernels that allow them;
    returns it and the map old id -> new id of every surviving node. `software`: for a
    CPU-emulated GPU (no permutes into the kernels whose Stitch refuses them there)."""
    protected = set(protected) | set(graph.outputs) | set(graph.captures.values())
    users = graph.users()
    taken: set[int] = set()  # nodes that live on only inside a merged node
    merges: dict[int, list[int]] = {}  # the last member (where the merged node goes) -> members
    for core in graph.nodes:
        stitch = None if core.op in LEAF_OPS else OPS[core.op].stitch
        if stitch is None:
            continue
        members, copies = {core.id}, set()
        for slot in stitch.prologue:
            if slot < len(core.inputs):
                group, copied = _prologue(graph, core, slot, users, protected | taken,
                                          stitch.prologue_ops,
                                          stitch.software_permutes or not software)
                members |= group
                copies |= copied
        if stitch.epilogue and core.id not in protected:
            consumer = _epilogue(graph, core, users, taken)
            if consumer is not None:
                members.add(consumer)
        if len(members) == 1:
            continue
        ordered = sorted(members)
        externals = group_program(graph, ordered)[1]
        if len(externals) > max_inputs:
            continue  # over the binding limit: leave this one unstitched
        taken |= members - copies
        merges[_place(ordered, core.id, externals)] = ordered

    return merge_groups(graph, merges, taken, protected)  # (copies stay while read)
