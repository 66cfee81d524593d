"""The addition_transformer demo's script: train the transformer of model.py on 2-digit sums.

The page runs this file with ``session.runScript`` (script mode, see demos/common/): besides
the shared log, setup and loss messages it posts

    {kind: "eval", step, trainAcc, testAcc, table}  every `every` steps: accuracy on `eval`
                                                    train and held-out pairs, and the greedy
                                                    answers for 10 held-out pairs

Natively: ``python demos/addition_transformer/main.py steps=5 eval=32``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "addition_transformer",
              {"steps": 1500, "seed": 1, "every": 100, "eval": 500})
STATE = D.state
TABLE_ROWS = 10


async def setup() -> None:
    """Compile the training step and the attached greedy-prediction graph (once)."""
    m = await D.module("model")
    train = await D.compile(model=m.AdditionTransformer(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "predict" in STATE:
        return
    cfg = D.cfg
    pick = random.Random(cfg["seed"] + 1000)
    size = max(TABLE_ROWS, int(cfg["eval"]))
    STATE.update(predict=await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS,
                                            output="i32"),
                 rng=random.Random(cfg["seed"]), evals=[],
                 test_sample=pick.sample(m.TEST_PAIRS, min(size, len(m.TEST_PAIRS))),
                 train_sample=pick.sample(m.TRAIN_PAIRS, min(size, len(m.TRAIN_PAIRS))))


async def evaluate() -> dict:
    """Accuracy on the train and held-out samples; greedy answers for the table's pairs
    (the first TABLE_ROWS held-out pairs of the sample)."""
    m, predict = STATE["module:model"], STATE["predict"]
    test = STATE["test_sample"]
    sums = await m.predict_sums(predict, test)
    test_acc = sum(s == a + b for s, (a, b) in zip(sums, test)) / len(test)
    train_acc = await m.accuracy(predict, STATE["train_sample"])
    table = [{"a": a, "b": b, "pred": s, "ok": s == a + b}
             for (a, b), s in zip(test[:TABLE_ROWS], sums)]
    result = {"step": STATE["step"], "trainAcc": train_acc, "testAcc": test_acc}
    STATE["evals"].append(result)
    D.post("eval", **result, table=table)
    return result


async def reset() -> None:
    """Initial params (same seed), fresh optimizer state (and LR schedule), step 0."""
    await D.reset()
    STATE.update(rng=random.Random(D.cfg["seed"]), evals=[])


async def main() -> dict:
    D.config()
    await setup()
    m, rng = STATE["module:model"], STATE["rng"]
    if STATE["step"] == 0:
        await evaluate()

    async def progress(step: int, loss: float, rate: float) -> None:
        ev = await evaluate()
        D.log(f"step {step:5d}  loss {loss:.4f}  train acc {ev['trainAcc']:.1%}  "
              f"test acc {ev['testAcc']:.1%}  {rate:.2f} steps/s")

    run = await D.train(STATE["train"], lambda: m.batch(rng), on_every=progress, max_pending=20)
    if STATE["evals"][-1]["step"] != STATE["step"]:
        await evaluate()
    last = STATE["evals"][-1]
    return D.figures(run, train_acc=last["trainAcc"], test_acc=last["testAcc"],
                     eval_pairs=len(STATE["test_sample"]))


if __name__ == "__main__":
    dc.run_native(globals())
