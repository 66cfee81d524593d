"""`tg.export.torch`: the written PyTorch module computes what tensorgrad computes.

Tensorgrad's side is the NumPy reference interpreter (the oracle every GPU kernel is tested
against): the forward of `trace_forward`, and param gradients of `trace` with the loss
``sum(forward * r)`` for a random r. The torch side is the exported source, imported from a
file, with the exported safetensors loaded by ``safetensors.torch.load_file``. Batches are
run at sizes other than the export's probe sizes, so the None dim really is free.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch  # the test extra installs torch and safetensors; missing, this file fails
import torch.nn.functional as F
from safetensors.torch import load_file

import tensorgrad as tg
from tensorgrad.export import ExportError, forward_ops, translatable_ops
from tensorgrad.export.pytorch import _Ctx, translate_node
from tensorgrad.ir import Node
from tensorgrad.ops.registry import GRAD_ERROR, OPS
from tensorgrad.reference import evaluate
from tests.models import addition_transformer, mlp_sin

FIGURES: dict[str, dict[str, float]] = {}


def test_torch_is_installed() -> None:
    assert torch.__version__.startswith("2."), torch.__version__


# ---- helpers -----------------------------------------------------------------------------

def import_export(ex: Any, name: str) -> Any:
    """The exported class from its written file, weights loaded with load_file."""
    spec = importlib.util.spec_from_file_location(f"exported_{name}", ex.path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    model = getattr(module, ex.class_name)()
    model.load_state_dict(load_file(str(ex.weights_path)))
    return model


def concrete(decls: dict[str, Any], n: int) -> dict[str, Any]:
    out = {}
    for k, v in decls.items():
        shape, dtype = (v if isinstance(v[-1], str) else (v, "f32"))
        out[k] = (tuple(n if d is None else d for d in shape), dtype)
    return out


def random_params(model: tg.Module, seed: int, scale: float = 0.3) -> dict[str, np.ndarray]:
    """O(1) values (init + noise) so that relative errors mean something."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in model.named_params().items():
        base = np.asarray(model.init_params(seed)[name], np.float32).reshape(spec.shape)
        out[name] = (base + scale * rng.standard_normal(spec.shape)).astype(np.float32)
    return out


def reference_forward(model: tg.Module, forward: Any, shapes: dict[str, Any],
                      feeds: dict[str, Any], float_dtype: Any = np.float32) -> np.ndarray:
    tr = tg.trace_forward(model, forward, shapes)
    return evaluate(tr.graph, feeds, float_dtype=float_dtype)[tr.output]


def reference_grads(model: tg.Module, forward: Any, shapes: dict[str, Any],
                    feeds: dict[str, Any], r: np.ndarray,
                    float_dtype: Any = np.float32) -> dict[str, np.ndarray]:
    def loss(m: tg.Module, **inputs: tg.Tensor) -> tg.Tensor:
        weight = inputs.pop("r_weight")
        return tg.sum(forward(m, **inputs) * weight)

    tr = tg.trace(model, loss, {**shapes, "r_weight": r.shape}, seed=0)
    values = evaluate(tr.graph, {**feeds, "r_weight": r}, float_dtype=float_dtype)
    return {name: values[i] for name, i in tr.grads.items()}


def torch_inputs(feeds: dict[str, np.ndarray], dtype: Any = torch.float32) -> dict[str, Any]:
    return {k: torch.from_numpy(v).to(dtype) if v.dtype.kind == "f" else torch.from_numpy(v)
            for k, v in feeds.items()}


def diffs(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    return err, err / max(float(np.max(np.abs(b))), 1e-30)


def check_model(name: str, model: tg.Module, forward: Any, decls: dict[str, Any],
                feeds: dict[str, np.ndarray], n: int, tmp_path: Path,
                rtol: float = 2e-5, rtol_grad: float = 1e-4) -> dict[str, float]:
    params = random_params(model, 3)
    ex = tg.export.torch(model, forward=forward, inputs=decls, params=params,
                         path=tmp_path / f"{name}_torch.py")
    assert ex.weights_path.exists() and ex.size_name is not None
    shapes = concrete(decls, n)
    tmodel = import_export(ex, name)
    assert sorted(dict(tmodel.named_parameters())) == sorted(params)
    for pname, value in params.items():  # the weights file holds the given values
        assert np.array_equal(tmodel.state_dict()[pname].numpy(), value), pname

    want = reference_forward(model, forward, shapes, {**params, **feeds})
    got = tmodel(**torch_inputs(feeds))
    assert tuple(got.shape) == want.shape
    fwd_abs, fwd_rel = diffs(got.detach().numpy(), want)

    r = np.random.default_rng(5).standard_normal(want.shape).astype(np.float32)
    grads = reference_grads(model, forward, shapes, {**params, **feeds}, r)
    tmodel.zero_grad()
    out = tmodel(**torch_inputs(feeds))
    (out * torch.from_numpy(r)).sum().backward()
    grad_abs = grad_rel = 0.0
    for pname, g in grads.items():
        tg_grad = dict(tmodel.named_parameters())[pname].grad
        assert tg_grad is not None, pname
        a, rel = diffs(tg_grad.numpy(), g)
        grad_abs, grad_rel = max(grad_abs, a), max(grad_rel, rel)

    # float64 on both sides: the translation itself, without float32 rounding
    want64 = reference_forward(model, forward, shapes, {**params, **feeds}, np.float64)
    t64 = tmodel.double()
    got64 = t64(**torch_inputs(feeds, torch.float64)).detach().numpy()
    _, rel64 = diffs(got64, want64)
    tmodel.float()

    fig = {"forward_max_abs": fwd_abs, "forward_max_rel": fwd_rel, "grad_max_abs": grad_abs,
           "grad_max_rel": grad_rel, "forward_f64_max_rel": rel64, "batch": n}
    FIGURES[name] = fig
    print(f"\n{name}: {fig}")
    assert fwd_rel <= rtol, fig
    assert grad_rel <= rtol_grad, fig
    assert rel64 <= 1e-9, fig
    return fig


# ---- the three models ----------------------------------------------------------------------

def test_mlp_forward_and_grads_match(tmp_path: Path) -> None:
    m = mlp_sin()
    x = np.linspace(-3, 3, 37, dtype=np.float32).reshape(37, 1)
    check_model("mlp", m.MLP(), m.predict_fn, m.PREDICT_INPUTS, {"x": x}, 37, tmp_path)


def test_mlp_source_is_readable(tmp_path: Path) -> None:
    m = mlp_sin()
    ex = tg.export.torch(m.MLP(), inputs={"x": (None, 1)}, path=tmp_path / "mlp.py")
    src = ex.source
    assert "class Linear(nn.Module):" in src and "class MLP(nn.Module):" in src
    assert "self.l1 = Linear(in_features=1, out_features=64)" in src
    assert "return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))" in src
    assert "return x @ self.W + self.b" in src
    assert max(len(line) for line in src.splitlines()) <= 100
    compile(src, "mlp.py", "exec")


def test_transformer_forward_and_grads_match(tmp_path: Path) -> None:
    at = addition_transformer()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, at.VOCAB, size=(6, at.T)).astype(np.int32)
    fig = check_model("transformer", at.AdditionTransformer(), at.AdditionTransformer.forward,
                      {"tokens": ((None, at.T), "i32")}, {"tokens": tokens}, 6, tmp_path)
    assert fig["batch"] == 6
    src = (tmp_path / "transformer_torch.py").read_text()
    assert "class Block(nn.Module):" in src and "nn.ModuleList([Block() for _ in range(3)])" in src
    assert "softmax_causal(" in src and "embedding(self.tok_emb, tokens)" in src


class CNN(tg.Module):
    """conv -> relu -> pool -> strided conv -> relu -> flatten -> linear -> log_softmax."""

    def __init__(self) -> None:
        self.c1 = tg.Conv2d(1, 4, 3, padding=1)
        self.c2 = tg.Conv2d(4, 6, 3, stride=2, padding=1)
        self.fc = tg.Linear(6 * 2 * 2, 5)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        h = tg.max_pool2d(tg.relu(self.c1(x)), 2)
        h = tg.relu(self.c2(h))
        return tg.log_softmax(self.fc(tg.reshape(h, (x.shape[0], -1))), -1)


def test_cnn_forward_and_grads_match(tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((4, 1, 8, 8)).astype(np.float32)
    check_model("cnn", CNN(), CNN.forward, {"x": (None, 1, 8, 8)}, {"x": x}, 4, tmp_path)
    src = (tmp_path / "cnn_torch.py").read_text()
    assert "F.conv2d(" in src and "F.max_pool2d(" in src and ".log_softmax(-1)" in src


class KaimingNet(tg.Module):
    """Kaiming-initialised params: a Linear's W (fan-in from its shape) and a listed param
    with its own fan_in."""

    def __init__(self) -> None:
        self.lin = tg.Linear(4, 8, init=tg.init.kaiming())
        self.ws = [self.param((8, 3), init=tg.init.kaiming(), fan_in=5)]

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return tg.relu(self.lin(x)) @ self.ws[0]


def test_kaiming_params_export_to_a_module_that_builds(tmp_path: Path) -> None:
    """reset_parameters runs outside __init__, so its kaiming fan-in cannot name a
    constructor argument (it did: NameError building the module) or a missing one
    (math.sqrt(None) for a listed param)."""
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    check_model("kaiming", KaimingNet(), KaimingNet.forward, {"x": (None, 4)}, {"x": x}, 3,
                tmp_path)
    src = (tmp_path / "kaiming_torch.py").read_text()
    assert "math.sqrt(self.W.shape[0])" in src and "math.sqrt(5)" in src, src


class PaddedTagger(tg.Module):
    """Per-token classes scored with cross_entropy: targets -100 (padding) are ignored."""

    def __init__(self) -> None:
        self.emb = tg.Embedding(7, 6)
        self.out = tg.Linear(6, 5)

    def logits(self, tokens: tg.Tensor) -> tg.Tensor:
        return self.out(tg.tanh(self.emb(tokens)))

    def forward(self, tokens: tg.Tensor, targets: tg.Tensor) -> tg.Tensor:
        return tg.cross_entropy(self.logits(tokens), targets, reduction="none")


@pytest.mark.parametrize("reduction, ignore_index", [("none", -100), ("mean", -100),
                                                     ("mean", 2), ("sum", 2)])
def test_cross_entropy_with_ignore_index_round_trips(tmp_path: Path, reduction: str,
                                                     ignore_index: int) -> None:
    """The exported loss ignores the same targets as tensorgrad and as F.cross_entropy with
    that ignore_index (the default -100, or a class), forward and gradients."""
    def forward(m: PaddedTagger, tokens: tg.Tensor, targets: tg.Tensor) -> tg.Tensor:
        kw = {} if ignore_index == -100 else {"ignore_index": ignore_index}
        return tg.cross_entropy(m.logits(tokens), targets, reduction, **kw)

    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 7, (6, 4)).astype(np.int32)
    targets = rng.integers(0, 5, (6, 4)).astype(np.int32)
    targets[:, 2:] = np.where(rng.random((6, 2)) < 0.6, ignore_index, targets[:, 2:])
    name = f"padded_{reduction}_{ignore_index}".replace("-", "m")
    decls = {"tokens": ((None, 4), "i32"), "targets": ((None, 4), "i32")}
    feeds = {"tokens": tokens, "targets": targets}
    check_model(name, PaddedTagger(), forward, decls, feeds, 6, tmp_path)
    src = (tmp_path / f"{name}_torch.py").read_text()
    assert f"ignore_index={ignore_index})" in src, src
    # the exported module against torch's own loss on the same logits
    written = SimpleNamespace(path=tmp_path / f"{name}_torch.py", class_name="PaddedTagger",
                              weights_path=tmp_path / f"{name}_torch.safetensors")
    tmodel = import_export(written, name + "_again")
    w = dict(tmodel.named_parameters())
    tok, tgt = torch.from_numpy(tokens).long(), torch.from_numpy(targets).long()
    logits = torch.tanh(w["emb.W"][tok]) @ w["out.W"] + w["out.b"]
    want = F.cross_entropy(logits.reshape(-1, 5), tgt.reshape(-1), reduction=reduction,
                           ignore_index=ignore_index)
    got = tmodel(tokens=torch.from_numpy(tokens), targets=torch.from_numpy(targets))
    torch.testing.assert_close(got.reshape(-1), want.reshape(-1), rtol=1e-6, atol=1e-6)


def test_training_it_with_torch_optim(tmp_path: Path) -> None:
    """The exported MLP (tensorgrad's seeded init) learns sin(x) with torch.optim.Adam."""
    m = mlp_sin()
    ex = tg.export.torch(m.MLP(), inputs=m.PREDICT_INPUTS, seed=1, path=tmp_path / "mlp.py")
    model = import_export(ex, "mlp_train")
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    gen = torch.Generator().manual_seed(0)
    first = reached = None
    for step in range(1, 1001):
        x = (torch.rand(256, 1, generator=gen) * 2 - 1) * math.pi
        loss = ((model(x) - torch.sin(x)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
        if loss.item() < 0.01:
            reached = step
            break
    print(f"\ntorch.optim Adam on the exported MLP: loss {first:.4f} -> < 0.01 at step {reached}")
    assert reached is not None and first > 0.1


def test_handle_weights_round_trip(tmp_path: Path) -> None:
    """params= values land in the weights file under the tensorgrad names; the default
    (no params) is the seeded init, equal to what compile(seed=...) starts from."""
    m = mlp_sin()
    model = m.MLP()
    ex = tg.export.torch(model, inputs=m.PREDICT_INPUTS, seed=7, path=tmp_path / "a.py")
    loaded = load_file(str(ex.weights_path))
    init = model.init_params(7)
    for name, spec in model.named_params().items():
        assert tuple(loaded[name].shape) == spec.shape
        assert np.array_equal(loaded[name].numpy().reshape(-1), np.asarray(init[name]))


# ---- every forward op translates -------------------------------------------------------------

def _x(shape: tuple, seed: int = 0, low: float = -2, high: float = 2) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


class Holder(tg.Module):
    def __init__(self) -> None:
        self.w = self.param((3, 5), init=tg.init.randn(0.5))


B = 4  # the test batch (the probes are 3, 5, 7)
X = {"x": (None, 3)}
SQ = {"x": (None, 3, 3)}
CASES: dict[str, tuple[Any, dict[str, Any], dict[str, np.ndarray]]] = {
    "add": (lambda m, x: x + tg.reshape(tg.mean(x, 0), (1, 3)), X, {"x": _x((B, 3))}),
    "sub": (lambda m, x: x - x * x, X, {"x": _x((B, 3))}),
    "mul": (lambda m, x: x * x, X, {"x": _x((B, 3))}),
    "div": (lambda m, x: x / (tg.abs(x) + 1.0), X, {"x": _x((B, 3))}),
    "minimum": (lambda m, x: tg.minimum(x, x * 0.5) + tg.clamp(x, max=0.5), X,
                {"x": _x((B, 3))}),
    "maximum": (lambda m, x: tg.clamp(x, min=-0.5) + tg.maximum(x, x * 0.5), X,
                {"x": _x((B, 3))}),
    "less": (lambda m, x: tg.where(tg.less(x, 0.3), x, 2.0), X, {"x": _x((B, 3))}),
    "greater": (lambda m, x: tg.where(tg.greater(x, x * 0.5), x, 0.0), X, {"x": _x((B, 3))}),
    "add_scalar": (lambda m, x: x + 2.5 - 1.0, X, {"x": _x((B, 3))}),
    "mul_scalar": (lambda m, x: x * 3.0, X, {"x": _x((B, 3))}),
    "where": (lambda m, x: tg.leaky_relu(x, 0.1), X, {"x": _x((B, 3))}),
    "sqrt": (lambda m, x: tg.sqrt(x), X, {"x": _x((B, 3), low=0.1)}),
    "rsqrt": (lambda m, x: tg.rsqrt(x), X, {"x": _x((B, 3), low=0.1)}),
    "log": (lambda m, x: tg.log(x), X, {"x": _x((B, 3), low=0.1)}),
    "exp": (lambda m, x: tg.exp(x), X, {"x": _x((B, 3))}),
    "neg": (lambda m, x: -x, X, {"x": _x((B, 3))}),
    "abs": (lambda m, x: tg.abs(x), X, {"x": _x((B, 3))}),
    "tanh": (lambda m, x: tg.tanh(x), X, {"x": _x((B, 3))}),
    "sigmoid": (lambda m, x: tg.silu(x), X, {"x": _x((B, 3))}),
    "erf": (lambda m, x: tg.gelu(x), X, {"x": _x((B, 3))}),
    "sin": (lambda m, x: tg.sin(x), X, {"x": _x((B, 3))}),
    "cos": (lambda m, x: tg.cos(x), X, {"x": _x((B, 3))}),
    "relu": (lambda m, x: tg.relu(x), X, {"x": _x((B, 3))}),
    "stop_gradient": (lambda m, x: tg.stop_gradient(x) * 2.0, X, {"x": _x((B, 3))}),
    "full": (lambda m, x: x + tg.ones((3,)) + tg.zeros((1, 3)) * x, X, {"x": _x((B, 3))}),
    "broadcast_to": (lambda m, x: tg.ops.broadcast_to(tg.reshape(tg.sum(x, 1), (-1, 1)),
                                                      (x.shape[0], 3)), X, {"x": _x((B, 3))}),
    "sum_to_shape": (lambda m, x: tg.ops.sum_to_shape(x, (1, 3)) + x, X, {"x": _x((B, 3))}),
    "reshape": (lambda m, x: tg.reshape(x, (-1,)), X, {"x": _x((B, 3))}),
    "permute": (lambda m, x: tg.permute(x, (2, 0, 1)), SQ, {"x": _x((B, 3, 3))}),
    "slice_range": (lambda m, x: tg.narrow(x, 1, 1, 2), X, {"x": _x((B, 3))}),
    "concat": (lambda m, x: tg.concat([x, x * 2.0, tg.narrow(x, 1, 0, 1)], 1), X,
               {"x": _x((B, 3))}),
    "one_hot": (lambda m, i: tg.one_hot(i, 4), {"i": ((None,), "i32")},
                {"i": np.array([0, 3, 5, -1], np.int32)}),
    "gather_rows": (lambda m, i: tg.embedding(m.w, i), {"i": ((None, 2), "i32")},
                    {"i": np.array([[0, 2], [1, 1], [3, -1], [2, 0]], np.int32)}),
    "arange": (lambda m, x: x * tg.arange(3, "f32"), X, {"x": _x((B, 3))}),
    "matmul": (lambda m, x: x @ m.w, X, {"x": _x((B, 3))}),
    "matmul_batched": (lambda m, x: x @ tg.swap_axes(x, -1, -2), SQ, {"x": _x((B, 3, 3))}),
    "sum_last": (lambda m, x: tg.sum(x, -1), X, {"x": _x((B, 3))}),
    "mean_last": (lambda m, x: tg.mean(x, 0, keepdims=True), X, {"x": _x((B, 3))}),
    "argmax_last": (lambda m, x: tg.argmax(x, -1), X, {"x": _x((B, 3))}),
    "log_softmax_last": (lambda m, x: tg.log_softmax(x, 0), X, {"x": _x((B, 3))}),
    "softmax_causal_last": (lambda m, x: tg.softmax_causal(x), SQ, {"x": _x((B, 3, 3))}),
    "where_causal": (lambda m, x: tg.where_causal(x, -5.0), SQ, {"x": _x((B, 3, 3))}),
    "normalize_last": (lambda m, x: tg.layer_norm(x) + tg.rms_norm(x * 2.0, eps=0.1), X,
                       {"x": _x((B, 3))}),
    "conv2d": (lambda m, x: tg.conv2d(x, tg.reshape(tg.narrow(tg.reshape(m.w, (-1,)), 0, 0, 8),
                                                    (2, 1, 2, 2)), stride=1, padding=1),
               {"x": (None, 1, 3, 3)}, {"x": _x((B, 1, 3, 3))}),
    "max_pool2d": (lambda m, x: tg.max_pool2d(x, 2, 1, padding=1), {"x": (None, 1, 3, 3)},
                   {"x": _x((B, 1, 3, 3))}),
    "dropout": (lambda m, x: tg.dropout(x, 0.25), X, {"x": _x((B, 3), low=1, high=2)}),
    "randn": (lambda m, x: x * 0 + tg.randn((x.shape[0], 3)), X, {"x": _x((B, 3))}),
    "categorical_last": (lambda m, x: tg.categorical(x), X, {"x": _x((B, 3))}),
}
STOCHASTIC = {"dropout", "randn", "categorical_last"}


def test_every_forward_op_has_a_translation_and_a_case() -> None:
    ops = set(forward_ops())
    assert ops, "the op table is empty"
    missing = sorted(ops - set(translatable_ops()))
    assert not missing, f"forward-reachable ops without a torch translation: {missing}"
    assert sorted(ops - set(CASES)) == [], "add a CASES entry for each new forward op"
    assert set(CASES) <= ops


@pytest.mark.parametrize("op", sorted(CASES))
def test_op_exports(op: str, tmp_path: Path) -> None:
    forward, decls, feeds = CASES[op]
    model = Holder()
    params = {"w": np.asarray(model.init_params(2)["w"], np.float32).reshape(3, 5)}
    shapes = concrete(decls, B)
    tr = tg.trace_forward(model, forward, shapes)
    assert op in {n.op for n in tr.graph.nodes}, f"the case for {op} does not use it"
    ex = tg.export.torch(model, forward=forward, inputs=decls, params=params,
                         path=tmp_path / f"op_{op}.py")
    tmodel = import_export(ex, f"op_{op}")
    want = evaluate(tr.graph, {**params, **feeds, "__prng_seed": np.int32(1)})[tr.output]
    tmodel.eval()
    got = tmodel(**torch_inputs(feeds)).detach().numpy()
    assert got.shape == want.shape, ex.source
    if op == "dropout":
        assert np.array_equal(got, feeds["x"]), "eval mode: identity"
        tmodel.train()
        big = {"x": np.ones((4000, 3), np.float32)}
        drawn = tmodel(**torch_inputs(big)).detach().numpy()
        assert set(np.unique(drawn)) <= {0.0, np.float32(1 / 0.75)}
        assert abs((drawn == 0).mean() - 0.25) < 0.03
        return
    if op == "randn":
        big = tmodel(x=torch.zeros(20000, 3)).detach().numpy()
        assert abs(big.mean()) < 0.03 and abs(big.std() - 1) < 0.03
        return
    if op == "categorical_last":
        logits = np.log(np.array([[0.2, 0.3, 0.5]] * 20000, np.float32))
        picks = tmodel(x=torch.from_numpy(logits)).numpy()
        freq = np.bincount(picks, minlength=3) / len(picks)
        assert np.allclose(freq, [0.2, 0.3, 0.5], atol=0.02), freq
        return
    if want.dtype.kind in "ib":
        assert np.array_equal(got.astype(np.int64), want.astype(np.int64)), ex.source
    else:
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=ex.source)


# ---- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(n for n, o in OPS.items() if o.vjp == GRAD_ERROR))
def test_backward_and_optimizer_ops_are_clear_errors(op: str) -> None:
    node = Node(7, op, (), {}, (2, 3), "f32")
    with pytest.raises(ExportError, match=rf"op '{op}' \(node %7, f32\[2, 3\]\) is a "
                                          r"backward/optimizer op") as info:
        translate_node(node, [], _Ctx(None, "x"))
    assert info.value.op == op


def test_a_backward_op_in_a_forward_is_rejected_by_name() -> None:
    from tensorgrad.ops.registry import record

    def forward(m: Holder, x: tg.Tensor) -> tg.Tensor:
        return record("relu_grad", [x, x * 2.0])

    with pytest.raises(ExportError, match=r"op 'relu_grad' .*backward/optimizer op.*no torch "
                                          r"translation"):
        tg.export.torch(Holder(), forward=forward, inputs={"x": (None, 3)})


def test_a_state_leaf_is_rejected_by_name() -> None:
    node = Node(0, "state", (), {"name": "adam.m"}, (3,), "f32")
    with pytest.raises(ExportError, match=r"'state' leaf \('adam.m'\)") as info:
        translate_node(node, [], _Ctx(None, "x"))
    assert info.value.op == "state"


def test_a_size_that_is_not_affine_in_the_none_dim_is_a_clear_error() -> None:
    def forward(m: Holder, x: tg.Tensor) -> tg.Tensor:
        n = x.shape[0]
        return tg.sum(x) * tg.ones((n * n,))

    with pytest.raises(ExportError, match=r"\[9, 25, 49\] at None-dim sizes \[3, 5, 7\]: not "
                                          r"a \* N \+ c"):
        tg.export.torch(Holder(), forward=forward, inputs={"x": (None, 3)})
    # fixed shapes export fine
    ex = tg.export.torch(Holder(), forward=forward, inputs={"x": (4, 3)})
    assert "torch.ones" not in ex.source and ex.size_name is None


def test_a_forward_that_branches_on_the_none_dim_is_a_clear_error() -> None:
    def forward(m: Holder, x: tg.Tensor) -> tg.Tensor:
        return tg.relu(x) if x.shape[0] > 4 else x * 2.0

    with pytest.raises(ExportError, match="graph changes with the size of the None dim"):
        tg.export.torch(Holder(), forward=forward, inputs={"x": (None, 3)})


def test_module_without_inputs_and_wrong_objects() -> None:
    with pytest.raises(ExportError, match="inputs are required"):
        tg.export.torch(Holder())
    with pytest.raises(ExportError, match="expected a tg.Module or a training/forward handle"):
        tg.export.torch(object(), inputs={"x": (1,)})


def test_probe_sizes_the_model_refuses_are_explained() -> None:
    at = addition_transformer()

    def forward(m: Any, tokens: tg.Tensor) -> tg.Tensor:
        return m(tokens)

    with pytest.raises(ExportError, match=r"size\(s\) \[3, 5, 10\] failed \(pass probes="):
        tg.export.torch(at.AdditionTransformer(), forward=forward,
                        inputs={"tokens": ((1, None), "i32")}, probes=(3, 5, 10))
    ex = tg.export.torch(at.AdditionTransformer(), forward=forward,
                         inputs={"tokens": ((1, None), "i32")}, probes=(3, 5, 7))
    assert ex.size_name == "N" and "self.pos_emb[:N]" in ex.source
    model = ex.load()
    for t in (2, 9):
        assert tuple(model(torch.zeros(1, t, dtype=torch.int32)).shape) == (1, t, at.VOCAB)
