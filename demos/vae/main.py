"""The vae demo's script: train the VAE of model.py on 8,000 MNIST digits.

Besides the shared messages (demos/common/) it posts, on the evaluation schedule,

    {kind: "eval", step, originals, recons, samples, test_recon}   16 held-out digits,
        their reconstructions, 16 digits decoded from z ~ N(0, I) (fixed draws), and the
        reconstruction error Σ‖x̂ − x‖² per held-out digit (over 500)

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
SHOWN, HELD_OUT = 16, 500


async def evaluate() -> dict:
    """Reconstructions of held-out digits and digits decoded from fixed random codes."""
    test = await D.mnist("test")
    originals = dc.floats(test.pixels(range(HELD_OUT)))
    out = await D.state["recon"].run(x=test.pixels(range(HELD_OUT)))
    recons = dc.floats(dc.completed(out, "recon").output)
    err = sum((a - b) ** 2 for a, b in zip(recons, originals)) / HELD_OUT
    out = await D.state["decode"].run(z=D.state["z"])
    return {"originals": originals[:SHOWN * dc.PIXELS], "recons": recons[:SHOWN * dc.PIXELS],
            "samples": dc.floats(dc.completed(out, "decode").output), "test_recon": err}


async def main() -> dict:
    m = await D.start()
    train = await D.mnist("train")
    await D.compile(model=m.VAE(), loss=m.loss_fn, inputs=m.INPUTS, optimizer=m.optimizer())
    await D.attach("recon", forward=m.reconstruct_fn, inputs=m.RECON_INPUTS)
    await D.attach("decode", forward=m.decode_fn, inputs=m.DECODE_INPUTS)
    codes = random.Random(D.cfg["seed"] + 7)
    D.state.setdefault("z", [codes.gauss(0, 1) for _ in range(SHOWN * m.LATENT)])
    return await D.run(lambda: {"x": D.next_digits(train, m.BATCH)[0]}, evaluate=evaluate,
                       line="held-out reconstruction error {test_recon:.2f}",
                       figures={"test_recon_error": "test_recon"})


if __name__ == "__main__":
    dc.run_native(globals())
