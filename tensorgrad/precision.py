"""Precision of a training step: ``"f32"`` (the default) or ``"mixed"``.

``precision="mixed"`` is automatic mixed precision as PyTorch users know it from
``torch.autocast`` with ``torch.cuda.amp.GradScaler``:

* activations (and their gradients) are stored as f16, every kernel computing in f32 (a matmul
  reads f16 operands and accumulates in f32); params stay f32 masters, and so do the param
  gradients and the optimizer's state (:mod:`tensorgrad.passes.precision` says which nodes);
* dynamic loss scaling: the backward pass starts from ``loss * scale`` (so small gradients do
  not flush to zero in f16) and the gradients are unscaled (times ``1 / scale``) before the
  optimizer sees them. A step whose scaled gradients overflow (non-finite, with a finite
  loss) is skipped on the GPU, params and state unchanged, and counts as a normal event: it
  completes with ``skipped=True`` and the scale is multiplied by `backoff_factor`; after
  `growth_interval` finite steps in a row the scale is multiplied by `growth_factor`
  (:class:`LossScale`, GradScaler's defaults). A non-finite *loss* is no overflow (the scale
  does not touch the forward pass) and fails the step as in f32.

It needs the device's ``shader-f16`` feature (f16 in WGSL): compiling for a device without it
raises :class:`~tensorgrad.errors.FeatureError` naming the adapter. There is no silent
fallback; choose f32 yourself where the feature is missing (see :func:`check_precision`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from .autograd import append_grad
from .errors import FeatureError
from .gpu.interface import AdapterInfo
from .ir import Graph
from .tensor import Tensor, leaf, tracing

PRECISIONS = ("f32", "mixed")
"""The values of ``compile(..., precision=...)``."""
F16_FEATURE = "shader-f16"
"""The optional WebGPU feature ``precision="mixed"`` needs."""
LOSS_SCALE = "__loss_scale"
"""The hidden per-step input the loss is multiplied by before the backward pass."""
LOSS_UNSCALE = "__loss_unscale"
"""The hidden per-step input the gradients are multiplied by: ``1 / loss scale``."""


def check_precision(precision: object, info: AdapterInfo | None = None) -> str:
    """`precision` when it is ``"f32"`` or ``"mixed"`` and, given the device's `info`, the
    device can run it; else ValueError (an unknown precision) or
    :class:`~tensorgrad.errors.FeatureError` (``"mixed"`` on a device without
    ``shader-f16``, naming the adapter)."""
    if precision not in PRECISIONS:
        raise ValueError(f"compile: precision must be one of {list(PRECISIONS)}, got "
                         f"{precision!r}")
    if precision == "mixed" and info is not None and F16_FEATURE not in info.features:
        have = ", ".join(sorted(info.features)) or "none"
        raise FeatureError(
            f"compile: precision='mixed' needs the WebGPU feature '{F16_FEATURE}' (f16 in "
            f"shaders), which the device on {info.name} ({info.backend or 'WebGPU'}) does not "
            f"have (its optional features: {have}); compile with precision='f32' there")
    return str(precision)


@dataclass(frozen=True)
class LossScale:
    """Dynamic loss scaling for ``precision="mixed"`` (torch.cuda.amp.GradScaler's rules and
    defaults): the scale starts at `init_scale`; a step whose gradients overflow is skipped
    and the scale multiplied by `backoff_factor`; after `growth_interval` finite steps in a
    row it is multiplied by `growth_factor`."""

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        def bad(name: str, want: str) -> ValueError:
            return ValueError(f"LossScale: {name} must be {want}, got "
                              f"{getattr(self, name)!r}")
        for name in ("init_scale", "growth_factor", "backoff_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value <= 0:
                raise bad(name, "a finite number > 0")
        if self.growth_factor < 1:
            raise bad("growth_factor", ">= 1")
        if self.backoff_factor >= 1:
            raise bad("backoff_factor", "< 1")
        if isinstance(self.growth_interval, bool) or not isinstance(self.growth_interval, int) \
                or self.growth_interval < 1:
            raise bad("growth_interval", "an int >= 1")


class LossScaler:
    """The host side of dynamic loss scaling: the current `scale`, the finite steps since it
    last changed, and the `skipped` steps so far."""

    def __init__(self, config: LossScale) -> None:
        self.config = config
        self.scale = float(config.init_scale)
        self.good_steps = 0
        self.skipped = 0

    def scalars(self) -> dict[str, float]:
        """The step's hidden inputs: the scale and its inverse."""
        return {LOSS_SCALE: self.scale, LOSS_UNSCALE: 1.0 / self.scale}

    def update(self, overflow: bool) -> None:
        """After a step: back off on an overflow (counted as skipped), else grow the scale
        once `growth_interval` finite steps have passed."""
        if overflow:
            self.skipped += 1
            self.good_steps = 0
            self.scale *= self.config.backoff_factor
            return
        self.good_steps += 1
        if self.good_steps >= self.config.growth_interval:
            self.good_steps = 0
            self.scale *= self.config.growth_factor

    def reset(self) -> None:
        """Back to the initial scale (the skipped count stays)."""
        self.scale = float(self.config.init_scale)
        self.good_steps = 0


def append_scaled_grad(graph: Graph, loss: int, frozen: Collection[str] = ()
                       ) -> dict[str, int]:
    """Gradients of ``loss * LOSS_SCALE`` (two hidden 0-d inputs appear: the scale and its
    inverse), each multiplied by ``LOSS_UNSCALE``: {param name: unscaled gradient node}, for
    every param but the `frozen` ones (as :func:`~tensorgrad.autograd.append_grad`)."""
    from . import ops

    node = graph[loss]
    if (node.shape, node.dtype) != ((), "f32"):
        append_grad(graph, loss, frozen)  # raises the error of a loss that is not a 0-d f32
    with tracing(graph, capture=False):
        scale = leaf("input", LOSS_SCALE, (), "f32")
        # made before the backward, so a gradient's unscaling can run as soon as it is summed
        unscale = leaf("input", LOSS_UNSCALE, (), "f32")
        scaled = ops.mul(Tensor(graph, loss), scale)
    grads = append_grad(graph, scaled.id, frozen)
    with tracing(graph, capture=False):
        return {name: ops.mul(Tensor(graph, g), unscale).id for name, g in grads.items()}


__all__ = ["F16_FEATURE", "LOSS_SCALE", "LOSS_UNSCALE", "PRECISIONS", "LossScale", "LossScaler",
           "append_scaled_grad", "check_precision"]
