"""tensorgrad: train small neural networks on WebGPU, from Python."""

from . import ops
from .errors import ShapeError, TraceError
from .ops import *  # noqa: F401,F403
from .tensor import Tensor

__all__ = ["ShapeError", "Tensor", "TraceError", "ops"]
