"""A tiny 2-D "NeRF" (the upstream nerf-tiny sample): an MLP maps a pixel's (x, y) to its
colour, learning one 64×64 image.

(x, y) in [-1, 1] are encoded with 8 frequencies π·2^k (sin and cos of each: 32 features,
the frequencies fed as an input [8]) → 3 × (Linear 64 + ReLU) → Linear 3 + sigmoid. Batches
of 1,024 random pixels; MSE; Adam lr 1e-3. The whole image is rendered with a 4,096-row
forward. Pure Python, so it runs natively and in the browser worker.
"""

from __future__ import annotations

import math
import random

import tensorgrad as tg

SIDE = 64
PIXELS = SIDE * SIDE
BATCH = 1024
FREQS = [math.pi * 2 ** k for k in range(8)]


class Field(tg.Module):
    def __init__(self) -> None:
        self.l1 = tg.Linear(32, 64, init=tg.init.kaiming())
        self.l2 = tg.Linear(64, 64, init=tg.init.kaiming())
        self.l3 = tg.Linear(64, 64, init=tg.init.kaiming())
        self.out = tg.Linear(64, 3, init=tg.init.kaiming(1.0))

    def forward(self, xy: tg.Tensor, freqs: tg.Tensor) -> tg.Tensor:
        """xy [B, 2], freqs [8] → rgb [B, 3] in (0, 1)."""
        b = xy.shape[0]
        angles = tg.reshape(xy, (b, 2, 1)) * tg.reshape(freqs, (1, 1, 8))
        feats = tg.reshape(tg.concat([tg.sin(angles), tg.cos(angles)], -1), (b, 32))
        h = tg.relu(self.l3(tg.relu(self.l2(tg.relu(self.l1(feats))))))
        return tg.sigmoid(self.out(h))


def loss_fn(model: Field, xy: tg.Tensor, freqs: tg.Tensor, rgb: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(model(xy, freqs) - rgb))


def render_fn(model: Field, xy: tg.Tensor, freqs: tg.Tensor) -> tg.Tensor:
    return model(xy, freqs)


INPUTS = {"xy": (BATCH, 2), "freqs": (8,), "rgb": (BATCH, 3)}
RENDER_INPUTS = {"xy": (PIXELS, 2), "freqs": (8,)}


def optimizer() -> tg.optim.Adam:
    return tg.optim.Adam(lr=1e-3)


def coords() -> list[float]:
    """(x, y) of every pixel centre, row-major, in [-1, 1]."""
    out: list[float] = []
    for r in range(SIDE):
        for c in range(SIDE):
            out += ((c + 0.5) / SIDE * 2 - 1, (r + 0.5) / SIDE * 2 - 1)
    return out


def default_image() -> list[float]:
    """The generated target (64·64·3 values in 0..1): a diagonal colour gradient with a
    white ring, a dark square and three thin stripes (edges that need the high
    frequencies)."""
    img: list[float] = []
    for r in range(SIDE):
        for c in range(SIDE):
            x, y = c / (SIDE - 1), r / (SIDE - 1)
            rgb = [0.15 + 0.8 * x, 0.2 + 0.6 * y, 0.9 - 0.7 * x * y]
            d = math.hypot(x - 0.33, y - 0.38)
            if 0.16 < d < 0.24:
                rgb = [1.0, 1.0, 1.0]
            if 0.55 < x < 0.85 and 0.55 < y < 0.85:
                rgb = [0.1, 0.1, 0.15]
            if 0.62 < x < 0.78 and 0.1 < y < 0.35 and c % 4 == 0:
                rgb = [0.0, 0.0, 0.0]
            img += rgb
    return img


def batch(rng: random.Random, image: list[float], xy: list[float]) -> dict:
    rows = [rng.randrange(PIXELS) for _ in range(BATCH)]
    return {"xy": [xy[2 * i + j] for i in rows for j in (0, 1)], "freqs": FREQS,
            "rgb": [image[3 * i + j] for i in rows for j in (0, 1, 2)]}
