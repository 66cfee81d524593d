"""Module naming and order, cloning, and the layers' forward/backward against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorgrad as tg
from tensorgrad import init
from tensorgrad.errors import ShapeError, TraceError
from tensorgrad.module import Param, clone
from tensorgrad.reference import evaluate


class Attn(tg.Module):
    def __init__(self, d: int):
        self.q = tg.Linear(d, d, bias=False)
        self.k = tg.Linear(d, d, bias=False)


class Block(tg.Module):
    def __init__(self, d: int):
        self.ln = tg.LayerNorm(d)
        self.attn = Attn(d)
        self.scale = self.param((1,), init=init.ones())


class Net(tg.Module):
    def __init__(self, d: int = 4, n: int = 2):
        self.emb = tg.Embedding(10, d)
        self.blocks = [Block(d) for _ in range(n)]
        self.heads = {"a": tg.Linear(d, 2), "b": tg.Linear(d, 3, bias=False)}
        self.pair = (tg.RMSNorm(d), self.param((d,), init=init.zeros()))
        self.config = {"d": d}          # plain data: not a param container
        self.name = "net"

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b.ln(x)
        return self.heads["a"](self.pair[0](x))


EXPECTED = ["emb.W",
            "blocks.0.ln.g", "blocks.0.ln.b", "blocks.0.attn.q.W", "blocks.0.attn.k.W",
            "blocks.0.scale",
            "blocks.1.ln.g", "blocks.1.ln.b", "blocks.1.attn.q.W", "blocks.1.attn.k.W",
            "blocks.1.scale",
            "heads.a.W", "heads.a.b", "heads.b.W", "pair.0.g", "pair.1"]


def test_names_depth_first_in_definition_order():
    net = Net()
    assert net.param_names() == EXPECTED
    specs = net.named_params()
    assert list(specs) == EXPECTED
    assert specs["blocks.1.attn.q.W"].shape == (4, 4)
    assert specs["emb.W"].shape == (10, 4) and specs["pair.1"].init == init.zeros()
    assert all(s.name == k for k, s in specs.items())


def test_order_is_stable_and_follows_first_assignment():
    class M(tg.Module):
        def __init__(self):
            self.b = self.param((1,))
            self.a = self.param((1,))
            self.b = self.param((2,))  # reassignment keeps b's slot

    assert M().param_names() == ["b", "a"]
    assert Net().param_names() == Net().param_names()


def test_trace_graph_param_order_matches_names():
    net = Net()
    out = tg.trace_forward(net, lambda m, idx: m(idx), {"idx": ((2, 3), "i32")})
    assert list(out.graph.params) == EXPECTED
    assert list(out.params) == EXPECTED


def test_weight_tying_visits_once():
    class Tied(tg.Module):
        def __init__(self):
            self.emb = tg.Embedding(5, 3)
            self.head = self.emb          # the same module twice
            self.w = self.param((3,))
            self.also_w = self.w          # the same param twice

        def forward(self, idx):
            return tg.matmul(self.head(idx), tg.reshape(self.also_w, (3, 1)))

    m = Tied()
    assert m.param_names() == ["emb.W", "w"]
    t = tg.trace(m, lambda m, idx: tg.mean(m(idx)), {"idx": ((4,), "i32")}, seed=0)
    assert list(t.graph.params) == ["emb.W", "w"] and set(t.grads) == {"emb.W", "w"}


def test_clone_does_not_mutate_user_model():
    net = Net()
    before = {k: v for k, v in vars(net).items()}
    blocks = list(net.blocks)
    ln_g = net.blocks[0].ln.g
    tg.trace(net, lambda m, idx: tg.mean(m(idx)), {"idx": ((2, 3), "i32")}, seed=0)
    assert vars(net) == before and net.blocks == blocks
    assert net.blocks[0].ln.g is ln_g and isinstance(ln_g, Param)
    assert isinstance(net.heads["a"].W, Param) and isinstance(net.pair[1], Param)
    # and tracing twice gives the same graph
    a = tg.trace(net, lambda m, idx: tg.mean(m(idx)), {"idx": ((2, 3), "i32")}, seed=0)
    b = tg.trace(net, lambda m, idx: tg.mean(m(idx)), {"idx": ((2, 3), "i32")}, seed=0)
    assert str(a.graph) == str(b.graph)


def test_traced_clone_holds_tensors():
    seen = {}

    def fwd(m, idx):
        seen["m"] = m
        return m(idx)

    net = Net()
    tg.trace_forward(net, fwd, {"idx": ((1, 2), "i32")})
    m = seen["m"]
    assert m is not net and type(m) is Net
    assert isinstance(m.blocks[1].attn.q.W, tg.Tensor) and isinstance(m.pair[1], tg.Tensor)
    assert m.config is net.config and m.name == "net"  # non-param data is shared
    assert isinstance(m.pair, tuple) and isinstance(m.heads, dict)


def test_structural_clone_shares_placeholders():
    net = Net()
    c = clone(net)
    assert c is not net and c.blocks is not net.blocks and c.blocks[0] is not net.blocks[0]
    assert c.blocks[0].ln.g is net.blocks[0].ln.g
    assert c.param_names() == net.param_names()


def test_call_runs_forward():
    class Twice(tg.Module):
        def forward(self, x):
            return x * 2.0

    out = tg.trace_forward(Twice(), lambda m, x: m(x), {"x": (3,)})
    assert out.graph[out.output].op == "mul_scalar"
    with pytest.raises(NotImplementedError, match="Attn does not define forward"):
        Attn(2)(None)


def test_param_inside_forward_is_an_error():
    class Lazy(tg.Module):
        def forward(self, x):
            self.w = self.param((3, 3))
            return x @ self.w

    with pytest.raises(TraceError, match=r"Lazy.param\(\[3, 3\]\) was called while tracing: "
                       r"params must be declared in __init__"):
        tg.trace_forward(Lazy(), lambda m, x: m(x), {"x": (2, 3)})
    with pytest.raises(TraceError, match=r"Linear.param\(\[3, 4\]\) was called while tracing"):
        tg.trace_forward(Lazy(), lambda m, x: tg.Linear(3, 4)(x), {"x": (2, 3)})


def test_placeholder_used_as_tensor_is_an_error():
    lin = tg.Linear(2, 2)
    with pytest.raises(TraceError, match="is a param placeholder, not a tensor"):
        lin.W * 2.0


def test_bad_param_declarations():
    class M(tg.Module):
        def __init__(self, shape, **kw):
            self.w = self.param(shape, **kw)

    with pytest.raises(ShapeError, match=r"M.param: shape must be a sequence of positive ints, "
                       r"got \[2, 0\]"):
        M((2, 0))
    with pytest.raises(ShapeError, match=r"dtype must be one of \('f32', 'i32'\), got 'bool'"):
        M((2,), dtype="bool")
    with pytest.raises(ShapeError, match="fan_in must be a positive int, got 0"):
        M((2,), fan_in=0)
    assert M(3).named_params()["w"].shape == (3,)
    assert M(()).named_params()["w"].shape == ()


def test_layer_argument_validation():
    with pytest.raises(ShapeError, match=r"Conv2d: groups=3 must divide both in_channels=4 and "
                       r"out_channels=6"):
        tg.Conv2d(4, 6, 3, groups=3)
    with pytest.raises(ShapeError, match="Conv2d: groups must be a positive int, got 0"):
        tg.Conv2d(4, 6, 3, groups=0)
    with pytest.raises(ShapeError, match=r"Conv2d: kernel_size must be an int ≥ 1 or a pair"):
        tg.Conv2d(4, 6, (3, 0))
    with pytest.raises(ShapeError, match="Linear: in_features must be a positive int, got -1"):
        tg.Linear(-1, 3)
    conv = tg.Conv2d(4, 6, (3, 1), stride=2, padding=(1, 0), groups=2)
    assert conv.named_params()["W"].shape == (6, 2, 3, 1)
    assert conv.stride == (2, 2) and conv.padding == (1, 0)


# ---- freezing ---------------------------------------------------------------------------

class ConvNet(tg.Module):
    """A conv feature extractor and a linear head (the transfer-learning shape)."""

    def __init__(self) -> None:
        self.features = tg.Conv2d(1, 4, 3, padding=1)
        self.head = tg.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        h = tg.relu(self.features(x))
        return self.head(tg.reshape(h, (x.shape[0], -1)))


def conv_loss(m, x, y):
    return tg.cross_entropy(m(x), y)


CONV_INPUTS = {"x": (2, 1, 6, 6), "y": ((2,), "i32")}


def test_freeze_marks_the_params_below_and_the_latest_call_wins():
    net = Net()
    assert net.frozen_param_names() == []
    assert net.blocks[0].freeze() is net.blocks[0]
    assert net.frozen_param_names() == EXPECTED[1:6]
    net.freeze()                                  # everything, overriding blocks.0's mark
    net.heads["a"].freeze(False)                  # but the head trains
    assert net.frozen_param_names() == [n for n in EXPECTED if not n.startswith("heads.a.")]
    net.freeze(False)                             # clears the head's mark too
    assert net.frozen_param_names() == []
    assert net.param_names() == EXPECTED          # names and order unchanged by the marks
    with pytest.raises(TypeError, match=r"Net.freeze\(frozen='yes'\): frozen must be True or "
                       "False"):
        net.freeze("yes")


def test_a_tied_param_frozen_in_one_place_only_is_an_error():
    class Tied(tg.Module):
        def __init__(self):
            self.emb = tg.Embedding(5, 3)
            self.out = tg.Linear(3, 5)
            self.out.W = self.emb.W             # the same param in two places

    m = Tied()
    m.emb.freeze()
    with pytest.raises(TraceError, match=r"param 'emb.W' is frozen but is also reached as "
                       r"'out.W', where it is trainable .*freeze it in both places or in "
                       "neither"):
        m.frozen_param_names()
    m.out.freeze()
    assert m.param_names() == ["emb.W", "out.b"] == m.frozen_param_names()


def test_frozen_params_get_no_gradient_and_their_backward_is_dropped():
    net = ConvNet()
    full = tg.trace(net, conv_loss, CONV_INPUTS, seed=0)
    net.features.freeze()
    frozen = tg.trace(net, conv_loss, CONV_INPUTS, seed=0)
    assert set(full.grads) == {"features.W", "features.b", "head.W", "head.b"}
    assert set(frozen.grads) == {"head.W", "head.b"}
    assert list(frozen.graph.params) == list(full.graph.params)   # still params
    ops = [n.op for n in frozen.graph.nodes]
    assert "conv2d_weight_grad" in [n.op for n in full.graph.nodes]
    assert "conv2d_weight_grad" not in ops and "conv2d_input_grad" not in ops
    assert len(frozen.graph.nodes) < len(full.graph.nodes)
    # the head's gradient is the same either way
    x = np.random.default_rng(0).normal(size=(2, 1, 6, 6)).astype(np.float32)
    feeds = {"x": x, "y": np.array([0, 2], np.int32)}
    values = net.init_params(0)
    got = [evaluate(t.graph, {**feeds, **values})[t.grads["head.W"]] for t in (full, frozen)]
    np.testing.assert_array_equal(got[0], got[1])


def test_compiling_a_model_whose_params_are_all_frozen_is_an_error():
    from tensorgrad.compiler import Options, Request, compile_graph

    request = Request("training", ConvNet().freeze(), conv_loss, CONV_INPUTS,
                      optimizer=tg.optim.Adam(lr=1e-3), seed=0)
    with pytest.raises(TraceError, match=r"every f32 param of the model is frozen "
                       r"\(Module.freeze\), so there is nothing to train \(frozen: "
                       r"\['features.W', 'features.b', 'head.W', 'head.b'\]\)"):
        compile_graph(request, Options(), until="optimizer")
    from tensorgrad.autograd import append_grad
    t = tg.trace(ConvNet(), conv_loss, CONV_INPUTS, seed=0)
    with pytest.raises(ValueError, match=r"append_grad: frozen names \['head.w'\] are not "
                       "params of the graph"):
        append_grad(t.graph, t.loss, ["head.w"])


# ---- layer forwards and gradients vs PyTorch ------------------------------------------

def _run_layer(layer, x, xdtype="f32", seed=3):
    """Forward output and param grads of sum(layer(x) * r) through the reference."""
    rng = np.random.default_rng(seed)
    f = tg.trace_forward(layer, lambda m, x: m(x), {"x": (x.shape, xdtype)})
    y_shape = f.graph[f.output].shape
    r = rng.standard_normal(y_shape).astype(np.float32)

    def loss(m, x, r):
        return tg.sum(m(x) * r)

    t = tg.trace(layer, loss, {"x": (x.shape, xdtype), "r": y_shape}, seed=seed)
    params = {k: np.asarray(v).reshape(t.params[k].shape)
              for k, v in layer.init_params(seed).items()}
    # perturb gains/biases away from ones/zeros so they matter
    params = {k: v + rng.standard_normal(v.shape).astype(np.float32) * 0.3
              for k, v in params.items()}
    fwd = tg.trace_forward(layer, lambda m, x: m(x), {"x": (x.shape, xdtype)})
    out = evaluate(fwd.graph, {**params, "x": x})[fwd.output]
    vals = evaluate(t.graph, {**params, "x": x, "r": r})
    grads = {k: vals[i] for k, i in t.grads.items()}
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    return out, grads, tp, torch.tensor(r)


def _check(out, grads, tp, r, torch_out, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(out, torch_out.detach().numpy(), rtol=rtol, atol=atol)
    (torch_out * r).sum().backward()
    for k, g in grads.items():
        np.testing.assert_allclose(g, tp[k].grad.numpy(), rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 3), (2, 4, 3)])
def test_linear_vs_torch(bias, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    out, grads, tp, r = _run_layer(tg.Linear(3, 6, bias=bias), x)
    _check(out, grads, tp, r, F.linear(torch.tensor(x), tp["W"].T, tp.get("b")))


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_vs_torch(bias):
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32) * 3 + 1
    out, grads, tp, r = _run_layer(tg.LayerNorm(8, bias=bias), x)
    _check(out, grads, tp, r, F.layer_norm(torch.tensor(x), (8,), tp["g"], tp.get("b"), 1e-5))


def test_rms_norm_vs_torch():
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    out, grads, tp, r = _run_layer(tg.RMSNorm(6), x)
    xt = torch.tensor(x)
    want = xt / torch.sqrt((xt * xt).mean(-1, keepdim=True) + 1e-6) * tp["g"]
    _check(out, grads, tp, r, want)
    if hasattr(F, "rms_norm"):
        np.testing.assert_allclose(out, F.rms_norm(xt, (6,), tp["g"].detach(), 1e-6).numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_embedding_vs_torch():
    idx = np.array([[0, 3, 9], [9, 1, 1]], dtype=np.int32)
    out, grads, tp, r = _run_layer(tg.Embedding(10, 5), idx, xdtype="i32")
    _check(out, grads, tp, r, F.embedding(torch.tensor(idx, dtype=torch.long), tp["W"]))




@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 1}, {"groups": 2, "padding": (1, 0)},
                                {"bias": False, "stride": (1, 2)}])
def test_conv2d_vs_torch(kw):
    x = np.random.default_rng(4).standard_normal((2, 4, 7, 6)).astype(np.float32)
    layer = tg.Conv2d(4, 6, (3, 2), **kw)
    out, grads, tp, r = _run_layer(layer, x)
    want = F.conv2d(torch.tensor(x), tp["W"], tp.get("b"), stride=layer.stride,
                    padding=layer.padding, groups=layer.groups)
    _check(out, grads, tp, r, want, rtol=1e-4, atol=1e-4)
