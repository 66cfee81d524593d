"""An MLP 1-64-64-1 fitting sin(x) on [-pi, pi] (the upstream mlp-sin sample).

Pure Python (no numpy), so the same file runs natively and in the browser worker.
"""

from __future__ import annotations

import array
import math
import random

import tensorgrad as tg

BATCH = 256
PLOT_POINTS = 200


class MLP(tg.Module):
    def __init__(self) -> None:
        self.l1 = tg.Linear(1, 64)
        self.l2 = tg.Linear(64, 64)
        self.l3 = tg.Linear(64, 1)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l3(tg.relu(self.l2(tg.relu(self.l1(x)))))


def loss_fn(model: MLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(model(x) - y))


def predict_fn(model: MLP, x: tg.Tensor) -> tg.Tensor:
    return model(x)


INPUTS = {"x": (BATCH, 1), "y": (BATCH, 1)}
PREDICT_INPUTS = {"x": (None, 1)}


def optimizer() -> tg.optim.Adam:
    return tg.optim.Adam(lr=5e-3)


def batch(rng: random.Random, size: int = BATCH) -> dict[str, array.array]:
    xs = array.array("f", [rng.uniform(-math.pi, math.pi) for _ in range(size)])
    return {"x": xs, "y": array.array("f", [math.sin(x) for x in xs])}


def plot_xs(n: int = PLOT_POINTS) -> array.array:
    return array.array("f", [-math.pi + 2 * math.pi * i / (n - 1) for i in range(n)])
