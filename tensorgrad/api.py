"""The public, async training and inference API: `compile`, `compile_forward`, and the handles.

    train = await tg.compile(model=MLP(), loss=loss_fn, inputs={"x": [256, 1], "y": [256, 1]},
                             optimizer=tg.optim.Adam(lr=5e-3))
    result = await train.step(x=x, y=y)          # Completed | Aborted | Failed, never raises

The handles (:class:`~tensorgrad.training.Training`, :class:`~tensorgrad.forward.Forward`,
their shared base in :mod:`tensorgrad.handle`) hold what a compiled graph needs between calls
(its executable, the params, the optimizer's step counter and LR); every graph and every param
store is made by the stages of :func:`tensorgrad.compiler.compile_graph`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .compiler import Options, Request, compile_graph
from .forward import Forward, check_output
from .gpu import GPUDevice, request_device
from .handle import DEFAULT_CHUNK_SIZE
from .module import Module
from .optim import OptimizerConfig
from .precision import LossScale, check_precision
from .tensor import Tensor
from .trace import check_seed, normalize_inputs
from .training import Training

if TYPE_CHECKING:
    from .ir import DType
    from .trace import InputSpec

_default_device: GPUDevice | None = None


async def default_device() -> GPUDevice:
    """The process-wide default device (created on first use, and again after a loss)."""
    global _default_device
    if _default_device is None or _default_device.lost:
        _default_device = await request_device()
    return _default_device


async def compile(*, model: Module, loss: Callable[..., Tensor],
                  inputs: Mapping[str, InputSpec], optimizer: OptimizerConfig,
                  device: GPUDevice | None = None,
                  seed: int | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
                  fuse: bool = True, tiered: bool | None = None, precision: str = "f32",
                  loss_scale: LossScale | None = None) -> Training:
    """Trace `loss(model, **inputs)`, derive gradients, append `optimizer` and compile the
    whole training step for `device` (default: navigator.gpu in Pyodide, wgpu natively).

    `inputs`: {name: shape} (f32) or {name: (shape, "i32")}, every dim given: the step is
    compiled for those shapes (a None dim raises, naming the forward calls that take one:
    ``train.attach(forward=..., inputs={"x": (None, 1)})``). Host data given to `step` must
    fit it: data carrying 2 or more dims (numpy arrays, nested lists, memoryviews) must have
    the declared shape exactly, flat data of the right size is read row-major. `seed`: an int
    (None: random). `chunk_size`: most compute
    passes per GPU submission (0: one submission per step). `fuse`: inline chains of
    elementwise ops into single kernels (fewer dispatches, less memory traffic). `tiered`:
    start on kernels that compile quickest (naive matmuls) and swap in the optimized ones
    once their pipelines, compiled in the background after the first step, are ready (same
    results, the same buffers); None (the default) tiers where shader compiles are dear
    (SwiftShader), False never, True always. `precision`: ``"f32"`` (the default) or
    ``"mixed"``, automatic mixed precision like ``torch.autocast`` with a ``GradScaler``: f16
    activations, kernels computing and matmuls accumulating in f32, f32 params, gradients
    and optimizer state, and dynamic loss scaling (`loss_scale`: a :class:`LossScale`, by
    default GradScaler's settings; ``train.loss_scale`` and ``train.skipped_steps`` show it
    at work; a step whose scaled gradients overflow completes with ``skipped=True``). It needs
    the device's ``shader-f16`` feature: FeatureError, naming the adapter, where it is
    missing (no silent fallback; attached forwards run in the same precision). Mistakes in
    the model raise here (ShapeError / TraceError); `step` itself never raises."""
    if not isinstance(chunk_size, int) or chunk_size < 0:
        raise ValueError(f"chunk_size must be an int >= 0, got {chunk_size!r}")
    normalize_inputs(inputs, wildcards=False, op="compile")  # clear errors before the device
    check_seed(seed)
    check_precision(precision)
    device = device or await default_device()
    train = Training(device, loss, inputs, chunk_size, fuse, tiered, precision, loss_scale)
    train._build(model, optimizer, seed)
    return train


async def compile_forward(*, model: Module, forward: Callable[..., Tensor],
                          inputs: Mapping[str, InputSpec], output: DType = "f32",
                          device: GPUDevice | None = None, seed: int | None = None,
                          max_cached_shapes: int = 8,
                          chunk_size: int = DEFAULT_CHUNK_SIZE, fuse: bool = True) -> Forward:
    """A standalone forward executor with its own params (initialised from `seed`; load
    trained ones with `upload_params`). `inputs` may leave one dim per input as None
    (``{"x": (None, 1)}``): resolved from each run's data, each size compiled on first use
    and the last `max_cached_shapes` kept, as for :meth:`Training.attach`."""
    check_seed(seed)
    normalize_inputs(inputs, op="compile_forward")  # a clear error before any allocation
    check_output(output)
    device = device or await default_device()
    params = compile_graph(Request("params", model, seed=seed), Options.for_device(device))
    assert params.store is not None
    try:
        return Forward(device, forward, inputs, output, max_cached_shapes, chunk_size,
                       store=params.store, model=model, fuse=fuse)
    except BaseException:
        params.store.destroy()
        raise


__all__ = ["DEFAULT_CHUNK_SIZE", "Forward", "LossScale", "Training", "compile",
           "compile_forward", "default_device"]
