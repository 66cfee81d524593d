"""The PyScript worker demo: this file runs in PyScript's Web Worker (``<script type="py"
worker>``), and tensorgrad runs in-process there: ``tg.compile`` and every step use the
worker's own ``navigator.gpu``; no second worker, no second Pyodide.

The page's main thread only draws (the demos' shared shell): each message posted with
``xworker.postMessage`` (a JSON string) carries the losses since the last one, and every
``every`` steps the model's fit over a grid. URL
parameters: ``steps`` (most steps, 2000), ``target`` (stop once the mean of the last 10 losses
is below it, 0.01), ``seed`` (1), ``every`` (post every N steps, 25).
"""

import asyncio
import json
import math
import random
import time

import js
from polyscript import xworker
from pyodide.ffi import create_proxy

import tensorgrad as tg

BATCH, GRID = 256, 200
DEFAULTS = {"steps": 2000, "target": 0.01, "seed": 1, "every": 25}


class MLP(tg.Module):
    def __init__(self) -> None:
        self.l1, self.l2, self.l3 = tg.Linear(1, 64), tg.Linear(64, 64), tg.Linear(64, 1)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l3(tg.relu(self.l2(tg.relu(self.l1(x)))))


def loss_fn(model: MLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(model(x) - y))


def post(kind: str, **data: object) -> None:
    """Send one message to the page (it draws; this worker computes)."""
    xworker.postMessage(json.dumps({"kind": kind, **data}))


# The page's answer to "hello": "tg-config:" and its query string (the worker's own location
# is a blob: URL). Read from the worker's message events: PyScript's `xworker.onmessage` missed
# an answer that came while this script was still starting.
CONFIG = "tg-config:"
ANSWER = asyncio.get_event_loop().create_future()


def on_message(event: object) -> None:
    data = event.data
    if isinstance(data, str) and data.startswith(CONFIG) and not ANSWER.done():
        ANSWER.set_result(data[len(CONFIG):])


js.addEventListener("message", create_proxy(on_message))


async def settings() -> dict:
    """DEFAULTS, overridden by the page's URL parameters (asked for with "hello")."""
    post("hello")
    params = js.URLSearchParams.new(await ANSWER)
    cfg = dict(DEFAULTS)
    for key, value in DEFAULTS.items():
        if params.has(key):
            given = float(params.get(key))
            cfg[key] = int(given) if isinstance(value, int) else given
    return cfg


async def fit_of(predict: tg.Forward, step: int) -> dict:
    """The model over the plot grid against sin(x): {step, xs, target, pred, mse}."""
    xs = [-math.pi + 2 * math.pi * i / (GRID - 1) for i in range(GRID)]
    out = (await predict.run(x=xs)).output
    pred = [float(v) for v in memoryview(out).cast("B").cast("f")]
    target = [math.sin(x) for x in xs]
    mse = sum((p - t) ** 2 for p, t in zip(pred, target)) / GRID
    return {"step": step, "xs": xs, "target": target, "pred": pred, "mse": mse}


async def main() -> None:
    """Check WebGPU, compile, train until the target, post progress and the fit."""
    t_up = time.perf_counter()
    cfg = await settings()
    support = await tg.check_webgpu()
    post("ready", message=support.message, mode=support.mode, adapter=support.adapter)
    if not support.ok:
        raise RuntimeError(support.message)
    t0 = time.perf_counter()
    train = await tg.compile(model=MLP(), loss=loss_fn, inputs={"x": (BATCH, 1), "y": (BATCH, 1)},
                             optimizer=tg.optim.Adam(lr=5e-3), seed=cfg["seed"])
    predict = await train.attach(forward=lambda m, x: m(x), inputs={"x": (None, 1)})
    post("compiled", ms=1000 * (time.perf_counter() - t0), kernels=train.kernel_count,
         device=train.device.description)
    post("fit", fit=await fit_of(predict, 0))
    rng = random.Random(cfg["seed"])
    losses: list[float] = []
    sent, reached, t1 = 0, None, time.perf_counter()
    for step in range(1, cfg["steps"] + 1):
        xs = [rng.uniform(-math.pi, math.pi) for _ in range(BATCH)]
        match await train.step(x=xs, y=[math.sin(v) for v in xs]):
            case tg.Completed(loss=loss):
                losses.append(loss)
            case other:
                raise RuntimeError(f"step {step}: {other}")
        if step == 1:
            post("first-step", ms=1000 * (time.perf_counter() - t_up))
        avg10 = sum(losses[-10:]) / len(losses[-10:])
        if avg10 < cfg["target"] and step >= 10:
            reached = step
        if reached or step % cfg["every"] == 0 or step == cfg["steps"]:
            post("losses", start=sent, values=losses[sent:],
                 rate=step / (time.perf_counter() - t1))
            sent = len(losses)
            if not reached:
                post("fit", fit=await fit_of(predict, step))
        if reached:
            break
    fit = await fit_of(predict, len(losses))
    post("done", fit=fit, figures={
        "steps": len(losses), "steps_to_target": reached, "loss_avg10": avg10,
        "fit_mse": fit["mse"], "kernels": train.kernel_count, "device": train.device.description,
        "mode": support.mode, "steps_per_s": len(losses) / (time.perf_counter() - t1)})
    train.destroy()


async def run() -> None:
    try:
        await main()
    except Exception as exc:  # noqa: BLE001 (the page reports it)
        post("failed", error=f"{type(exc).__name__}: {exc}")


asyncio.ensure_future(run())
