"""The nerf demo's script: fit one 64×64 image with the coordinate MLP of model.py.

Besides the shared messages (demos/common/) it posts, every `every` steps,

    {kind: "render", step, rgb, target, mse, psnr}   the whole image rendered (64·64·3)

``await set_image(rgb)`` (64·64·3 values in 0..1, the page's upload) replaces the target and
restarts from fresh params. Natively: ``python demos/nerf/main.py steps=500``.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "nerf", {"steps": 3000, "seed": 1, "every": 100})
STATE = D.state


async def setup() -> None:
    m = await D.module("model")
    train = await D.compile(model=m.Field(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "render" not in STATE:
        STATE.update(render=await train.attach(forward=m.render_fn, inputs=m.RENDER_INPUTS),
                     rng=random.Random(D.cfg["seed"]), xy=m.coords(),
                     image=STATE.get("image") or m.default_image())


async def show() -> float:
    m = STATE["module:model"]
    out = await STATE["render"].run(xy=STATE["xy"], freqs=m.FREQS)
    rgb = dc.floats(dc.completed(out, "render").output)
    image = STATE["image"]
    mse = sum((a - b) ** 2 for a, b in zip(rgb, image)) / len(image)
    STATE["mse"] = mse
    psnr = 10 * math.log10(1 / mse) if mse > 0 else 99.0
    D.post("render", step=STATE["step"], rgb=rgb, target=image, mse=mse, psnr=psnr)
    return mse


async def set_image(rgb: list[float]) -> None:
    """A new target image (the page's upload); fresh params."""
    m = STATE["module:model"]
    if len(rgb) != m.PIXELS * 3:
        raise ValueError(f"set_image: {m.PIXELS * 3} values needed, got {len(rgb)}")
    STATE["image"] = [float(v) for v in rgb]
    await reset()
    await show()
    D.log("new target image: training restarts from fresh parameters")


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
        D.log(f"step {step:5d}  loss {loss:.5f}  image mse {mse:.5f} "
              f"(PSNR {10 * math.log10(1 / mse):.1f} dB)  {rate:.1f} steps/s")

    run = await D.train(STATE["train"], lambda: m.batch(rng, STATE["image"], STATE["xy"]),
                        on_every=progress)
    mse = await show()
    return D.figures(run, image_mse=mse, psnr=10 * math.log10(1 / mse))


if __name__ == "__main__":
    dc.run_native(globals())
