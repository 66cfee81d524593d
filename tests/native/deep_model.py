"""The deep MLP training of the ordering and cancellation tests: ~100 kernels in chunks of
4, so a step spans ~25 submissions with waits between them (calls can land inside it)."""

from __future__ import annotations

from typing import Any

import numpy as np

import tensorgrad as tg
from tests.models import DeepMLP

WIDTH = 128
INPUTS = {"x": (256, WIDTH), "y": (256, WIDTH)}


def deep_loss(m: DeepMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(m(x) - y))


def batch(seed: int) -> dict[str, np.ndarray]:
    """A batch of INPUTS' shapes, standard normal, from `seed`."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in INPUTS.items()}


async def compile_deep(device: Any, chunk_size: int = 4) -> tg.Training:
    return await tg.compile(model=DeepMLP(width=WIDTH, scale=0.1), loss=deep_loss, inputs=INPUTS,
                            optimizer=tg.optim.Adam(lr=1e-2), seed=1, device=device,
                            chunk_size=chunk_size)
