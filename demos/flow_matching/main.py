"""The flow_matching demo's script: learn a velocity field that carries noise to MNIST digits.

Besides the shared messages (demos/common/) it posts, on the evaluation schedule,

    {kind: "eval", step, images, n}   `samples` digits generated from fixed noise by 25
                                      Euler steps (pixels in [-1, 1])

Natively: ``python demos/flow_matching/main.py steps=20 every=10``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "flow_matching", {"steps": 2000, "seed": 1, "every": 100, "samples": 8})


async def evaluate() -> dict:
    """Digits generated from the fixed noise."""
    n = int(D.cfg["samples"])
    images = await D.state["module:model"].sample(D.state["velocity"], D.state["noise"], n)
    return {"images": images, "n": n}


async def main() -> dict:
    m = await D.start()
    train = await D.mnist("train", -1.0, 1.0)
    await D.compile(model=m.VelocityNet(), loss=m.loss_fn, inputs=m.INPUTS,
                    optimizer=m.optimizer())
    await D.attach("velocity", forward=m.velocity_fn, inputs=m.VELOCITY_INPUTS)
    noise, n = random.Random(D.cfg["seed"] + 11), int(D.cfg["samples"])
    if len(D.state.get("noise", ())) != n * dc.PIXELS:
        D.state["noise"] = [noise.gauss(0, 1) for _ in range(n * dc.PIXELS)]

    def next_batch() -> dict:
        x1, _ = D.next_digits(train, m.BATCH)
        return {"x1": x1, "t": m.random_ts(D.rng), "table": m.TABLE}

    return await D.run(next_batch, evaluate=evaluate, line="(samples: 25 Euler steps)",
                       figures=lambda ev: {"samples": ev["n"], "euler_steps": m.EULER_STEPS},
                       max_pending=5)


if __name__ == "__main__":
    dc.run_native(globals())
