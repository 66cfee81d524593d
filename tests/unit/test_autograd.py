"""The autograd engine: each input's gradient summed back to its shape once, in the engine."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.autograd import append_grad, backward
from tensorgrad.reference import evaluate
from tensorgrad.tensor import leaf, tracing


def _ops(graph, start: int) -> list[str]:
    return [n.op for n in graph.nodes[start:]]


def test_a_broadcast_input_gets_one_sum_back_to_its_shape() -> None:
    with tracing() as st:
        x = leaf("param", "x", (4, 3))
        b = leaf("param", "b", (3,))
        s = leaf("param", "s", ())
        loss = tg.sum((x * b + s) * (x - b))
    graph = st.graph
    mark = len(graph.nodes)
    grads = append_grad(graph, loss.id)
    assert {n: graph[g].shape for n, g in grads.items()} == {"x": (4, 3), "b": (3,), "s": ()}
    # b is broadcast by the mul and by the sub, s by the add: one sum each, x none
    sums = [n for n in graph.nodes[mark:] if n.op == "sum_to_shape"]
    assert sorted(n.shape for n in sums) == [(), (3,), (3,)], _ops(graph, mark)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 3)), "b": rng.standard_normal(3),
             "s": np.float64(0.5)}
    values = evaluate(graph, feeds, float_dtype=np.float64)
    xv, bv, sv = feeds["x"], feeds["b"], feeds["s"]
    want_b = (xv * (xv - bv) - (xv * bv + sv)).sum(axis=0)
    np.testing.assert_allclose(values[grads["b"]], want_b, rtol=1e-10)
    np.testing.assert_allclose(values[grads["s"]], (xv - bv).sum(), rtol=1e-10)


def test_a_gradient_that_is_no_broadcast_of_its_input_is_a_bug_in_the_rule() -> None:
    from tensorgrad.ops import registry

    op = registry.OPS["neg"]
    original = op.vjp
    object.__setattr__(op, "vjp", lambda ins, out, dy, at: [tg.sum(dy)])
    try:
        with tracing() as st:
            x = leaf("param", "x", (4, 3))
            y = tg.neg(x)
            with pytest.raises(AssertionError, match=r"vjp of neg gave shape \(\) for input "
                               r"of shape \(4, 3\)"):
                backward(st.graph, {y.id: y})
    finally:
        object.__setattr__(op, "vjp", original)
