"""Every part of tensorgrad's API, run in-process: the same script runs natively (CPython,
wgpu-py) and inside a Pyodide in a Web Worker (a PyScript ``<script type="py" worker>``),
where it uses the worker's own ``navigator.gpu``. `main()` returns plain data (JSON) that
tests/browser/test_inprocess.py compares between the two.

No numpy and no pytest here: it runs in Pyodide as it is. In the worker it prints one line,
``INPROCESS-RESULT <json>``, which the test reads from the console.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import tensorgrad as tg

BATCH, STEPS, SEED = 16, 25, 3


class MLP(tg.Module):
    def __init__(self) -> None:
        self.l1 = tg.Linear(4, 16)
        self.l2 = tg.Linear(16, 1)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l2(tg.relu(self.l1(x)))


def loss_fn(model: MLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(model(x) - y))


def predict(model: MLP, x: tg.Tensor) -> tg.Tensor:
    return model(x)


def batch(step: int) -> dict[str, list[float]]:
    """A deterministic batch (no RNG: the same numbers natively and in the browser)."""
    xs = [((step * 31 + i * 7) % 23) / 23 - 0.5 for i in range(BATCH * 4)]
    ys = [xs[4 * r] - 2 * xs[4 * r + 1] + xs[4 * r + 2] * xs[4 * r + 3] for r in range(BATCH)]
    return {"x": xs, "y": ys}


def floats(value: Any) -> list[float]:
    """A result array (numpy natively, a memoryview in Pyodide) as a flat list."""
    if hasattr(value, "reshape"):
        return [float(v) for v in value.reshape(-1)]
    return [float(v) for v in memoryview(value).cast("B").cast("f")]


def as_lists(params: dict[str, Any]) -> dict[str, list[float]]:
    return {name: floats(value) for name, value in params.items()}


async def main() -> dict[str, Any]:
    """Check, compile, train, forward graphs, params in and out, checkpoints, export."""
    support = await tg.check_webgpu()
    out: dict[str, Any] = {"support": {"ok": support.ok, "mode": support.mode,
                                       "adapter": support.adapter, "jspi": support.jspi,
                                       "message": support.message}}
    train = await tg.compile(model=MLP(), loss=loss_fn, inputs={"x": (BATCH, 4), "y": (BATCH, 1)},
                             optimizer=tg.optim.Adam(lr=1e-2), seed=SEED)
    out["device"] = train.device.description
    out["kernels"] = train.kernel_count
    losses = []
    for step in range(STEPS):
        result = await train.step(**batch(step))
        assert isinstance(result, tg.Completed), f"step {step}: {result}"
        losses.append(result.loss)
    out["losses"] = losses
    probe = {"x": [0.25, -0.5, 0.125, 0.0, -0.25, 0.5, 0.375, -0.125]}
    forward = await train.attach(forward=predict, inputs={"x": (None, 4)})
    out["attached"] = floats((await forward.run(**probe)).output)
    out["grads"] = as_lists(await train.download_param_grads())
    trained = await train.download_params()
    out["params"] = as_lists(trained)

    # a checkpoint: safetensors bytes round trip, then into a standalone forward graph
    blob = tg.save_safetensors(trained)
    out["checkpoint_sha256"] = hashlib.sha256(blob).hexdigest()
    standalone = await tg.compile_forward(model=MLP(), forward=predict,
                                          inputs={"x": (None, 4)}, seed=SEED + 1)
    before = floats((await standalone.run(**probe)).output)
    await standalone.upload_params(tg.load_safetensors(blob))
    out["standalone"] = floats((await standalone.run(**probe)).output)
    out["standalone_changed"] = before != out["standalone"]

    # reset to the initial params, train a step with a new LR, replace the model
    await train.reset()
    out["reset_loss"] = (await train.step(**batch(0))).loss
    await train.set_lr(0.0)
    frozen = floats((await forward.run(**probe)).output)
    await train.step(**batch(1))
    out["lr0_unchanged"] = frozen == floats((await forward.run(**probe)).output)
    await train.replace_model(MLP(), seed=SEED)
    out["replaced_loss"] = (await train.step(**batch(0))).loss

    # export to PyTorch from the handle's trained weights (no torch needed here)
    await train.upload_params(trained)
    exported = await tg.export.torch(train, forward=predict, inputs={"x": (None, 4)}, path=None)
    out["export_source"] = exported.source
    out["export_weights_sha256"] = hashlib.sha256(exported.weights).hexdigest()
    standalone.destroy()
    train.destroy()
    return out


async def report() -> None:
    """Print main()'s result as one console line (the worker's way to hand it back)."""
    try:
        print("INPROCESS-RESULT " + json.dumps(await main()))
    except Exception as err:  # noqa: BLE001 (reported to the test, which fails)
        import traceback

        print("INPROCESS-ERROR " + json.dumps("".join(traceback.format_exception(err))))


if sys.platform == "emscripten":  # a PyScript worker runs this file as its script
    import asyncio

    asyncio.ensure_future(report())
