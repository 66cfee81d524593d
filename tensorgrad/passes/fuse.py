"""Elementwise fusion: inline chains of elementwise ops into one kernel.

A node is inlined into its consumer when both are elementwise (their op has an `expr`), the
node has exactly one use and nothing outside the graph reads it (outputs, captures, param
gradients, writeback sources stay materialised). Each group becomes one `fused` node whose
kernel evaluates the whole expression tree per output element. Right-aligned broadcasting
composes, so every external input of a group is read with one broadcast index relative to
the group's output shape. Runs after autograd and the optimizer, so `fused` needs no VJP.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..ir import LEAF_OPS, Graph, Node, Shape
from ..ops.registry import GRAD_ERROR, OPS, define

MAX_GROUP_OPS = 64
_OPERAND = re.compile(r"\ba(\d+)\b")


@dataclass(frozen=True)
class FusedProgram:
    """The inlined nodes of one group in evaluation order. A local node's inputs are local
    indices (>= 0) or external inputs encoded as -(k + 1) for input k of the fused node."""

    nodes: tuple[Node, ...]

    def __repr__(self) -> str:
        def show(ref: int) -> str:
            return f"x{-ref - 1}" if ref < 0 else show_node(self.nodes[ref])

        def show_node(n: Node) -> str:
            return f"{n.op}({', '.join(show(r) for r in n.inputs)})"
        return show_node(self.nodes[-1])


def _fusable(node: Node) -> bool:
    return node.op not in LEAF_OPS and OPS[node.op].expr is not None


def fuse_elementwise(graph: Graph, protected: Iterable[int], max_inputs: int = 7
                     ) -> tuple[Graph, dict[int, int]]:
    """A new graph with elementwise groups fused; returns it and the map old id -> new id
    for every surviving node (group roots map to their fused node)."""
    protected = set(protected) | set(graph.outputs) | set(graph.captures.values())
    users = graph.users()
    group_of: dict[int, int] = {}          # member id -> root id
    members: dict[int, list[int]] = {}     # root id -> member ids (topological order)
    externals: dict[int, list[int]] = {}   # root id -> external input ids

    for root in reversed(graph.nodes):
        if root.id in group_of or not _fusable(root):
            continue
        group, ext = [root.id], list(dict.fromkeys(root.inputs))
        stack = list(root.inputs)
        while stack:
            cand = stack.pop()
            node = graph[cand]
            if (cand in group_of or cand in group or cand in protected or not _fusable(node)
                    or len(users[cand]) != 1 or len(group) >= MAX_GROUP_OPS):
                continue
            new_ext = [i for i in ext if i != cand]
            new_ext += [i for i in dict.fromkeys(node.inputs) if i not in new_ext]
            if len(new_ext) > max_inputs:
                continue
            group.append(cand)
            ext = new_ext
            stack.extend(node.inputs)
        for m in group:
            group_of[m] = root.id
        members[root.id] = sorted(group)
        externals[root.id] = ext

    out = Graph()
    remap: dict[int, int] = {}
    for node in graph.nodes:
        root = group_of.get(node.id)
        if root is not None and root != node.id:
            continue  # inlined into its group's root
        if root is None or len(members[root]) == 1:
            new = out.add(node.op, tuple(remap[i] for i in node.inputs), node.attrs,
                          node.shape, node.dtype, node.site)
        else:
            ext = externals[root]
            local = {m: k for k, m in enumerate(members[root])}
            program = FusedProgram(tuple(
                Node(local[m], graph[m].op,
                     tuple(local[i] if i in local else -(ext.index(i) + 1)
                           for i in graph[m].inputs),
                     graph[m].attrs, graph[m].shape, graph[m].dtype)
                for m in members[root]))
            new = out.add("fused", tuple(remap[i] for i in ext), {"program": program},
                          node.shape, node.dtype, node.site)
        remap[node.id] = new.id
    out.outputs = [remap[i] for i in graph.outputs]
    out.captures = {k: remap[v] for k, v in graph.captures.items()}
    return out, remap


# ---- the `fused` op ---------------------------------------------------------------------

def _infer_fused(inputs: Sequence[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    last = attrs["program"].nodes[-1]
    return last.shape, last.dtype


def _ref_fused(args: Sequence[Any], node: Node) -> Any:
    values: list[Any] = []
    for n in node.attrs["program"].nodes:
        operands = [args[-r - 1] if r < 0 else values[r] for r in n.inputs]
        values.append(OPS[n.op].ref(operands, n))
    return values[-1]


def _emit_fused(ctx: EmitContext) -> Kernel:
    program: FusedProgram = ctx.node.attrs["program"]
    lines = [f"  let x{k} = in{k}[{w.broadcast_index(ctx.node.shape, n.shape)}];"
             for k, n in enumerate(ctx.inputs)]
    preludes: list[str] = []
    for n in program.nodes:
        op = OPS[n.op]
        names = [f"x{-r - 1}" if r < 0 else f"v{r}" for r in n.inputs]
        expr = _OPERAND.sub(lambda m, names=names: names[int(m.group(1))],
                            op.expr(n))  # type: ignore[misc]
        lines.append(f"  let v{n.id} = {expr};")
        if op.prelude and op.prelude not in preludes:
            preludes.append(op.prelude)
    lines.append(f"  out[i] = v{program.nodes[-1].id};")
    return w.thread_kernel(ctx, "\n".join(lines), prelude="\n".join(preludes))


define("fused", infer=_infer_fused, ref=_ref_fused, vjp=GRAD_ERROR, emit=_emit_fused,
       doc="several elementwise ops evaluated in one kernel (made by the fusion pass)")
