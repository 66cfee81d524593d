"""Shared test helpers: the demo model files as modules, small models for API tests, and
reference-interpreter views of a compiled `Training`.

The demos live in ``demos/<name>/model.py`` (not a package); :func:`demo` imports one by
name through importlib, once per process.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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

    def __init__(self, width: int = 8, depth: int = 16, scale: float = 0.4) -> None:
        self.layers = [tg.Linear(width, width, init=tg.init.randn(scale))
                       for _ in range(depth)]

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        for layer in self.layers:
            x = tg.tanh(layer(x))
        return x


# ---- a compiled Training seen through the reference interpreter ---------------------------
# These read private attributes (there is no public accessor for the gradient node ids or
# the hidden optimizer inputs). They use the buffer plan, which is built on `train.ir` after
# every graph pass (e.g. fusion), so the node ids always refer to `train.ir`.

def grad_ids(train: tg.Training) -> dict[str, int]:
    """{param name: node id of its gradient in train.ir}."""
    return dict(train._grads)


def updated_params(train: tg.Training, values: list[Any]) -> dict[str, Any]:
    """{param name: its value after the step}, from the reference `values` of train.ir: the
    writeback sources, per param or (arena) ranges of the param arena cut by its layout."""
    import numpy as np

    out, arena = {}, None
    for wb in train._opt.writebacks:
        if wb.kind == "param":
            out[wb.dest] = values[wb.source]
        elif wb.kind == "node":
            arena = np.array(values[wb.dest]) if arena is None else arena
            start = wb.offset // 4
            arena[start:start + values[wb.source].size] = values[wb.source]
    for name, offset in (train._opt.layout or {}).items():
        shape = train.param_shapes[name]
        out[name] = arena[offset:offset + int(np.prod(shape))].reshape(shape)
    return out


def reference_values(train: tg.Training, feeds: dict[str, Any], t: int = 1) -> list[Any]:
    """Reference-interpreter values (float32) of every node of `train.ir` for step `t`
    with params and inputs `feeds` (the hidden optimizer inputs are added; state is at its
    init value, i.e. this is right for the first step after compile/reset)."""
    import numpy as np

    from tensorgrad.optim import host_scalars
    from tensorgrad.reference import evaluate

    hidden = host_scalars(train._optimizer, t, names=train._opt.scalar_inputs)
    feeds = {k: np.asarray(v) for k, v in feeds.items()}
    return evaluate(train.ir, {**feeds, **{k: np.float32(v) for k, v in hidden.items()}})
