"""The addition_transformer demo's script: train the transformer of model.py on 2-digit sums.

The page runs this file with ``session.runScript`` (script mode): it sets ``DEMO_CONFIG``
first, then awaits ``main()``; ``tensorgrad.web.post`` streams to the page

    {kind: "log", text}                             a progress line (the page logs it)
    {kind: "setup", kernels, compileMs, params}     once per run
    {kind: "loss", step, losses}                    per-step losses (Float32Array)
    {kind: "eval", step, trainAcc, testAcc, table}  every `every` steps: accuracy on `eval`
                                                    train and held-out pairs, and the greedy
                                                    answers for 10 held-out pairs

``CONTROL["stop"] = True`` (the page's Stop) ends the run after the current step; ``reset()``
restores the initial params and optimizer state. State lives in the worker's namespace, so
Start after Stop continues. Natively: ``python demos/addition_transformer/main.py steps=5``.
"""

from __future__ import annotations

import array
import importlib.util
import random
import sys
import time
from pathlib import Path

import tensorgrad as tg
from tensorgrad.web import in_pyodide, post

DEFAULTS = {"steps": 1500, "seed": 1, "every": 100, "eval": 500}
TABLE_ROWS = 10
STATE: dict = globals().setdefault("STATE", {})          # survives re-runs in the worker
CONTROL: dict = globals().setdefault("CONTROL", {"stop": False})


def config() -> dict:
    return {**DEFAULTS, **(globals().get("DEMO_CONFIG") or {})}


def log(text: str) -> None:
    post({"kind": "log", "text": text})


async def load_model(cfg: dict):
    """model.py as the module `addition_transformer_model`: fetched into the worker's
    filesystem in the browser, read from beside this file natively."""
    if "model" in STATE:
        return STATE["model"]
    if in_pyodide():
        from pyodide.http import pyfetch

        response = await pyfetch(cfg["model_url"])
        if not response.ok:
            raise OSError(f"GET {cfg['model_url']}: HTTP {response.status}")
        path = Path("/home/pyodide/demos/addition_transformer/model.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(await response.string())
    else:
        path = Path(globals().get("__file__", "demos/addition_transformer/main.py"))
        path = path.with_name("model.py")
    spec = importlib.util.spec_from_file_location("addition_transformer_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    STATE["model"] = module
    return module


async def setup(cfg: dict) -> None:
    """Compile the training step and the attached greedy-prediction graph (once)."""
    m = await load_model(cfg)
    if "train" in STATE:
        return
    t0 = time.perf_counter()
    train = await tg.compile(model=m.AdditionTransformer(), loss=m.loss_fn, inputs=m.INPUTS,
                             optimizer=m.optimizer(), seed=cfg["seed"])
    compile_ms = 1000 * (time.perf_counter() - t0)
    predict = await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS, output="i32")
    pick = random.Random(cfg["seed"] + 1000)
    size = max(TABLE_ROWS, int(cfg["eval"]))
    params = sum(s.size for s in train._store.specs.values()) if train._store else 0
    STATE.update(train=train, predict=predict, step=0, compile_ms=compile_ms, params=params,
                 rng=random.Random(cfg["seed"]), losses=[], evals=[],
                 test_sample=pick.sample(m.TEST_PAIRS, min(size, len(m.TEST_PAIRS))),
                 train_sample=pick.sample(m.TRAIN_PAIRS, min(size, len(m.TRAIN_PAIRS))))
    log(f"compiled in {compile_ms:.0f} ms: {train.kernel_count} kernels, {params} params, "
        f"batch {m.BATCH}, {train.device.description}")


async def evaluate() -> dict:
    """Accuracy on the train and held-out samples; greedy answers for the table's pairs
    (the first TABLE_ROWS held-out pairs of the sample)."""
    m, predict = STATE["model"], STATE["predict"]
    test = STATE["test_sample"]
    sums = await m.predict_sums(predict, test)
    test_acc = sum(s == a + b for s, (a, b) in zip(sums, test)) / len(test)
    train_acc = await m.accuracy(predict, STATE["train_sample"])
    table = [{"a": a, "b": b, "pred": s, "ok": s == a + b}
             for (a, b), s in zip(test[:TABLE_ROWS], sums)]
    result = {"step": STATE["step"], "trainAcc": train_acc, "testAcc": test_acc}
    STATE["evals"].append(result)
    post({"kind": "eval", **result, "table": table})
    return result


async def reset() -> None:
    """Initial params (same seed), fresh optimizer state (and LR schedule), step 0."""
    if "train" in STATE:
        await STATE["train"].reset()
        STATE.update(step=0, rng=random.Random(config()["seed"]), losses=[], evals=[])


async def main() -> dict:
    cfg = config()
    CONTROL["stop"] = False
    await setup(cfg)
    m, train = STATE["model"], STATE["train"]
    post({"kind": "setup", "kernels": train.kernel_count, "compileMs": STATE["compile_ms"],
          "params": STATE["params"], "evalPairs": len(STATE["test_sample"])})
    if STATE["step"] == 0:
        await evaluate()
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
        if len(pending) >= 20 or time.perf_counter() - t_post > 0.25:
            flush()
        step = STATE["step"]
        if step % int(cfg["every"]) == 0:
            flush()
            rate = (step - mark_step) / (time.perf_counter() - t_mark)
            ev = await evaluate()
            log(f"step {step:5d}  loss {result.loss:.4f}  train acc {ev['trainAcc']:.1%}  "
                f"test acc {ev['testAcc']:.1%}  {rate:.2f} steps/s")
            t_mark, mark_step = time.perf_counter(), step
    flush()
    if not STATE["evals"] or STATE["evals"][-1]["step"] != STATE["step"]:
        await evaluate()
    last = STATE["evals"][-1]
    wall = time.perf_counter() - t_run
    recent = losses[-10:]
    return {
        "steps": STATE["step"], "run_steps": run_steps, "stopped": bool(CONTROL["stop"]),
        "loss": losses[-1] if losses else None,
        "loss_avg10": sum(recent) / len(recent) if recent else None,
        "train_acc": last["trainAcc"], "test_acc": last["testAcc"],
        "eval_pairs": len(STATE["test_sample"]),
        "steps_per_s": run_steps / train_s if train_s else None,
        "wall_steps_per_s": run_steps / wall if wall else None,
        "compile_ms": STATE["compile_ms"], "kernels": train.kernel_count,
        "params": STATE["params"],
    }


if __name__ == "__main__" and not in_pyodide():  # native: python main.py steps=5 eval=32
    import asyncio

    DEMO_CONFIG = {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
    tg.web.set_sink(lambda d: print(d["text"]) if d.get("kind") == "log" else None)
    print(asyncio.run(main()))
