"""Triangular operands: a matmul learns which triangle of an operand is exactly zero.

A causal softmax leaves the upper triangle of each [T, T] slice zero, and so does its
backward. The products that read them (`p @ v`, `pᵀ @ dO`, `dS @ k`, `dSᵀ @ q`) then add
zeros over half of their contraction. This pass follows each op's `zeros` rule in the op
table (which triangle of its last two axes is known to be zero, from its inputs'), and tags
every matmul whose logical operand has one with `zeros_a` / `zeros_b` ("above": zero where
column > row; "below": where column < row). The kernels (ops/linalg.py) then run each
tile's K loop over the band that can be nonzero: for `zeros_a="above"`, rows m0..m1 need
k <= m1 only. The result is the same: only exact zeros are skipped.

A matmul with a rank-2 rhs flattens the lhs's leading axes into rows, so its lhs is tagged
only when it is rank 2.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..ir import Graph
from ..ops import OPS
from ..ops.rules import flip_triangle

MATMULS = ("matmul", "matmul_batched")


def mark_zero_triangles(graph: Graph, protected: Iterable[int]) -> tuple[Graph, dict[int, int]]:
    """A copy of `graph` with matmuls tagged `zeros_a` / `zeros_b` where an operand has a
    known zero triangle; returns it and the (identity) map old id -> new id."""
    zeros: list[str | None] = []
    out = Graph()
    for node in graph.nodes:
        inputs = [graph[i] for i in node.inputs]
        rule = OPS[node.op].zeros if node.op in OPS else None
        zeros.append(rule(node, inputs, [zeros[i] for i in node.inputs]) if rule else None)
        attrs = dict(node.attrs)
        if node.op in MATMULS:
            za, zb = (zeros[i] for i in node.inputs)
            if node.op == "matmul" and len(inputs[0].shape) != 2:
                za = None
            if attrs.get("transpose_a"):
                za = flip_triangle(za)
            if attrs.get("transpose_b"):
                zb = flip_triangle(zb)
            for key, z in (("zeros_a", za), ("zeros_b", zb)):
                if z is not None:
                    attrs[key] = z
        out.add(node.op, node.inputs, attrs, node.shape, node.dtype, node.site)
    out.outputs = list(graph.outputs)
    out.captures = dict(graph.captures)
    return out, {n.id: n.id for n in graph.nodes}


__all__ = ["MATMULS", "mark_zero_triangles"]
