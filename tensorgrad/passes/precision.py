"""Mixed precision: store the activations of a step as f16 (``precision="mixed"``).

Runs right after autograd, on the forward and backward graph, before the optimizer is
appended (so params, their gradients and the optimizer's state and updates stay f32). It
decides only how each node's result is *stored*: an f32 node becomes f16 (2 bytes an element)
unless

* it must stay as it is: a root (the loss, the param gradients, the forward's output, a
  capture, a writeback source), a leaf (params are the f32 masters; inputs arrive as f32), a
  scalar, or a node of another dtype (i32, bool);
* its op keeps f32 (:data:`F32_OPS`): sums and means (their results are few and gather the
  range of many values) and `exp` (f16 overflows past e^11), as the f32 list of PyTorch's
  autocast keeps them; a constant that f16 cannot hold (``|value| > 65504``) stays f32 too;
* it is a view (a reshape, a contiguous slice) of an f32 tensor: a view reads its input's
  bytes as they are, so it keeps its input's dtype;
* it adds up a param's gradient (:func:`gradient_chain`): the matmul or scatter that makes a
  param's gradient, and the additions and layout ops between it and the gradient, stay f32, so
  a gradient's partial sums never overflow f16 (the loss scale makes them large).

Every kernel still computes in f32: it reads f16 values into f32s, accumulates in f32 (a
matmul's f16 operands give an f32 sum) and rounds what it stores to f16
(:mod:`tensorgrad.codegen.storage`); the reference interpreter does the same. So the matmuls
read f16 activations and f32 master weights (WGSL has no f16 matrix units: a weight copy in
f16 would only cost memory and a kernel).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..ir import LEAF_OPS, Graph, Node
from ..ops.registry import OPS

F32_OPS = frozenset({"sum_to_shape", "sum_partials", "sum_last", "mean_last", "exp"})
"""Ops whose results stay f32 under mixed precision (reductions, and exp)."""
# Ops through which a param's gradient is still being added up: their inputs stay f32 when
# nothing else reads them (`mul`: the unscaling by the loss scale).
_CHAIN_OPS = frozenset({"add", "mul", "mul_scalar", "reshape", "permute", "copy"})
F16_MAX = 65504.0


def gradient_chain(graph: Graph, roots: Iterable[int]) -> set[int]:
    """The nodes that add up a root's value: the roots, and walking back from them through
    additions, scalings and layout ops (:data:`_CHAIN_OPS`), each input that nothing but
    such nodes reads; the walk stops at the first other op (a matmul, a scatter), which is
    in the chain itself."""
    users = graph.users()
    chain = set(roots)
    for node in reversed(graph.nodes):
        if node.id not in chain or node.op not in _CHAIN_OPS:
            continue
        for i in node.inputs:
            if graph[i].op not in LEAF_OPS and all(u in chain for u in users[i]):
                chain.add(i)
    return chain


def _keeps_f32(node: Node, kept: set[int]) -> bool:
    if node.dtype != "f32" or node.op in LEAF_OPS or node.id in kept or node.size <= 1:
        return True
    if node.op in F32_OPS:
        return True
    value = node.attrs.get("value") if node.op == "full" else None
    return isinstance(value, (int, float)) and not abs(value) <= F16_MAX


def store_half(graph: Graph, roots: Iterable[int]) -> tuple[Graph, dict[int, int]]:
    """The graph with every activation that may be stored as f16 made f16 (see the module
    docstring); node ids are unchanged."""
    kept = gradient_chain(graph, set(roots) | set(graph.outputs) | set(graph.captures.values()))
    out = Graph(outputs=list(graph.outputs), captures=dict(graph.captures))
    for n in graph.nodes:
        half = not _keeps_f32(n, kept)
        if half and OPS[n.op].view is not None:  # a view reads its input's bytes as they are
            half = out.nodes[n.inputs[0]].dtype == "f16"
        out.nodes.append(replace(n, dtype="f16") if half else n)
    return out, {n.id: n.id for n in graph.nodes}


__all__ = ["F16_MAX", "F32_OPS", "gradient_chain", "store_half"]
