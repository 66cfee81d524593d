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
import importlib.util
import math
import random
import sys
import time
from pathlib import Path

import tensorgrad as tg
from tensorgrad.web import flat_buffer, in_pyodide, post

DEFAULTS = {"steps": 2000, "seed": 1, "every": 100}
STATE: dict = globals().setdefault("STATE", {})          # survives re-runs in the worker
CONTROL: dict = globals().setdefault("CONTROL", {"stop": False})


def config() -> dict:
    return {**DEFAULTS, **(globals().get("DEMO_CONFIG") or {})}


def log(text: str) -> None:
    post({"kind": "log", "text": text})


async def load_model(cfg: dict):
    """model.py as the module `mlp_sin_model`: fetched into the worker's filesystem in the
    browser, read from beside this file natively."""
    if "model" in STATE:
        return STATE["model"]
    if in_pyodide():
        from pyodide.http import pyfetch

        response = await pyfetch(cfg["model_url"])
        if not response.ok:
            raise OSError(f"GET {cfg['model_url']}: HTTP {response.status}")
        path = Path("/home/pyodide/demos/mlp_sin/model.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(await response.string())
    else:
        path = Path(globals().get("__file__", "demos/mlp_sin/main.py")).with_name("model.py")
    spec = importlib.util.spec_from_file_location("mlp_sin_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    STATE["model"] = module
    return module


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
    end = STATE["step"] + int(cfg["steps"])
    pending = array.array("f")
    train_s = 0.0
    run_steps = 0
    t_run = t_mark = t_post = time.perf_counter()
    mark_step = STATE["step"]

    def flush() -> None:
        nonlocal pending, t_post
        if pending:
            post({"kind": "loss", "step": STATE["step"] - len(pending) + 1, "losses": pending})
        pending, t_post = array.array("f"), time.perf_counter()

    while STATE["step"] < end and not CONTROL["stop"]:
        t0 = time.perf_counter()
        result = await train.step(**m.batch(rng))
        train_s += time.perf_counter() - t0
        if result.kind != "completed":
            flush()
            raise RuntimeError(f"step {STATE['step'] + 1} {result.kind}: "
                               f"{getattr(result, 'error', '')}")
        STATE["step"] += 1
        run_steps += 1
        losses.append(result.loss)
        pending.append(result.loss)
        now = time.perf_counter()
        if len(pending) >= 50 or now - t_post > 0.25:
            flush()
        step = STATE["step"]
        if step % int(cfg["every"]) == 0:
            flush()
            mse = await fit_update()
            rate = (step - mark_step) / (time.perf_counter() - t_mark)
            log(f"step {step:5d}  loss {result.loss:.5f}  fit mse {mse:.5f}  {rate:.1f} steps/s")
            t_mark, mark_step = time.perf_counter(), step
    flush()
    mse = await fit_update()
    wall = time.perf_counter() - t_run
    recent = losses[-10:]
    return {
        "steps": STATE["step"], "run_steps": run_steps, "stopped": bool(CONTROL["stop"]),
        "loss": losses[-1] if losses else None,
        "loss_avg10": sum(recent) / len(recent) if recent else None,
        "fit_mse": mse,
        "steps_per_s": run_steps / train_s if train_s else None,
        "wall_steps_per_s": run_steps / wall if wall else None,
        "compile_ms": STATE["compile_ms"], "kernels": train.kernel_count,
    }


if __name__ == "__main__" and not in_pyodide():  # native: python main.py steps=300 seed=1
    import asyncio

    DEMO_CONFIG = {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
    tg.web.set_sink(lambda d: print(d["text"]) if d.get("kind") == "log" else None)
    print(asyncio.run(main()))
