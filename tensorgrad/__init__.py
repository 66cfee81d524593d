"""tensorgrad: train small neural networks on WebGPU, from Python.

Write a model against the op set (`tg.matmul`, `tg.relu`, ... and layers such as
`tg.Linear`), then `train = await tg.compile(model=..., loss=..., inputs=..., optimizer=...)`
and `await train.step(**data)`. See the README for a complete example.
"""

from types import ModuleType

from . import init, lr, ops, optim
from .api import Forward, LossScale, Training, compile, compile_forward, default_device
from .compiler import trace, trace_forward
from .errors import (
                     AbortError,
                     DeviceLimitError,
                     DeviceLostError,
                     FeatureError,
                     MainThreadError,
                     PlanError,
                     ProtocolError,
                     RemoteError,
                     SafetensorsError,
                     ShaderCompileError,
                     ShapeError,
                     TraceError,
)
from .flight import single_flight
from .gpu import WebGPUSupport, check_webgpu
from .module import Module
from .nn import Conv2d, Embedding, LayerNorm, Linear, RMSNorm
from .ops import *
from .ops.registry import PUBLIC as _PUBLIC
from .results import Aborted, Captures, Completed, Failed, Result
from .safetensors import load_safetensors, save_safetensors
from .tensor import Tensor
from .version import __version__ as __version__

__all__ = [  # noqa: PLE0604  (the public ops are listed by the op table)
    "AbortError", "Aborted", "Captures", "Completed", "Conv2d", "DeviceLimitError",
    "DeviceLostError", "Embedding", "Failed", "FeatureError", "Forward", "LayerNorm", "Linear",
    "LossScale", "MainThreadError",
    "Module", "PlanError", "ProtocolError", "RMSNorm", "RemoteError", "Result", "SafetensorsError",
    "ShaderCompileError", "ShapeError",
    "Tensor", "TraceError", "Training", "WebGPUSupport", "check_webgpu", "compile",
    "compile_forward", "default_device", "export", "init",
    "load_safetensors", "lr", "ops", "optim", "save_safetensors", "single_flight", "trace",
    "trace_forward",
    *sorted(_PUBLIC),
]


def __getattr__(name: str) -> ModuleType:
    """`tg.export` is imported on first use: a compile does not need it, and its import is a
    sizeable part of tensorgrad's start-up in the browser (Pyodide)."""
    if name == "export":
        import importlib

        return importlib.import_module(".export", __name__)
    raise AttributeError(f"module 'tensorgrad' has no attribute {name!r}")
