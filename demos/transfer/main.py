"""The transfer demo's script: a CNN feature extractor pretrained on MNIST digits 0-6
(extractor.safetensors, made by pretrain.py) is uploaded into a frozen `features` module
(`Module.freeze`), and only a new 3-class head is trained, on a few examples per class: at
first the built-in ones (the first `shots` training digits of each of 7, 8 and 9, digits the
extractor never saw), then whatever classes the user draws on the page.

Besides the shared messages (demos/common/) it posts

    {kind: "examples", names, counts, images, builtin}   the classes and their examples
    {kind: "eval", step, acc, n, train_acc, unchanged, shown, shown_labels, shown_truth,
     names, digit, summary}

on the evaluation schedule: `acc` is the accuracy on the n held-out test digits 7-9 (null for
the user's own classes), `train_acc` on the examples themselves, `unchanged` whether every
extractor param is still bit-identical to what was uploaded, `shown` 24 images (held-out
digits, or the user's examples) with the head's answers. Config `features`: "pretrained",
or "random" (the same frozen extractor left at its random init: what pretraining buys).

The page calls, while training runs or not (each an `exec` in the worker):

    await setup()                        compile and load (once), post the examples
    await canvas_predict(pixels)         class probabilities of a 784-pixel drawing
                                         (single-flight: None when superseded)
    await set_examples(names, images)    the user's classes: a name and a list of 784-pixel
                                         drawings each; a fresh head
    await use_builtin()                  back to the built-in digits 7, 8, 9; a fresh head

Natively: ``python demos/transfer/main.py steps=200``.
"""

from __future__ import annotations

import array
import asyncio
import sys
from pathlib import Path
from typing import Any

import tensorgrad as tg

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "transfer",
              {"steps": 200, "seed": 1, "every": 25, "shots": 8, "features": "pretrained"})
STATE = D.state
SHOWN = 24
FEATURES = ("pretrained", "random")


async def setup() -> None:
    """Data, the pretrained weights, the model with its frozen extractor, the forwards, the
    built-in examples, posted (once per worker; the page asks before Start)."""
    async with STATE.setdefault("lock", asyncio.Lock()):
        m = await D.module("model")
        if "train" not in STATE:
            if D.cfg["features"] not in FEATURES:
                raise ValueError(f"transfer: features={D.cfg['features']!r}: one of {FEATURES}")
            weights = tg.load_safetensors(await D.file("extractor.safetensors"))
            STATE["pretrained"] = {n: v for n, v in weights.items()
                                   if n.startswith("features.")}
            await D.compile(model=m.Classifier(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
            await load_features()
            predict = await D.attach("predict", forward=m.predict_fn, inputs=m.PREDICT_INPUTS)
            await D.attach("classify", forward=m.classify_fn, inputs=m.PREDICT_INPUTS,
                           output="i32")
            STATE["canvas"] = tg.single_flight(predict.run)
        if "examples" not in STATE:
            await builtin_examples()
            post_examples()


async def load_features() -> None:
    """The extractor's params: the pretrained ones uploaded (config features=pretrained) or
    its seeded random init kept; remembered to check they stay as they are."""
    train = STATE["train"]
    frozen = [n for n in train.param_names if n.startswith("features.")]
    if D.cfg["features"] == "pretrained":
        await train.upload_params(STATE["pretrained"], partial=True)
    params = await train.download_params()
    STATE["features0"] = {n: bytes(dc.f32(params[n])) for n in frozen}
    values = sum(len(b) // 4 for b in STATE["features0"].values())
    D.log(f"extractor: {D.cfg['features']}, frozen ({values:,} values); the head's "
          f"{train.param_count - values:,} params train")


async def builtin_examples() -> None:
    """The first `shots` training digits of each of 7, 8, 9."""
    m = STATE["module:model"]
    digits = await D.mnist("train")
    shots = int(D.cfg["shots"])
    examples = []
    for c in m.NEW_CLASSES:
        rows = [i for i, label in enumerate(digits.labels) if label == c][:shots]
        examples.append([digits.pixels([r]).tolist() for r in rows])
    STATE.update(examples=examples, names=[str(c) for c in m.NEW_CLASSES], builtin=True)


def post_examples() -> None:
    ex = STATE["examples"]
    D.post("examples", names=STATE["names"], counts=[len(e) for e in ex],
           images=[[round(v, 3) for img in e for v in img] for e in ex],
           builtin=STATE["builtin"])


def next_batch() -> dict:
    m = STATE["module:model"]
    x, y = m.balanced_batch(STATE["examples"], m.BATCH, m.SHIFT, D.rng)
    return {"x": x, "y": y}


async def held_out() -> tuple[Any, list[int]]:
    """The test digits 7, 8, 9 and their classes 0, 1, 2."""
    if "held_out" not in STATE:
        m = STATE["module:model"]
        test = await D.mnist("test")
        rows = [i for i, label in enumerate(test.labels) if label in m.NEW_CLASSES]
        labels = [m.NEW_CLASSES.index(test.labels[i]) for i in rows]
        STATE["held_out"] = (dc.Digits(test.pixels(rows), bytes(labels)), labels)
    return STATE["held_out"]


async def extractor_unchanged() -> bool:
    params = await STATE["train"].download_params()
    return all(bytes(dc.f32(params[n])) == b for n, b in STATE["features0"].items())


async def evaluate() -> dict:
    """Accuracy on the held-out digits (built-in classes) and on the examples; 24 images with
    the head's answers; whether the extractor is untouched."""
    names = STATE["names"]
    truth = [c for c, e in enumerate(STATE["examples"]) for _ in e]
    examples = dc.Digits(array.array("f", [v for e in STATE["examples"] for img in e
                                           for v in img]), bytes(truth))
    preds = await D.classify("classify", examples, len(truth))
    train_acc = sum(p == t for p, t in zip(preds, truth)) / len(truth)
    acc, n, digit = None, 0, None
    # 24 images with the head's answers: held-out digits, or the user's own examples
    shown, shown_preds, shown_truth = examples, preds, truth
    if STATE["builtin"]:
        shown, shown_truth = await held_out()
        n = len(shown_truth)
        shown_preds = await D.classify("classify", shown, n)
        acc = sum(p == t for p, t in zip(shown_preds, shown_truth)) / n
        digit = dc.floats(shown.pixels(range(1)))
    k = min(SHOWN, len(shown_truth))
    unchanged = await extractor_unchanged()
    summary = (f"held-out {acc:.1%} of {n}, " if acc is not None else "") + \
        f"examples {train_acc:.0%}, extractor {'unchanged' if unchanged else 'CHANGED'}"
    return {"acc": acc, "n": n, "train_acc": train_acc, "unchanged": unchanged,
            "names": names, "shown": dc.floats(shown.pixels(range(k))),
            "shown_labels": [names[p] for p in shown_preds[:k]],
            "shown_truth": [names[t] for t in shown_truth[:k]], "digit": digit,
            "summary": summary}


async def canvas_predict(pixels: list[float]) -> list[float] | None:
    """Probabilities of the classes for one drawing; None when a newer one superseded it."""
    await setup()
    return await dc.latest_floats(STATE["canvas"], "predict", x=pixels)


async def reset() -> None:
    """A fresh head (and optimizer state), the extractor loaded again, step 0."""
    await D.reset()
    if "train" in STATE:
        await load_features()


async def set_examples(names: list[str], images: list[list[list[float]]]) -> None:
    """The user's classes: `names` and, per class, a list of 784-pixel drawings."""
    m = STATE["module:model"]
    if len(names) != m.CLASSES or len(images) != m.CLASSES:
        raise ValueError(f"set_examples: {m.CLASSES} classes needed, got {len(names)} names "
                         f"and {len(images)} lists of drawings")
    for name, drawings in zip(names, images):
        if not drawings:
            raise ValueError(f"set_examples: class {name!r} has no drawings (one at least)")
        bad = [len(d) for d in drawings if len(d) != m.PIXELS]
        if bad:
            raise ValueError(f"set_examples: class {name!r}: drawings of {bad} values, "
                             f"{m.PIXELS} (28x28) expected")
    STATE.update(examples=[[list(map(float, d)) for d in e] for e in images],
                 names=[str(n) for n in names], builtin=False)
    await reset()
    D.log("your classes: " + ", ".join(f"{n} ({len(e)})" for n, e in zip(names, images)))
    post_examples()


async def use_builtin() -> None:
    await builtin_examples()
    await reset()
    D.log("built-in classes: the digits 7, 8, 9")
    post_examples()


async def main() -> dict:
    D.config()
    await setup()
    return await D.run(next_batch, evaluate=evaluate, line="{summary}", figures=figures)


def figures(ev: dict) -> dict:
    """A run's figures from its last evaluation (held-out ones for the built-in classes)."""
    held = {"held_out_acc": ev["acc"], "held_out": ev["n"]} if ev["acc"] is not None else {}
    return {**held, "train_acc": ev["train_acc"], "extractor_unchanged": ev["unchanged"],
            "features": D.cfg["features"], "classes": ", ".join(ev["names"])}


if __name__ == "__main__":
    dc.run_native(globals())
