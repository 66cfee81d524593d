"""`await tg.export.torch(handle, ...)` on a native WebGPU device: the weights a training
(or forward) handle holds after real GPU steps are downloaded, and the exported torch module
reproduces the handle's own forward run on the GPU."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tensorgrad as tg
from tests.models import mlp_sin


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_export_a_trained_handle_matches_its_gpu_forward(gpu_device: Any, tmp_path: Path) -> None:
    m = mlp_sin()

    async def go() -> tuple[Any, Any, Any, Any]:
        train = await tg.compile(model=m.MLP(), loss=m.loss_fn, inputs=m.INPUTS,
                                 optimizer=m.optimizer(), device=gpu_device, seed=1)
        rng = random.Random(1)
        for _ in range(20):
            result = await train.step(**m.batch(rng))
            assert result.kind == "completed", result
        predict = await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS)
        xs = np.linspace(-3, 3, 50, dtype=np.float32).reshape(50, 1)
        out = await predict.run(x=xs)
        ex = await tg.export.torch(train, forward=m.predict_fn, inputs=m.PREDICT_INPUTS,
                                   path=tmp_path / "trained.py")
        ex_fwd = await tg.export.torch(predict, path=tmp_path / "from_forward.py")
        params = await train.download_params()
        train.destroy()
        return ex, ex_fwd, xs, (out.output, params)

    ex, ex_fwd, xs, (gpu_out, params) = run(go())
    model = ex.load()
    for name, value in params.items():  # the trained weights, not the init
        assert np.array_equal(model.state_dict()[name].numpy(), np.asarray(value)), name
    init = m.MLP().init_params(1)
    assert not np.array_equal(np.asarray(init["l1.W"]), np.asarray(params["l1.W"]).reshape(-1))
    got = model(torch.from_numpy(xs)).detach().numpy()
    err = float(np.max(np.abs(got - gpu_out)))
    print(f"\nexported trained MLP vs the GPU forward ({gpu_device.description}): "
          f"max abs {err:.2e}")
    assert err < 1e-5, err
    assert ex_fwd.source == ex.source.replace('"trained', '"from_forward').replace(
        "from trained import", "from from_forward import")
