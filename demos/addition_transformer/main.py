"""The addition_transformer demo's script: train the transformer of model.py on 2-digit sums.

The page runs this file with ``session.runScript`` (script mode, see demos/common/): besides
the shared log, setup and loss messages it posts, on the evaluation schedule,

    {kind: "eval", step, trainAcc, testAcc,   accuracy (the whole sum right) on `eval` train
     testDigits, table}                       and held-out pairs, the share of held-out answer
                                              digits right, and the greedy answers for 10
                                              held-out pairs

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


async def evaluate() -> dict:
    """Accuracy on the train and held-out samples, the held-out digits right, and greedy
    answers for the table's pairs (the first TABLE_ROWS held-out pairs of the sample)."""
    m, predict = STATE["module:model"], STATE["predict"]
    test = STATE["test_sample"]
    digits = await m.predict_digits(predict, test)
    wanted = [m.encode(a, b)[-3:] for a, b in test]
    sums = [d[0] + 10 * d[1] + 100 * d[2] for d in digits]
    right = sum(x == y for d, w in zip(digits, wanted) for x, y in zip(d, w))
    return {"trainAcc": await m.accuracy(predict, STATE["train_sample"]),
            "testAcc": sum(s == a + b for s, (a, b) in zip(sums, test)) / len(test),
            "testDigits": right / (3 * len(test)),
            "table": [{"a": a, "b": b, "pred": s, "ok": s == a + b}
                      for (a, b), s in zip(test[:TABLE_ROWS], sums)]}


async def main() -> dict:
    m = await D.start()
    await D.compile(model=m.AdditionTransformer(), loss=m.loss_fn, inputs=m.INPUTS,
                    optimizer=m.optimizer())
    await D.attach("predict", forward=m.predict_fn, inputs=m.PREDICT_INPUTS, output="i32")
    if "test_sample" not in STATE:
        pick, size = random.Random(D.cfg["seed"] + 1000), max(TABLE_ROWS, int(D.cfg["eval"]))
        STATE.update(test_sample=pick.sample(m.TEST_PAIRS, min(size, len(m.TEST_PAIRS))),
                     train_sample=pick.sample(m.TRAIN_PAIRS, min(size, len(m.TRAIN_PAIRS))))
    return await D.run(lambda: m.batch(D.rng), evaluate=evaluate, max_pending=20,
                       line="train acc {trainAcc:.1%}  test acc {testAcc:.1%} (digits "
                       "{testDigits:.1%})",
                       figures=lambda ev: {"train_acc": ev["trainAcc"], "test_acc": ev["testAcc"],
                                           "test_digit_acc": ev["testDigits"],
                                           "eval_pairs": len(STATE["test_sample"])})


if __name__ == "__main__":
    dc.run_native(globals())
