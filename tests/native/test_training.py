"""End-to-end training of the demo models on a native WebGPU device.

- mlp_sin: the 1-64-64-1 MLP fits sin(x) (batch 256, Adam 5e-3) to loss < 0.01 in at most
  1000 steps (about 110 on lavapipe, ~30 steps/s).
- addition_transformer: a short run (8 steps, 1.5-4 s each on lavapipe) whose loss falls and
  whose first step matches the reference interpreter on the same params and batch.
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
