"""Reverse-mode autograd over the IR: appends the backward graph using each op's VJP rule."""

from __future__ import annotations

from collections.abc import Collection

from .errors import ShapeError
from .ir import LEAF_OPS, Graph
from .ops.registry import GRAD_ERROR, NO_GRAD, OPS
from .tensor import Tensor, tracing


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
    forward = list(graph.nodes)
    with tracing(graph, capture=False):
        cot: dict[int, Tensor] = {loss: ops.full((), 1.0)}
        for node in reversed(forward):
            dy = cot.pop(node.id, None)
            if dy is None or node.op in LEAF_OPS:
                if dy is not None:
                    cot[node.id] = dy  # keep leaf cotangents: they are the gradients
                continue
            rule = OPS[node.op].vjp
            if rule == NO_GRAD:
                continue
            if rule == GRAD_ERROR:
                raise ShapeError(node.op, "cannot differentiate through this op (it is a "
                                 "backward or optimizer op)", site=node.site)
            inputs = [Tensor(graph, i) for i in node.inputs]
            grads = rule(inputs, Tensor(graph, node.id), dy, node.attrs)  # type: ignore[operator]
            for i, g in zip(node.inputs, grads):
                if g is None or graph[i].dtype != "f32":
                    continue
                if g.shape != graph[i].shape:
                    raise AssertionError(f"vjp of {node.op} gave shape {g.shape} for input "
                                         f"of shape {graph[i].shape}")
                cot[i] = g if i not in cot else ops.add(cot[i], g)
        grads_out: dict[str, int] = {}
        for name, p in graph.params.items():
            if p.dtype != "f32" or name in frozen:
                continue
            g = cot.get(p.id)
            grads_out[name] = g.id if g is not None else ops.full(p.shape, 0.0).id
    return grads_out
