"""The nerf demo's script: fit one 64×64 image with the coordinate MLP of model.py.

Besides the shared messages (demos/common/) it posts, on the evaluation schedule,

    {kind: "eval", step, rgb, target, mse, psnr}   the whole image rendered (64·64·3)

``await set_image(rgb)`` (64·64·3 values in 0..1, the page's upload) replaces the target and
restarts from fresh params. Natively: ``python demos/nerf/main.py steps=500``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "nerf", {"steps": 3000, "seed": 1, "every": 100})
STATE = D.state


async def evaluate() -> dict:
    """The whole image rendered, and its error against the target."""
    m = STATE["module:model"]
    out = await STATE["render"].run(xy=STATE["xy"], freqs=m.FREQS)
    rgb = dc.floats(dc.completed(out, "render").output)
    image = STATE["image"]
    mse = sum((a - b) ** 2 for a, b in zip(rgb, image)) / len(image)
    psnr = 10 * math.log10(1 / mse) if mse > 0 else 99.0
    return {"rgb": rgb, "target": image, "mse": mse, "psnr": psnr}


async def set_image(rgb: list[float]) -> None:
    """A new target image (the page's upload); fresh params."""
    m = STATE["module:model"]
    if len(rgb) != m.PIXELS * 3:
        raise ValueError(f"set_image: {m.PIXELS * 3} values needed, got {len(rgb)}")
    STATE["image"] = [float(v) for v in rgb]
    await D.reset()
    await D.evaluate(evaluate)
    D.log("new target image: training restarts from fresh parameters")


async def main() -> dict:
    m = await D.start()
    await D.compile(model=m.Field(), loss=m.loss_fn, inputs=m.INPUTS, optimizer=m.optimizer())
    await D.attach("render", forward=m.render_fn, inputs=m.RENDER_INPUTS)
    STATE.setdefault("xy", m.coords())
    STATE.setdefault("image", m.default_image())
    return await D.run(lambda: m.batch(D.rng, STATE["image"], STATE["xy"]), evaluate=evaluate,
                       line="image mse {mse:.5f} (PSNR {psnr:.1f} dB)",
                       figures={"image_mse": "mse", "psnr": "psnr"})


if __name__ == "__main__":
    dc.run_native(globals())
