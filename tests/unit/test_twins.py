"""PyTorch twins: whole models whose loss and EVERY param gradient match PyTorch autograd.

The tensorgrad side is traced with `tg.trace` (forward + autograd + DCE) and evaluated by the
reference interpreter; the PyTorch side is written independently with the same weights
(tensorgrad's `Linear.W` is ``[in, out]``, so the twin computes ``x @ W`` with that same
array; a PyTorch ``nn.Linear`` would hold ``W.T``).

Precision: both sides run in float64 (the reference interpreter with
``float_dtype=np.float64``, torch with float64 tensors), so the comparison measures the op
semantics and gradient formulas, not float32 rounding; the bar is 1e-5 relative per element
(atol 1e-9 times the tensor's largest magnitude, for entries that are exactly 0 on one side).
A float32 run of the reference is also checked against the float64 twin at a float32-sized
tolerance (1e-4 relative to the tensor's scale) to show the f32 path agrees as well.
No GPU.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import tensorgrad as tg
from tensorgrad.reference import evaluate
from tests.models import addition_transformer

RTOL = 1e-5


def _assert_close(name: str, got: np.ndarray, want: np.ndarray, rtol: float = RTOL,
                  scale_atol: float = 1e-9) -> None:
    got = np.asarray(got, np.float64).reshape(want.shape)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    assert scale > 0 or np.all(got == 0), f"{name}: reference is all zeros"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=scale_atol * max(scale, 1e-30),
                               err_msg=f"{name} differs from the PyTorch twin")


def _random_params(model: tg.Module, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Non-trivial values for every param (norm gains not 1, biases not 0)."""
    out = {}
    for name, spec in model.named_params().items():
        v = rng.standard_normal(spec.shape) * (0.3 if len(spec.shape) > 1 else 0.2)
        if name.endswith(".g"):
            v = 1.0 + v
        out[name] = v.astype(np.float32)
    return out


def _tg_loss_and_grads(model: tg.Module, loss_fn, inputs: dict, feeds: dict,
                       float_dtype=np.float64) -> tuple[float, dict[str, np.ndarray]]:
    tr = tg.trace(model, loss_fn, inputs, seed=0)
    assert set(tr.grads) == set(tr.params), "every param must get a gradient"
    values = evaluate(tr.graph, feeds, float_dtype=float_dtype)
    return float(values[tr.loss]), {n: values[g] for n, g in tr.grads.items()}


def _torch_params(params: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
            for k, v in params.items()}


def _compare(model, loss_fn, inputs, params, data, torch_loss) -> None:
    tp = _torch_params(params)
    t_loss = torch_loss(tp, {k: torch.from_numpy(np.asarray(v)) for k, v in data.items()})
    t_loss.backward()
    want_grads = {k: v.grad.numpy() for k, v in tp.items()}
    feeds = {**params, **data}

    loss64, grads64 = _tg_loss_and_grads(model, loss_fn, inputs, feeds, np.float64)
    _assert_close("loss", np.array(loss64), np.array(t_loss.item()))
    assert set(grads64) == set(want_grads)
    for name, want in want_grads.items():
        assert float(np.max(np.abs(want))) > 0, f"twin gradient of {name} is all zeros"
        _assert_close(f"grad of {name}", grads64[name], want)

    loss32, grads32 = _tg_loss_and_grads(model, loss_fn, inputs, feeds, np.float32)
    assert math.isclose(loss32, t_loss.item(), rel_tol=1e-5)
    for name, want in want_grads.items():
        scale = float(np.max(np.abs(want)))
        err = float(np.max(np.abs(np.asarray(grads32[name], np.float64) - want)))
        assert err <= 1e-4 * scale, f"float32 grad of {name}: max error {err} vs scale {scale}"


# ---- 2-layer MLP ---------------------------------------------------------------------------

class MLP2(tg.Module):
    def __init__(self) -> None:
        self.l1 = tg.Linear(5, 16)
        self.l2 = tg.Linear(16, 3)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l2(tg.tanh(self.l1(x)))


def mlp_loss(m: MLP2, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(m(x) - y))


def torch_mlp_loss(p: dict[str, torch.Tensor], d: dict[str, torch.Tensor]) -> torch.Tensor:
    x, y = d["x"].double(), d["y"].double()
    h = torch.tanh(x @ p["l1.W"] + p["l1.b"])       # W is [in, out]: x @ W
    out = h @ p["l2.W"] + p["l2.b"]
    return torch.mean((out - y) ** 2)


def test_mlp_matches_torch() -> None:
    rng = np.random.default_rng(1)
    model = MLP2()
    params = _random_params(model, rng)
    assert params["l1.W"].shape == (5, 16)  # [in, out], the transpose of torch's layout
    data = {"x": rng.standard_normal((7, 5)).astype(np.float32),
            "y": rng.standard_normal((7, 3)).astype(np.float32)}
    _compare(model, mlp_loss, {"x": (7, 5), "y": (7, 3)}, params, data, torch_mlp_loss)


def test_mlp_twin_uses_torch_linear_layout() -> None:
    """The same MLP through torch.nn.Linear (weight = W.T) gives the same loss and the
    transposed gradient: the [in, out] layout is what the twin assumes."""
    rng = np.random.default_rng(2)
    model = MLP2()
    params = _random_params(model, rng)
    x = rng.standard_normal((4, 5))
    y = rng.standard_normal((4, 3))
    l1, l2 = torch.nn.Linear(5, 16).double(), torch.nn.Linear(16, 3).double()
    with torch.no_grad():
        l1.weight.copy_(torch.from_numpy(params["l1.W"].T.astype(np.float64)))
        l1.bias.copy_(torch.from_numpy(params["l1.b"].astype(np.float64)))
        l2.weight.copy_(torch.from_numpy(params["l2.W"].T.astype(np.float64)))
        l2.bias.copy_(torch.from_numpy(params["l2.b"].astype(np.float64)))
    loss = torch.mean((l2(torch.tanh(l1(torch.from_numpy(x)))) - torch.from_numpy(y)) ** 2)
    loss.backward()
    got_loss, grads = _tg_loss_and_grads(model, mlp_loss, {"x": (4, 5), "y": (4, 3)},
                                         {**params, "x": x, "y": y})
    _assert_close("loss", np.array(got_loss), np.array(loss.item()))
    _assert_close("grad of l1.W", grads["l1.W"], l1.weight.grad.numpy().T)
    _assert_close("grad of l2.W", grads["l2.W"], l2.weight.grad.numpy().T)
    _assert_close("grad of l2.b", grads["l2.b"], l2.bias.grad.numpy())


# ---- the addition demo's transformer -------------------------------------------------------
# demos/addition_transformer/model.py itself (3 pre-LayerNorm blocks, D = 64, 4 heads, tied
# LM head, loss on the answer positions), against a PyTorch twin written from its docstring.

AT = addition_transformer()
B = 3


def _ln(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, g.shape, g, b, eps=1e-5)


def torch_tf_loss(p: dict[str, torch.Tensor], d: dict[str, torch.Tensor]) -> torch.Tensor:
    tokens, targets, mask = d["tokens"].long(), d["targets"].long(), d["mask"].double()
    b, t = tokens.shape
    heads = AT.HEADS
    x = p["tok_emb"][tokens] + p["pos_emb"][:t]                       # [B, T, D]

    def split(z: torch.Tensor) -> torch.Tensor:                       # [B, H, T, D/H]
        return z.reshape(b, t, heads, AT.D // heads).transpose(1, 2)

    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(AT.LAYERS):
        w = {k[len(f"blocks.{i}."):]: v for k, v in p.items() if k.startswith(f"blocks.{i}.")}
        h = _ln(x, w["ln1.g"], w["ln1.b"])
        q, k, v = (split(h @ w[f"{n}.W"]) for n in "qkv")
        scores = q @ k.transpose(-1, -2) / math.sqrt(AT.D // heads)
        att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        x = x + (att @ v).transpose(1, 2).reshape(b, t, AT.D) @ w["o.W"]
        u = torch.relu(_ln(x, w["ln2.g"], w["ln2.b"]) @ w["up.W"] + w["up.b"])
        x = x + u @ w["down.W"] + w["down.b"]
    logits = _ln(x, p["ln_f.g"], p["ln_f.b"]) @ p["tok_emb"].T
    ce = torch.nn.functional.cross_entropy(logits.reshape(b * t, AT.VOCAB), targets.reshape(-1),
                                           reduction="none").reshape(b, t)
    return (ce * mask).sum() / (b * (t - AT.ANSWER_FROM))


def _addition_data(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Random tokens and targets, the answer mask; and the inputs declaration."""
    data = {"tokens": rng.integers(0, AT.VOCAB, (B, AT.T)).astype(np.int32),
            "targets": rng.integers(0, AT.VOCAB, (B, AT.T)).astype(np.int32),
            "mask": np.asarray(AT.answer_mask(), np.float32)}
    inputs = {"tokens": ((B, AT.T), "i32"), "targets": ((B, AT.T), "i32"), "mask": (AT.T,)}
    return data, inputs


def test_transformer_block_matches_torch() -> None:
    rng = np.random.default_rng(3)
    model = AT.AdditionTransformer()
    params = _random_params(model, rng)
    assert len(params) == 4 + 12 * AT.LAYERS  # embeddings, final norm, 12 per block
    data, inputs = _addition_data(rng)
    _compare(model, AT.loss_fn, inputs, params, data, torch_tf_loss)


@pytest.mark.parametrize("twin", ["mlp", "transformer"])
def test_twin_detects_a_wrong_gradient(twin: str) -> None:
    """The comparison is sharp: perturbing one weight by 1e-3 breaks the 1e-5 bar."""
    rng = np.random.default_rng(4)
    if twin == "mlp":
        model, loss_fn, torch_loss = MLP2(), mlp_loss, torch_mlp_loss
        data = {"x": rng.standard_normal((7, 5)).astype(np.float32),
                "y": rng.standard_normal((7, 3)).astype(np.float32)}
        inputs = {"x": (7, 5), "y": (7, 3)}
        key = "l1.W"
    else:
        model, loss_fn, torch_loss = AT.AdditionTransformer(), AT.loss_fn, torch_tf_loss
        data, inputs = _addition_data(rng)
        key = "blocks.0.q.W"
    params = _random_params(model, rng)
    wrong = dict(params)
    wrong[key] = params[key] + np.float32(1e-3)
    with pytest.raises(AssertionError):
        tp = _torch_params(wrong)
        t_loss = torch_loss(tp, {k: torch.from_numpy(v) for k, v in data.items()})
        t_loss.backward()
        _, grads = _tg_loss_and_grads(model, loss_fn, inputs, {**params, **data})
        _assert_close(f"grad of {key}", grads[key], tp[key].grad.numpy())
