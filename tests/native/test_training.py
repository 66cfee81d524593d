"""End-to-end training of the demo models on a native WebGPU device.

- mlp_sin: the 1-64-64-1 MLP fits sin(x) (batch 256, Adam 5e-3) to loss < 0.01 in at most
  1000 steps (about 110 on lavapipe, ~30 steps/s).
- addition_transformer: a short run (8 steps, 1.5-4 s each on lavapipe) whose loss falls and
  whose first step matches the reference interpreter on the same params and batch.
- padded targets: a per-token tagger trained on a padded batch (targets -100 at the padding,
  cross_entropy's default ignore_index) follows the trajectory of the same model trained on
  the real positions alone, and of the same steps in PyTorch.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from typing import Any

import numpy as np

import tensorgrad as tg
from tests.models import addition_transformer, grad_ids, mlp_sin, reference_values


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class Tagger(tg.Module):
    """Per-token classes: Embedding(7, 8) -> tanh -> Linear(8, 5). A position's logits
    depend on its own token only, so a padded batch and its real positions train alike."""

    def __init__(self) -> None:
        self.emb = tg.Embedding(7, 8)
        self.out = tg.Linear(8, 5)

    def forward(self, tokens: tg.Tensor) -> tg.Tensor:
        return self.out(tg.tanh(self.emb(tokens)))


def tagger_loss(m: Tagger, tokens: tg.Tensor, targets: tg.Tensor) -> tg.Tensor:
    return tg.cross_entropy(m(tokens), targets)  # 'mean', ignore_index=-100


def padded_batches(steps: int, lengths: tuple[int, ...], width: int
                   ) -> list[dict[str, np.ndarray]]:
    """Random token rows of the given lengths, each token's class (token % 5) its target,
    padded to `width`: token 0 and target -100 at the padding."""
    rng = np.random.default_rng(4)
    out = []
    for _ in range(steps):
        tokens = np.zeros((len(lengths), width), np.int32)
        targets = np.full((len(lengths), width), -100, np.int32)
        for row, n in enumerate(lengths):
            tokens[row, :n] = rng.integers(0, 7, n)
            targets[row, :n] = tokens[row, :n] % 5
        out.append({"tokens": tokens, "targets": targets})
    return out


def torch_tagger_steps(params: dict[str, np.ndarray], batches: list[dict[str, np.ndarray]],
                       lr: float, momentum: float) -> tuple[list[float], dict[str, np.ndarray]]:
    """The same steps in PyTorch: F.cross_entropy with its default ignore_index (-100)."""
    import torch
    import torch.nn.functional as F

    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    opt = torch.optim.SGD(list(p.values()), lr=lr, momentum=momentum)
    losses = []
    for b in batches:
        tokens = torch.from_numpy(b["tokens"]).long()
        h = torch.tanh(p["emb.W"][tokens])
        logits = h @ p["out.W"] + p["out.b"]
        loss = F.cross_entropy(logits.reshape(-1, 5), torch.from_numpy(b["targets"]).long()
                               .reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().numpy() for k, v in p.items()}


def test_padded_targets_train_like_the_real_targets_alone_and_like_torch(gpu_device) -> None:
    lengths, width, steps, lr, momentum = (6, 3, 5, 1), 6, 8, 2.0, 0.9
    padded = padded_batches(steps, lengths, width)
    real = padded[0]["targets"] != -100
    packed = [{k: v[real] for k, v in b.items()} for b in padded]   # [15]: no padding

    async def trajectory(batches: list[dict[str, np.ndarray]], shape: tuple[int, ...]
                         ) -> tuple[list[float], dict[str, Any], dict[str, Any]]:
        train = await tg.compile(model=Tagger(), loss=tagger_loss,
                                 inputs={"tokens": (shape, "i32"), "targets": (shape, "i32")},
                                 optimizer=tg.optim.SGD(lr=lr, momentum=momentum), seed=3,
                                 device=gpu_device)
        p0 = await train.download_params()
        losses = []
        for b in batches:
            r = await train.step(**b)
            assert r.kind == "completed", r
            losses.append(r.loss)
        p1 = await train.download_params()
        train.destroy()
        return losses, p0, p1

    pad_losses, p0, pad_params = run(trajectory(padded, (len(lengths), width)))
    real_losses, q0, real_params = run(trajectory(packed, (int(real.sum()),)))
    torch_losses, torch_params = torch_tagger_steps(p0, padded, lr, momentum)
    assert all(np.array_equal(p0[k], q0[k]) for k in p0)   # same seed, same start
    np.testing.assert_allclose(pad_losses, real_losses, rtol=1e-5)
    np.testing.assert_allclose(pad_losses, torch_losses, rtol=1e-5)
    assert pad_losses[-1] < 0.9 * pad_losses[0], pad_losses   # it learns
    for k in p0:
        np.testing.assert_allclose(pad_params[k], real_params[k], rtol=1e-5, atol=1e-6,
                                   err_msg=k)
        np.testing.assert_allclose(pad_params[k], torch_params[k], rtol=1e-4, atol=1e-5,
                                   err_msg=k)
    print(f"\npadded targets: loss {pad_losses[0]:.4f} -> {pad_losses[-1]:.4f}, as the "
          f"{int(real.sum())} real targets alone and torch")


def test_mlp_fits_sin(gpu_device) -> None:
    m = mlp_sin()

    async def go() -> None:
        train = await tg.compile(model=m.MLP(), loss=m.loss_fn, inputs=m.INPUTS,
                                 optimizer=m.optimizer(), seed=1, device=gpu_device)
        assert train.param_names == ["l1.W", "l1.b", "l2.W", "l2.b", "l3.W", "l3.b"]
        rng = random.Random(0)
        losses = []
        for _ in range(1000):
            r = await train.step(**m.batch(rng))
            assert r.kind == "completed", f"step {len(losses) + 1}: {r}"
            losses.append(r.loss)
            if r.loss < 0.01:
                break
        steps = len(losses)
        assert losses[-1] < 0.01, (f"loss {losses[-1]:.4g} after {steps} steps "
                                   f"(first {losses[0]:.4g})")
        print(f"\nmlp_sin: loss {losses[-1]:.4g} < 0.01 after {steps} steps")
        # the attached plot forward (wildcard batch) agrees with sin on the plot grid
        plot = await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS)
        xs = m.plot_xs()
        r = await plot.run(x=xs)
        assert r.kind == "completed" and r.output.shape == (len(xs), 1)
        err = float(np.mean((r.output[:, 0] - np.sin(np.asarray(xs, np.float64))) ** 2))
        assert err < 0.02, f"plot MSE {err:.4g} after {steps} steps"
        train.destroy()

    run(go())


def test_addition_transformer_short_run(gpu_device) -> None:
    m = addition_transformer()
    steps = 8

    async def go() -> None:
        t0 = time.perf_counter()
        train = await tg.compile(model=m.AdditionTransformer(), loss=m.loss_fn,
                                 inputs=m.INPUTS, optimizer=m.optimizer(), seed=7,
                                 device=gpu_device)
        rng = random.Random(0)
        first_batch = m.batch(rng)
        p0 = await train.download_params()
        r = await train.step(**first_batch)
        assert r.kind == "completed", r

        # first step against the reference interpreter: same params, same batch
        values = reference_values(train, {**p0, **first_batch})
        ref_loss = float(values[train.ir.outputs[0]])
        assert math.isclose(r.loss, ref_loss, rel_tol=1e-4), (r.loss, ref_loss)
        assert abs(r.loss - math.log(m.VOCAB)) < 0.5  # near-uniform predictions at init
        grads = await train.download_param_grads()
        for name, gid in grad_ids(train).items():
            want = np.asarray(values[gid], np.float64)
            err = float(np.max(np.abs(grads[name] - want)))
            assert err <= 1e-3 * float(np.max(np.abs(want))), f"grad of {name}: {err:.3g}"
        for name, cap in r.captures.items():
            ref = values[train.ir.captures[name]]
            assert cap.shape == ref.shape
            np.testing.assert_allclose(cap, ref, rtol=1e-3, atol=1e-5, err_msg=name)
        attn = r.captures["attn.0"]
        assert attn.shape == (m.BATCH, m.HEADS, m.T, m.T)
        np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-5)
        assert np.all(np.triu(attn[0, 0], 1) == 0)  # causal

        losses = [r.loss]
        for _ in range(steps - 1):
            r = await train.step(**m.batch(rng))
            assert r.kind == "completed", r
            losses.append(r.loss)
        elapsed = time.perf_counter() - t0
        assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.2, losses
        assert losses[-1] < 0.85 * losses[0], losses

        # the attached i32 predict forward runs on the trained params
        predict = await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS,
                                     output="i32")
        out = await predict.run(tokens=first_batch["tokens"][: 2 * m.T])
        assert out.kind == "completed" and out.output.dtype == np.int32
        assert out.output.shape == (2, m.T)
        assert np.all((out.output >= 0) & (out.output < m.VOCAB))
        print(f"\naddition_transformer: {steps} steps in {elapsed:.1f} s, loss "
              f"{losses[0]:.4f} -> {losses[-1]:.4f}")
        train.destroy()

    run(go())
