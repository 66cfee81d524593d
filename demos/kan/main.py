"""The kan demo's script: fit sin(πx) with the KAN of model.py and show its learned edges.

Besides the shared messages (demos/common/) it posts, every `every` steps,

    {kind: "fit", step, xs, target, pred, mse}   the network's output over 101 points
    {kind: "splines", step, xs, layer1, layer2}  every edge function φ(x) (4 + 4 curves),
                                                 evaluated from the downloaded params

Natively: ``python demos/kan/main.py steps=500``.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "kan", {"steps": 1500, "seed": 1, "every": 100})
STATE = D.state
XS = [-1 + 2 * i / 100 for i in range(101)]


async def setup() -> None:
    m = await D.module("model")
    train = await D.compile(model=m.KAN(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "predict" not in STATE:
        STATE.update(predict=await train.attach(forward=m.predict_fn, inputs=m.PREDICT_INPUTS),
                     rng=random.Random(D.cfg["seed"]))


async def show() -> float:
    """Post the fit and the edge functions; the fit's mean squared error."""
    m = STATE["module:model"]
    pred = dc.floats(dc.completed(await STATE["predict"].run(x=XS), "predict").output)
    target = [math.sin(math.pi * x) for x in XS]
    mse = sum((p - t) ** 2 for p, t in zip(pred, target)) / len(XS)
    STATE["mse"] = mse
    D.post("fit", step=STATE["step"], xs=XS, target=target, pred=pred, mse=mse)
    params = {n: dc.floats(v) for n, v in (await STATE["train"].download_params()).items()}
    D.post("splines", step=STATE["step"], xs=XS,
           layer1=m.edge_functions(params, "layer1", 1, m.HIDDEN, XS),
           layer2=m.edge_functions(params, "layer2", m.HIDDEN, 1, XS))
    return mse


async def reset() -> None:
    await D.reset()
    STATE["rng"] = random.Random(D.cfg["seed"])


async def main() -> dict:
    D.config()
    await setup()
    m, rng = STATE["module:model"], STATE["rng"]
    if STATE["step"] == 0:
        await show()

    async def progress(step: int, loss: float, rate: float) -> None:
        mse = await show()
        D.log(f"step {step:5d}  loss {loss:.5f}  fit mse {mse:.5f}  {rate:.1f} steps/s")

    run = await D.train(STATE["train"], lambda: m.batch(rng), on_every=progress)
    return D.figures(run, fit_mse=await show())


if __name__ == "__main__":
    dc.run_native(globals())
