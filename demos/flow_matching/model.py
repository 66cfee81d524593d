"""Flow matching on MNIST digits with a tiny conv net (the upstream flow-matching-tiny sample).

A velocity field v(x, t): 4 convolutions 3×3 (pad 1, ReLU between) 1→32→32→32→1 at full
28×28 resolution; the time t ∈ 1..100 enters as Embedding(101, 32) → Linear(32, 32), added to
every pixel after the first convolution. Training (batches of 64 digits scaled to [-1, 1]):
x₀ ~ N(0, I) drawn in the graph (`randn`), τ = table[t] looked up with `take_along_axis`
(table = t/100, an input), x_τ = (1 − τ)x₀ + τx₁, loss = MSE(v(x_τ, t), x₁ − x₀); Adam lr 2e-4,
clipping at 1. Sampling: 25 Euler steps from noise. Pure Python (native and browser worker).
"""

from __future__ import annotations

import random

import tensorgrad as tg

BATCH, SIDE, STEPS_T, WIDTH = 64, 28, 100, 32
EULER_STEPS = 25


class VelocityNet(tg.Module):
    def __init__(self) -> None:
        k = tg.init.kaiming
        self.t_emb = tg.Embedding(STEPS_T + 1, WIDTH)
        self.t_lin = tg.Linear(WIDTH, WIDTH, init=k())
        self.c1 = tg.Conv2d(1, WIDTH, 3, padding=1, init=k())
        self.c2 = tg.Conv2d(WIDTH, WIDTH, 3, padding=1, init=k())
        self.c3 = tg.Conv2d(WIDTH, WIDTH, 3, padding=1, init=k())
        self.c4 = tg.Conv2d(WIDTH, 1, 3, padding=1, init=k(1.0))

    def forward(self, x: tg.Tensor, t: tg.Tensor) -> tg.Tensor:
        """x [B, 1, 28, 28], t [B] i32 → v [B, 1, 28, 28]."""
        temb = tg.reshape(self.t_lin(self.t_emb(t)), (x.shape[0], WIDTH, 1, 1))
        h = tg.relu(self.c1(x) + temb)
        h = tg.relu(self.c2(h))
        h = tg.relu(self.c3(h))
        return self.c4(h)


def loss_fn(model: VelocityNet, x1: tg.Tensor, t: tg.Tensor, table: tg.Tensor) -> tg.Tensor:
    b = x1.shape[0]
    x0 = tg.randn((b, 1, SIDE, SIDE))
    tau = tg.reshape(tg.take_along_axis(table, t, 0), (b, 1, 1, 1))
    xt = (1.0 - tau) * x0 + tau * x1
    return tg.mean(tg.square(model(xt, t) - (x1 - x0)))


def velocity_fn(model: VelocityNet, x: tg.Tensor, t: tg.Tensor) -> tg.Tensor:
    return model(x, t)


INPUTS = {"x1": (BATCH, 1, SIDE, SIDE), "t": ((BATCH,), "i32"), "table": (STEPS_T + 1,)}
VELOCITY_INPUTS = {"x": (None, 1, SIDE, SIDE), "t": ((None,), "i32")}
TABLE = [t / STEPS_T for t in range(STEPS_T + 1)]


def optimizer() -> tg.optim.Adam:
    return tg.optim.Adam(lr=2e-4, clip_grad_norm=1.0)


async def sample(velocity, noise: list[float], n: int) -> list[float]:
    """n digits from `noise` (n·784 values) by 25 Euler steps of dx/dτ = v(x, t)."""
    x = list(noise)
    dt = 1.0 / EULER_STEPS
    for k in range(EULER_STEPS):
        t = round(k * STEPS_T / EULER_STEPS)
        out = await velocity.run(x=x, t=[t] * n)
        if out.kind != "completed":
            raise RuntimeError(f"velocity: {out.kind} {getattr(out, 'error', '')}")
        v = out.output
        v = v.reshape(-1).tolist() if hasattr(v, "reshape") else memoryview(v).cast("B").cast("f").tolist()
        x = [a + dt * b for a, b in zip(x, v)]
    return x


def random_ts(rng: random.Random) -> list[int]:
    return [rng.randint(1, STEPS_T) for _ in range(BATCH)]
