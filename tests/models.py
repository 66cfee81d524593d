"""Shared test helpers: the demo model files as modules, and small models for API tests.

The demos live in ``demos/<name>/model.py`` (not a package); :func:`demo` imports one by
name through importlib, once per process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import tensorgrad as tg

ROOT = Path(__file__).resolve().parent.parent
_DEMOS: dict[str, ModuleType] = {}


def demo(name: str) -> ModuleType:
    """`demos/<name>/model.py` as a module (e.g. ``demo("mlp_sin").MLP``)."""
    mod = _DEMOS.get(name)
    if mod is None:
        path = ROOT / "demos" / name / "model.py"
        if not path.is_file():
            raise FileNotFoundError(f"no demo model at {path}")
        spec = importlib.util.spec_from_file_location(f"tensorgrad_demo_{name}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses / pickling look modules up by name
        spec.loader.exec_module(mod)
        _DEMOS[name] = mod
    return mod


def mlp_sin() -> ModuleType:
    return demo("mlp_sin")


def addition_transformer() -> ModuleType:
    return demo("addition_transformer")


class TinyMLP(tg.Module):
    """x [B, n_in] -> relu(x @ W1 + b1) @ W2 + b2, [B, n_out]."""

    def __init__(self, n_in: int = 2, hidden: int = 8, n_out: int = 1) -> None:
        self.l1 = tg.Linear(n_in, hidden)
        self.l2 = tg.Linear(hidden, n_out)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l2(tg.relu(self.l1(x)))


class DeepMLP(tg.Module):
    """`depth` tanh layers of width `width` (many kernels, many dead intermediates).

    Weights are randn(`scale`): the default 0.4 keeps activations O(1) through all layers;
    the library default 0.02 shrinks them ~20x per layer (to ~1e-14 at layer 12)."""

    def __init__(self, width: int = 8, depth: int = 12, scale: float = 0.4) -> None:
        self.layers = [tg.Linear(width, width, init=tg.init.randn(scale))
                       for _ in range(depth)]

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        for layer in self.layers:
            x = tg.tanh(layer(x))
        return x
