"""tensorgrad: train small neural networks on WebGPU, from Python."""

from . import init, ops
from .errors import ShapeError, TraceError
from .module import Module
from .nn import Conv2d, Embedding, LayerNorm, Linear, RMSNorm
from .ops import *  # noqa: F401,F403
from .tensor import Tensor
from .trace import trace, trace_forward

__all__ = ["ShapeError", "Tensor", "TraceError", "ops"]
__all__ += ["Conv2d", "Embedding", "LayerNorm", "Linear", "Module", "RMSNorm", "init", "trace",
            "trace_forward"]
