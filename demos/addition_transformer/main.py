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

import random
import sys
import time
from pathlib import Path

import tensorgrad as tg
from tensorgrad.web import import_source, in_pyodide, post, train_steps

DEFAULTS = {"steps": 1500, "seed": 1, "every": 100, "eval": 500}
TABLE_ROWS = 10
STATE: dict = globals().setdefault("STATE", {})          # survives re-runs in the worker
CONTROL: dict = globals().setdefault("CONTROL", {"stop": False})


def config() -> dict:
    return {**DEFAULTS, **(globals().get("DEMO_CONFIG") or {})}


def log(text: str) -> None:
    post({"kind": "log", "text": text})


async def load_model(cfg: dict):
    """model.py as the module `addition_transformer_model` (fetched into the worker in the
    browser)."""
    if "model" not in STATE:
        here = Path(globals().get("__file__", "demos/addition_transformer/main.py"))
        STATE["model"] = await import_source("addition_transformer_model",
                                             cfg.get("model_url", ""),
                                             here.with_name("model.py"))
    return STATE["model"]


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

    async def progress(step: int, loss: float, rate: float) -> None:
        STATE["step"] = step
        ev = await evaluate()
        log(f"step {step:5d}  loss {loss:.4f}  train acc {ev['trainAcc']:.1%}  "
            f"test acc {ev['testAcc']:.1%}  {rate:.2f} steps/s")

    run = await train_steps(train, lambda: m.batch(rng), int(cfg["steps"]),
                            start_step=STATE["step"], every=int(cfg["every"]),
                            on_every=progress, should_stop=lambda: CONTROL["stop"],
                            losses=losses, max_pending=20)
    STATE["step"] = run.step
    if not STATE["evals"] or STATE["evals"][-1]["step"] != STATE["step"]:
        await evaluate()
    last = STATE["evals"][-1]
    recent = losses[-10:]
    return {
        "steps": run.step, "run_steps": run.run_steps, "stopped": run.stopped,
        "loss": losses[-1] if losses else None,
        "loss_avg10": sum(recent) / len(recent) if recent else None,
        "train_acc": last["trainAcc"], "test_acc": last["testAcc"],
        "eval_pairs": len(STATE["test_sample"]),
        "steps_per_s": run.steps_per_s, "wall_steps_per_s": run.wall_steps_per_s,
        "compile_ms": STATE["compile_ms"], "kernels": train.kernel_count,
        "params": STATE["params"],
    }


if __name__ == "__main__" and not in_pyodide():  # native: python main.py steps=5 eval=32
    import asyncio

    DEMO_CONFIG = {k: int(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
    tg.web.set_sink(lambda d: print(d["text"]) if d.get("kind") == "log" else None)
    print(asyncio.run(main()))
