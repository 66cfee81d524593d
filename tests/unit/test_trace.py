"""tg.trace / tg.trace_forward: what the traces record, input declarations, resolve_shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgrad as tg
from tensorgrad import init
from tensorgrad.compiler import Compilation
from tensorgrad.errors import ShapeError
from tensorgrad.reference import evaluate
from tensorgrad.trace import InputDecl, normalize_inputs, resolve_shapes


class MLP(tg.Module):
    def __init__(self):
        self.l1 = tg.Linear(4, 8, init=init.kaiming())
        self.l2 = tg.Linear(8, 2)
        self.unused = self.param((3,), init=init.ones())

    def forward(self, x):
        return self.l2(tg.relu(self.l1(x)))


def mse(m, x, y):
    d = m(x) - y
    return tg.mean(d * d)


def test_training_trace_records_everything():
    t = tg.trace(MLP(), mse, {"x": (5, 4), "y": [5, 2]}, seed=1234)
    assert isinstance(t, Compilation) and t.training
    assert t.done == ["trace", "autograd", "passes after autograd"]  # IR only, no optimizer
    g = t.graph
    assert g.outputs == [t.loss] and g[t.loss].shape == () and g[t.loss].dtype == "f32"
    assert list(t.params) == ["l1.W", "l1.b", "l2.W", "l2.b", "unused"]
    assert list(t.grads) == list(t.params)
    for name, gid in t.grads.items():
        assert g[gid].shape == t.params[name].shape
    assert {k: p.shape for k, p in t.params.items()} == {
        "l1.W": (4, 8), "l1.b": (8,), "l2.W": (8, 2), "l2.b": (2,), "unused": (3,)}
    assert {k: p.decay for k, p in t.params.items()} == {
        "l1.W": True, "l1.b": False, "l2.W": True, "l2.b": False, "unused": False}
    assert t.params["l1.W"].init == init.kaiming() and t.params["l1.W"].fan_in == 4
    assert t.params["l2.W"].init == init.randn(0.02)
    assert t.seed == 1234
    assert t.inputs == {"x": InputDecl("x", (5, 4)), "y": InputDecl("y", (5, 2))}
    # leaves first: params in order, then inputs in declaration order
    assert [n.attrs["name"] for n in g.nodes[:7]] == [*t.params, "x", "y"]
    # a param with no path to the loss gets a zero gradient
    assert g[t.grads["unused"]].op == "full"


def test_training_trace_values_match_torch():
    model = MLP()
    t = tg.trace(model, mse, {"x": (5, 4), "y": (5, 2)}, seed=7)
    params = {k: np.asarray(v).reshape(t.params[k].shape)
              for k, v in init.init_params(t.params, t.seed).items()}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    y = rng.standard_normal((5, 2)).astype(np.float32)
    vals = evaluate(t.graph, {**params, "x": x, "y": y})
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    h = torch.relu(torch.tensor(x) @ tp["l1.W"] + tp["l1.b"])
    loss = ((h @ tp["l2.W"] + tp["l2.b"] - torch.tensor(y)) ** 2).mean()
    loss.backward()
    np.testing.assert_allclose(vals[t.loss], loss.item(), rtol=1e-5)
    for k, gid in t.grads.items():
        want = tp[k].grad.numpy() if tp[k].grad is not None else np.zeros(t.params[k].shape)
        np.testing.assert_allclose(vals[gid], want, rtol=1e-4, atol=1e-6, err_msg=k)


def test_init_params_reproduce_seed():
    t = tg.trace(MLP(), mse, {"x": (5, 4), "y": (5, 2)}, seed=99)
    assert init.init_params(t.params, t.seed) == MLP().init_params(99)
    assert init.init_params(t.params, t.seed)["l1.W"] != MLP().init_params(100)["l1.W"]


def test_seed_default_and_masking():
    a = tg.trace(MLP(), mse, {"x": (5, 4), "y": (5, 2)})
    b = tg.trace(MLP(), mse, {"x": (5, 4), "y": (5, 2)})
    assert 0 <= a.seed < 2**32 and a.seed != b.seed
    assert tg.trace(MLP(), mse, {"x": (5, 4), "y": (5, 2)}, seed=-1).seed == 2**32 - 1


def test_dead_code_removed_named_leaves_kept():
    def loss(m, x, y, frozen):
        tg.relu(x)  # unused
        return tg.mean(m(x)) + tg.mean(tg.matmul(x, frozen))  # frozen: an input, no grad kept

    t = tg.trace(MLP(), loss, {"x": (5, 4), "y": (5, 2), "frozen": (4, 3)}, seed=0)
    ops = [n.op for n in t.graph.nodes]
    assert "relu" in ops and ops.count("relu") == 1  # only the model's relu survives
    assert set(t.graph.inputs) == {"x", "y", "frozen"}  # unused y still declared and kept
    # no gradient for the frozen input is computed: only matmuls feeding params / the loss
    shapes = [n.shape for n in t.graph.nodes if n.op == "matmul"]
    assert (4, 3) not in shapes
    assert all(n.id == i for i, n in enumerate(t.graph.nodes))  # dense after DCE


def test_trace_forward():
    f = tg.trace_forward(MLP(), lambda m, x: m(x), {"x": (3, 4)})
    assert isinstance(f, Compilation) and not f.training
    out = f.graph[f.output]
    assert out.shape == (3, 2) and out.dtype == "f32" and f.grads == {}
    assert list(f.params) == ["l1.W", "l1.b", "l2.W", "l2.b", "unused"]
    with pytest.raises(AttributeError, match="a forward graph has no loss"):
        _ = f.loss
    assert f.graph.outputs == [f.output]
    assert not any(n.op in ("relu_grad", "sum_to_shape") for n in f.graph.nodes)


def test_trace_forward_i32_output():
    f = tg.trace_forward(MLP(), lambda m, x: tg.argmax(m(x), -1), {"x": (3, 4)})
    assert f.graph[f.output].shape == (3,) and f.graph[f.output].dtype == "i32"


def test_keyword_only_and_defaults_accepted():
    def loss(m, *, x, y, scale=1.0):
        return mse(m, x, y) * scale

    t = tg.trace(MLP(), loss, {"x": (5, 4), "y": (5, 2)}, seed=0)
    assert set(t.graph.inputs) == {"x", "y"}
    t = tg.trace(MLP(), lambda m, **kw: mse(m, **kw), {"x": (5, 4), "y": (5, 2)}, seed=0)
    assert set(t.graph.inputs) == {"x", "y"}


def test_captures_survive():
    def loss(m, x, y):
        h = tg.capture("hidden", tg.relu(m.l1(x)))
        tg.capture("unused", tg.exp(x))
        d = m.l2(h) - y
        return tg.mean(d * d)

    t = tg.trace(MLP(), loss, {"x": (5, 4), "y": (5, 2)}, seed=0)
    assert set(t.graph.captures) == {"hidden", "unused"}
    assert t.graph[t.graph.captures["unused"]].op == "exp"


# ---- input declarations ----------------------------------------------------------------

def test_declaration_forms():
    d = normalize_inputs({"a": (2, 3), "b": [4], "c": ((5,), "i32"), "d": 7, "e": (),
                          "f": {"shape": (1, 2), "dtype": "i32"}, "g": ((), "f32"),
                          "h": (None, 3)})
    assert d == {"a": InputDecl("a", (2, 3)), "b": InputDecl("b", (4,)),
                 "c": InputDecl("c", (5,), "i32"), "d": InputDecl("d", (7,)),
                 "e": InputDecl("e", ()), "f": InputDecl("f", (1, 2), "i32"),
                 "g": InputDecl("g", ()), "h": InputDecl("h", (None, 3))}
    assert list(d) == list("abcdefgh")
    assert not d["h"].concrete and d["a"].concrete


def test_scalar_input_traces():
    t = tg.trace(MLP(), lambda m, x, y, w: mse(m, x, y) * w,
                 {"x": (5, 4), "y": (5, 2), "w": ()}, seed=0)
    assert t.graph.inputs["w"].shape == ()


def test_resolve_shapes():
    decls = {"x": (None, 3), "t": ((None,), "i32"), "k": (2,)}
    arrays = {"x": np.zeros(12, np.float32), "t": np.zeros(4, np.int32),
              "k": [1.0, 2.0]}
    assert resolve_shapes(decls, arrays) == {"x": (4, 3), "t": (4,), "k": (2,)}
    from array import array
    assert resolve_shapes({"x": (2, None, 2)}, {"x": array("f", [0.0] * 12)}) == \
        {"x": (2, 3, 2)}
    assert resolve_shapes({"x": (None, 2)}, {"x": memoryview(array("f", [0.0] * 6))}) == \
        {"x": (3, 2)}
    assert resolve_shapes({"x": (None, 2)}, {"x": np.zeros((5, 2))}) == {"x": (5, 2)}


def test_resolve_shapes_errors():
    with pytest.raises(ShapeError, match=r"input 'x' has 10 elements, which is not a positive "
                       r"multiple of 3 \(the product of the known dims of \[None, 3\]\)"):
        resolve_shapes({"x": (None, 3)}, {"x": np.zeros(10)})
    with pytest.raises(ShapeError, match=r"the None dims disagree: input 'x' gives 4 but input "
                       r"'t' gives 5"):
        resolve_shapes({"x": (None, 3), "t": ((None,), "i32")},
                       {"x": np.zeros(12), "t": np.zeros(5)})
    with pytest.raises(ShapeError, match=r"missing input\(s\) \['t'\]; declared: \['x', 't'\]"):
        resolve_shapes({"x": (None, 3), "t": (2,)}, {"x": np.zeros(12)})
    with pytest.raises(ShapeError, match=r"unknown input\(s\) \['z'\]"):
        resolve_shapes({"x": (3,)}, {"x": np.zeros(3), "z": np.zeros(1)})
    with pytest.raises(ShapeError, match=r"input 'k' has 3 elements but its declared shape "
                       r"\[2\] needs 2"):
        resolve_shapes({"k": (2,)}, {"k": np.zeros(3)})
    with pytest.raises(ShapeError, match=r"at most one None dim per input, got \[None, None\]"):
        resolve_shapes({"x": (None, None)}, {"x": np.zeros(4)})


def test_resolved_shapes_trace():
    decls = {"x": (None, 4)}
    shapes = resolve_shapes(decls, {"x": np.zeros(24, np.float32)})
    f = tg.trace_forward(MLP(), lambda m, x: m(x), shapes)
    assert f.graph[f.output].shape == (6, 2)


def test_forward_captures_survive_dce():
    def fwd(m, x):
        tg.capture("side", tg.exp(x))
        return m(x)

    f = tg.trace_forward(MLP(), fwd, {"x": (3, 4)})
    assert f.graph[f.graph.captures["side"]].op == "exp"
