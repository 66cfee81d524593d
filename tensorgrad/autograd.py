"""Reverse-mode autograd over the IR: appends the backward graph using each op's VJP rule.

A rule may give an input's gradient at the broadcast shape of the op's output (``add``,
``mul``, ``where`` and the other broadcasting ops do): the engine sums it back to that
input's shape, once, here (:func:`backward`), so no rule unbroadcasts by itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from .errors import ShapeError
from .ir import LEAF_OPS, Graph, Node, Shape
from .ops.broadcast import sum_to_shape
from .ops.registry import GRAD_ERROR, NO_GRAD, OPS
from .tensor import Tensor, tracing


def _sums_to(src: Shape, target: Shape) -> bool:
    """Whether `src` is a broadcast of `target` (right-aligned, each dim of `target` 1 or
    equal), so that summing the axes broadcasting added gives `target`."""
    off = len(src) - len(target)
    return off >= 0 and all(d in (1, src[k + off]) for k, d in enumerate(target))


def _input_grad(node: Node, x: Node, g: Tensor) -> Tensor:
    """`g`, the gradient `node`'s rule gave for its input `x`, at `x`'s shape."""
    if g.shape == x.shape:
        return g
    if not _sums_to(g.shape, x.shape):
        raise AssertionError(f"vjp of {node.op} gave shape {g.shape} for input of shape "
                             f"{x.shape}")
    return sum_to_shape(g, x.shape)


def backward(graph: Graph, seeds: Mapping[int, Tensor]) -> dict[int, Tensor]:
    """Append the backward of `graph` from the cotangents `seeds` ({node id: Tensor}) with
    each op's VJP rule, inside the caller's trace of `graph`; {leaf id: its cotangent} of
    every leaf a gradient reached.

    Each f32 input's gradient is summed back to the input's shape where the rule gave it at
    a broadcast shape; `stop_gradient`, non-differentiable ops and non-f32 paths contribute
    nothing; an op that cannot be differentiated (``GRAD_ERROR``) raises ShapeError."""
    from .ops import add

    cot = dict(seeds)
    for node in reversed(list(graph.nodes)):
        dy = cot.pop(node.id, None)
        if dy is None or node.op in LEAF_OPS:
            if dy is not None:
                cot[node.id] = dy  # keep leaf cotangents: they are the gradients
            continue
        rule = OPS[node.op].vjp
        if isinstance(rule, str):  # NO_GRAD contributes nothing, GRAD_ERROR refuses
            if rule == GRAD_ERROR:
                raise ShapeError(node.op, "cannot differentiate through this op (it is a "
                                 "backward or optimizer op)", site=node.site)
            assert rule == NO_GRAD, rule
            continue
        inputs = [Tensor(graph, i) for i in node.inputs]
        grads = rule(inputs, Tensor(graph, node.id), dy, node.attrs)
        for i, g in zip(node.inputs, grads):
            if g is None or graph[i].dtype != "f32":
                continue
            g = _input_grad(node, graph[i], g)
            cot[i] = g if i not in cot else add(cot[i], g)
    return cot


def append_grad(graph: Graph, loss: int, frozen: Collection[str] = ()) -> dict[str, int]:
    """Append nodes computing d(loss)/d(param) for every f32 param of `graph` but those named
    in `frozen` (`Module.freeze`: they get no gradient, so the optimizer leaves them alone and
    dead-code elimination drops the backward nodes only they would read).

    Returns {param name: gradient node id}. A param with no path to the loss gets a zero
    gradient. `stop_gradient`, non-differentiable ops and non-f32 paths contribute nothing."""
    from . import ops

    unknown = sorted(set(frozen) - set(graph.params))
    if unknown:
        raise ValueError(f"append_grad: frozen names {unknown} are not params of the graph "
                         f"(params: {list(graph.params)})")

    loss_node = graph[loss]
    if loss_node.shape != ():
        raise ShapeError("loss", f"the loss function must return a scalar (0-d) tensor, got "
                         f"{loss_node.dtype}{list(loss_node.shape)}; reduce it with tg.mean or "
                         "tg.sum", site=loss_node.site)
    if loss_node.dtype != "f32":
        raise ShapeError("loss", f"the loss must be f32, got {loss_node.dtype}"
                         f"{list(loss_node.shape)}", site=loss_node.site)
    with tracing(graph, capture=False):
        cot = backward(graph, {loss: ops.full((), 1.0)})
        grads_out: dict[str, int] = {}
        for name, p in graph.params.items():
            if p.dtype != "f32" or name in frozen:
                continue
            g = cot.get(p.id)
            grads_out[name] = g.id if g is not None else ops.full(p.shape, 0.0).id
    return grads_out
