"""The mlp_sin demo's script: train the MLP of model.py to fit sin(x), streaming progress.

The page runs this file with ``session.runScript`` (script mode, see demos/common/): besides
the shared log, setup and loss messages it posts

    {kind: "fit", step, xs, target, pred}   the model's prediction over the plot's grid

Natively: ``python demos/mlp_sin/main.py steps=300 seed=1``.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "mlp_sin", {"steps": 2000, "seed": 1, "every": 100})
STATE = D.state


async def setup() -> None:
    """Compile the training step and the attached forward (once per worker)."""
    m = await D.module("model")
    train = await D.compile(model=m.MLP(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "predict" not in STATE:
        STATE.update(predict=await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS),
                     xs=m.plot_xs(), rng=random.Random(D.cfg["seed"]))


async def fit_update() -> float:
    """Post the prediction over the plot grid; the mean squared error against sin(x)."""
    xs = STATE["xs"]
    pred = dc.floats(dc.completed(await STATE["predict"].run(x=xs), "predict").output)
    target = [math.sin(x) for x in xs]
    D.post("fit", step=STATE["step"], xs=xs, target=target, pred=pred)
    return sum((p - t) ** 2 for p, t in zip(pred, target)) / len(xs)


async def reset() -> None:
    """Initial params (same seed), fresh optimizer state, step 0."""
    await D.reset()
    STATE["rng"] = random.Random(D.cfg["seed"])


async def main() -> dict:
    D.config()
    await setup()
    m, rng = STATE["module:model"], STATE["rng"]
    if STATE["step"] == 0:
        await fit_update()

    async def progress(step: int, loss: float, rate: float) -> None:
        mse = await fit_update()
        D.log(f"step {step:5d}  loss {loss:.5f}  fit mse {mse:.5f}  {rate:.1f} steps/s")

    run = await D.train(STATE["train"], lambda: m.batch(rng), on_every=progress)
    return D.figures(run, fit_mse=await fit_update())


if __name__ == "__main__":
    dc.run_native(globals())
