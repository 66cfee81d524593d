"""A tiny Kolmogorov-Arnold network 1→4→1 fitting y = sin(πx) (the upstream kan-tiny sample).

Each edge i→o of a KAN layer is a learned function φ(x) = Σ_k C[o,i,k]·B_k(x) + Wres[i,o]·silu(x):
cubic B-spline bases B_k on 8 uniform knots over [-1, 1] (C initialized N(0, 0.1)), plus a
residual silu term. Batches of 256 points x ~ U[-1, 1]; MSE; Adam lr 0.005.
Pure Python, so it runs natively and in the browser worker.
"""

from __future__ import annotations

import math
import random

import tensorgrad as tg

BATCH, KNOTS, HIDDEN = 256, 8, 4
LO, HI = -1.0, 1.0
SPACING = (HI - LO) / (KNOTS - 1)
CENTERS = [LO + k * SPACING for k in range(KNOTS)]


def bspline(t: float) -> float:
    """The uniform cubic B-spline (support [-2, 2]) on the host, for the plots."""
    a = abs(t)
    return (max(0.0, 2 - a) ** 3 - 4 * max(0.0, 1 - a) ** 3) / 6


class KANLayer(tg.Module):
    def __init__(self, fan_in: int, fan_out: int) -> None:
        self.fan_in, self.fan_out = fan_in, fan_out
        self.C = self.param((fan_out, fan_in, KNOTS), init=tg.init.randn(0.1))
        self.Wres = self.param((fan_in, fan_out), init=tg.init.randn(0.1))

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        """x [B, I] → [B, O]."""
        b = x.shape[0]
        centers = tg.reshape(tg.arange(KNOTS, "f32") * SPACING + LO, (1, 1, KNOTS))
        t = tg.abs((tg.reshape(x, (b, self.fan_in, 1)) - centers) * (1.0 / SPACING))
        r2, r1 = tg.relu(2.0 - t), tg.relu(1.0 - t)
        basis = (r2 * r2 * r2 - 4.0 * r1 * r1 * r1) * (1.0 / 6)                      # [B, I, K]
        coef = tg.swap_axes(tg.reshape(self.C, (self.fan_out, self.fan_in * KNOTS)), 0, 1)
        spline = tg.reshape(basis, (b, self.fan_in * KNOTS)) @ coef
        return spline + tg.silu(x) @ self.Wres


class KAN(tg.Module):
    def __init__(self) -> None:
        self.layer1 = KANLayer(1, HIDDEN)
        self.layer2 = KANLayer(HIDDEN, 1)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.layer2(self.layer1(x))


def loss_fn(model: KAN, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(model(x) - y))


def predict_fn(model: KAN, x: tg.Tensor) -> tg.Tensor:
    return model(x)


INPUTS = {"x": (BATCH, 1), "y": (BATCH, 1)}
PREDICT_INPUTS = {"x": (None, 1)}


def optimizer() -> tg.optim.Adam:
    return tg.optim.Adam(lr=0.005)


def batch(rng: random.Random) -> dict:
    xs = [rng.uniform(-1, 1) for _ in range(BATCH)]
    return {"x": xs, "y": [math.sin(math.pi * x) for x in xs]}


def edge_functions(params: dict, layer: str, fan_in: int, fan_out: int,
                   xs: list[float]) -> list[list[float]]:
    """φ_{o,i}(x) over `xs` for every edge (o-major) of a layer, from downloaded params."""
    c, w = params[f"{layer}.C"], params[f"{layer}.Wres"]
    curves = []
    for o in range(fan_out):
        for i in range(fan_in):
            curve = []
            for x in xs:
                s = sum(c[(o * fan_in + i) * KNOTS + k] * bspline((x - CENTERS[k]) / SPACING)
                        for k in range(KNOTS))
                curve.append(s + w[i * fan_out + o] * x / (1 + math.exp(-x)))
            curves.append(curve)
    return curves
