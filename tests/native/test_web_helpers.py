"""tensorgrad.web's script-mode helpers natively: train_steps streams every loss, in order,
and honours a stop request; import_source imports a module from a path."""

from __future__ import annotations

import array
import asyncio
import random

import tensorgrad as tg
from tensorgrad import web
from tests.models import ROOT, mlp_sin


def test_train_steps_streams_losses_and_stops(gpu_device, monkeypatch) -> None:
    mod = mlp_sin()
    posts: list[dict] = []
    monkeypatch.setattr(web.script, "_sink", posts.append)  # as set_sink does; restored after

    async def go() -> tuple[web.TrainingRun, list[float], list[tuple[int, float]]]:
        train = await tg.compile(model=mod.MLP(), loss=mod.loss_fn, inputs=mod.INPUTS,
                                 optimizer=mod.optimizer(), device=gpu_device, seed=5)
        rng = random.Random(5)
        losses: list[float] = []
        marks: list[tuple[int, float]] = []

        async def every(step: int, loss: float, rate: float) -> None:
            marks.append((step, loss))
            assert rate > 0

        run = await web.train_steps(train, lambda: mod.batch(rng), 50, start_step=10,
                                    every=7, on_every=every, losses=losses,
                                    should_stop=lambda: len(losses) >= 30, max_pending=4)
        train.destroy()
        return run, losses, marks

    run, losses, marks = asyncio.run(go())
    assert run.run_steps == 30 and run.step == 40 and run.stopped
    assert run.last_loss == losses[-1] and run.steps_per_s > 0
    assert marks == [(s, losses[s - 11]) for s in (14, 21, 28, 35)]
    streamed = [p for p in posts if p["kind"] == "loss"]
    assert streamed[0]["step"] == 11
    flat = [v for p in streamed for v in p["losses"]]
    assert flat == list(array.array("f", losses))  # every loss once, in order, as float32
    steps = [p["step"] for p in streamed]
    sizes = [len(p["losses"]) for p in streamed]
    assert all(a + n == b for a, n, b in zip(steps, sizes, steps[1:]))


def test_import_source_from_a_path() -> None:
    mod = asyncio.run(web.import_source("tg_test_demo_model", "",
                                        ROOT / "demos" / "mlp_sin" / "model.py"))
    assert mod.BATCH == 256 and issubclass(mod.MLP, tg.Module)
