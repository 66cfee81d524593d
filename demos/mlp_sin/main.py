"""The mlp_sin demo's script: train the MLP of model.py to fit sin(x), streaming progress.

The page runs this file with ``session.runScript`` (script mode, see demos/common/): besides
the shared log, setup and loss messages it posts

    {kind: "eval", step, xs, target, pred, mse}   the model's prediction over the plot's grid

Natively: ``python demos/mlp_sin/main.py steps=300 seed=1``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "mlp_sin", {"steps": 2000, "seed": 1, "every": 100})


async def evaluate() -> dict:
    """The prediction over the plot grid against sin(x)."""
    xs = D.state["module:model"].plot_xs()
    return await D.fit("predict", xs, [math.sin(x) for x in xs])


async def main() -> dict:
    m = await D.start()
    await D.compile(model=m.MLP(), loss=m.loss_fn, inputs=m.INPUTS, optimizer=m.optimizer())
    await D.attach("predict", forward=m.predict_fn, inputs=m.PREDICT_INPUTS)
    return await D.run(lambda: m.batch(D.rng), evaluate=evaluate, line="fit mse {mse:.5f}",
                       figures={"fit_mse": "mse"})


if __name__ == "__main__":
    dc.run_native(globals())
