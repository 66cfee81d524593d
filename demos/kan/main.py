"""The kan demo's script: fit sin(πx) with the KAN of model.py and show its learned edges.

Besides the shared messages (demos/common/) it posts, on the evaluation schedule,

    {kind: "eval", step, xs, target, pred, mse,   the network's output over 101 points
     layer1, layer2}                              every edge function φ(x) (4 + 4 curves),
                                                  evaluated from the downloaded params

Natively: ``python demos/kan/main.py steps=500``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "kan", {"steps": 1500, "seed": 1, "every": 100})
XS = [-1 + 2 * i / 100 for i in range(101)]


async def evaluate() -> dict:
    """The fit, and the edge functions from the downloaded params."""
    m = D.state["module:model"]
    fit = await D.fit("predict", XS, [math.sin(math.pi * x) for x in XS])
    params = {n: dc.floats(v) for n, v in (await D.state["train"].download_params()).items()}
    return {**fit, "layer1": m.edge_functions(params, "layer1", 1, m.HIDDEN, XS),
            "layer2": m.edge_functions(params, "layer2", m.HIDDEN, 1, XS)}


async def main() -> dict:
    m = await D.start()
    await D.compile(model=m.KAN(), loss=m.loss_fn, inputs=m.INPUTS, optimizer=m.optimizer())
    await D.attach("predict", forward=m.predict_fn, inputs=m.PREDICT_INPUTS)
    return await D.run(lambda: m.batch(D.rng), evaluate=evaluate, line="fit mse {mse:.5f}",
                       figures={"fit_mse": "mse"})


if __name__ == "__main__":
    dc.run_native(globals())
