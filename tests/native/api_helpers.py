"""Shared pieces of the native API tests: the tiny model, its data and a NumPy twin."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

import tensorgrad as tg
from tests.models import TinyMLP, reference_values

B = 4
INPUTS = {"x": (B, 2), "y": (B, 1)}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def mse(m: TinyMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(m(x) - y))


def mse_captured(m: TinyMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    pred = tg.capture("pred", m(x))
    err = tg.capture("err", tg.mean(tg.square(pred - y)))
    return err


def predict(m: TinyMLP, x: tg.Tensor) -> tg.Tensor:
    return m(x)


def data(seed: int = 0, batch: int = B) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 2)).astype(np.float32),
            "y": rng.standard_normal((batch, 1)).astype(np.float32)}


def np_mlp(p: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """TinyMLP in numpy (float64) from downloaded params."""
    w1, b1 = np.asarray(p["l1.W"], np.float64), np.asarray(p["l1.b"], np.float64)
    w2, b2 = np.asarray(p["l2.W"], np.float64), np.asarray(p["l2.b"], np.float64)
    return np.maximum(x.astype(np.float64) @ w1 + b1, 0.0) @ w2 + b2


async def compile_tiny(device: Any, loss: Any = mse, optimizer: Any = None, seed: int = 3,
                       model: tg.Module | None = None, **kw: Any) -> tg.Training:
    return await tg.compile(model=model or TinyMLP(), loss=loss, inputs=INPUTS,
                            optimizer=optimizer or tg.optim.Adam(lr=1e-2), seed=seed,
                            device=device, **kw)


def ref_values(train: tg.Training, feeds: dict[str, Any], t: int = 1) -> list[Any]:
    return reference_values(train, feeds, t)


def bits(params: dict[str, Any]) -> dict[str, bytes]:
    return {k: np.asarray(v).tobytes() for k, v in params.items()}


