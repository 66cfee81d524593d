"""The digit_canvas demo's script: train the MLP of model.py on 8,000 MNIST digits while the
page asks for the class probabilities of the digit drawn on its canvas.

Besides the shared messages (demos/common/) it posts {kind: "eval", step, acc, n, hidden,
digit} on the evaluation schedule (accuracy on the first `eval` held-out digits, and the
first of them, which the page shows until the user draws; config `until` stops the run once
it is reached, 0 = off). The page calls, while training runs or not (each an
`exec` in the worker):

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


async def setup() -> None:
    """MNIST, the model (hidden size from the config, or the page's choice) and its
    prediction graph (once per worker; the page's drawing may ask before Start)."""
    m = await D.module("model")
    await D.mnist("train")
    hidden = int(STATE.get("hidden", D.cfg["hidden"]))
    await D.compile(model=m.MLP(hidden), loss=m.loss_fn, inputs=m.INPUTS,
                    optimizer=m.optimizer())
    if "canvas" not in STATE:
        predict = await D.attach("predict", forward=m.predict_fn, inputs=m.PREDICT_INPUTS)
        STATE.update(hidden=hidden, canvas=tg.single_flight(predict.run))


def next_batch() -> dict:
    x, y = D.next_digits(STATE["mnist:train:0.0:1.0"], STATE["module:model"].BATCH)
    return {"x": x, "y": y}


async def evaluate() -> dict:
    """Accuracy on the first cfg["eval"] test digits."""
    test = await D.mnist("test")
    preds = await D.classify("predict", test, min(int(D.cfg["eval"]), len(test)))
    acc = sum(p == test.labels[i] for i, p in enumerate(preds)) / len(preds)
    return {"acc": acc, "n": len(preds), "hidden": STATE["hidden"],
            "digit": dc.floats(test.pixels(range(1)))}


async def canvas_predict(pixels: list[float]) -> list[float] | None:
    """Probabilities for one drawing; None when a newer drawing superseded this one."""
    await setup()
    return await dc.latest_floats(STATE["canvas"], "predict", x=pixels)


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


async def main() -> dict:
    D.config()
    await setup()
    return await D.run(next_batch, evaluate=evaluate, line="test acc {acc:.2%}",
                       until=lambda ev: ev["acc"] >= float(D.cfg["until"]),
                       figures={"test_acc": "acc", "hidden": "hidden"})


if __name__ == "__main__":
    dc.run_native(globals())
