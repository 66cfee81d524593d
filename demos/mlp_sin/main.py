"""The mlp_sin demo's script: train the MLP of model.py to fit sin(x), streaming progress.

The page runs this file with ``session.runScript`` (script mode): it sets ``DEMO_CONFIG``
first, then awaits ``main()``; ``tensorgrad.web.post`` streams to the page

    {kind: "log", text}                        a progress line (the page logs it)
    {kind: "setup", xs, target, kernels, ...}  the plot's x grid and sin(x), once per run
    {kind: "loss", step, losses}               per-step losses (Float32Array) from `step`
    {kind: "fit", step, pred}                  the model's prediction over `xs`

``CONTROL["stop"] = True`` (the page's Stop) ends the run after the current step; ``reset()``
restores the initial params and optimizer state. State lives in the worker's namespace, so
Start after Stop continues. Natively: ``python demos/mlp_sin/main.py steps=300 seed=1``.
"""

from __future__ import annotations

import array
import math
import random
import sys
import time
from pathlib import Path

import tensorgrad as tg
from tensorgrad.web import flat_buffer, import_source, in_pyodide, post, train_steps

DEFAULTS = {"steps": 2000, "seed": 1, "every": 100}
STATE: dict = globals().setdefault("STATE", {})          # survives re-runs in the worker
CONTROL: dict = globals().setdefault("CONTROL", {"stop": False})


def config() -> dict:
    return {**DEFAULTS, **(globals().get("DEMO_CONFIG") or {})}


def log(text: str) -> None:
    post({"kind": "log", "text": text})


async def load_model(cfg: dict):
    """model.py as the module `mlp_sin_model` (fetched into the worker in the browser)."""
    if "model" not in STATE:
        here = Path(globals().get("__file__", "demos/mlp_sin/main.py"))
        STATE["model"] = await import_source("mlp_sin_model", cfg.get("model_url", ""),
                                             here.with_name("model.py"))
    return STATE["model"]


async def setup(cfg: dict) -> None:
    """Compile the training step and the attached forward (once per worker)."""
    m = await load_model(cfg)
    if "train" in STATE:
        return
    t0 = time.perf_counter()
    train = await tg.compile(model=m.MLP(), loss=m.loss_fn, inputs=m.INPUTS,
                             optimizer=m.optimizer(), seed=cfg["seed"])
    compile_ms = 1000 * (time.perf_counter() - t0)
    predict = await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS)
    xs = m.plot_xs()
    STATE.update(train=train, predict=predict, xs=xs, step=0, compile_ms=compile_ms,
                 rng=random.Random(cfg["seed"]), losses=[])
    params = sum(s.size for s in train._store.specs.values()) if train._store else 0
    log(f"compiled in {compile_ms:.0f} ms: {train.kernel_count} kernels, {params} params, "
        f"batch {m.BATCH}, {train.device.description}")


async def fit_update() -> float:
    """Post the prediction over the plot grid; the mean squared error against sin(x)."""
    xs = STATE["xs"]
    result = await STATE["predict"].run(x=xs)
    if result.kind != "completed":
        raise RuntimeError(f"predict: {getattr(result, 'error', result.kind)}")
    pred = array.array("f", flat_buffer(result.output).tolist())
    post({"kind": "fit", "step": STATE["step"], "pred": pred})
    return sum((p - math.sin(x)) ** 2 for p, x in zip(pred, xs)) / len(xs)


async def reset() -> None:
    """Initial params (same seed), fresh optimizer state, step 0."""
    if "train" in STATE:
        await STATE["train"].reset()
        STATE.update(step=0, rng=random.Random(config()["seed"]), losses=[])


async def main() -> dict:
    cfg = config()
    CONTROL["stop"] = False
    await setup(cfg)
    m, train = STATE["model"], STATE["train"]
    xs = STATE["xs"]
    post({"kind": "setup", "xs": xs, "target": array.array("f", [math.sin(x) for x in xs]),
          "kernels": train.kernel_count, "compileMs": STATE["compile_ms"]})
    if STATE["step"] == 0:
        await fit_update()
    rng, losses = STATE["rng"], STATE["losses"]

    async def progress(step: int, loss: float, rate: float) -> None:
        STATE["step"] = step
        mse = await fit_update()
        log(f"step {step:5d}  loss {loss:.5f}  fit mse {mse:.5f}  {rate:.1f} steps/s")

    run = await train_steps(train, lambda: m.batch(rng), int(cfg["steps"]),
                            start_step=STATE["step"], every=int(cfg["every"]),
                            on_every=progress, should_stop=lambda: CONTROL["stop"],
                            losses=losses)
    STATE["step"] = run.step
    mse = await fit_update()
    recent = losses[-10:]
    return {
        "steps": run.step, "run_steps": run.run_steps, "stopped": run.stopped,
        "loss": losses[-1] if losses else None,
        "loss_avg10": sum(recent) / len(recent) if recent else None,
        "fit_mse": mse, "steps_per_s": run.steps_per_s,
        "wall_steps_per_s": run.wall_steps_per_s,
        "compile_ms": STATE["compile_ms"], "kernels": train.kernel_count,
    }


if __name__ == "__main__" and not in_pyodide():  # native: python main.py steps=300 seed=1
    import asyncio

    DEMO_CONFIG = {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
    tg.web.set_sink(lambda d: print(d["text"]) if d.get("kind") == "log" else None)
    print(asyncio.run(main()))
