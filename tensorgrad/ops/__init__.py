"""The op set. Importing this package fills the op table (:mod:`.registry`): each family
module defines its primitives and registers its public functions."""

from . import conv, index, linalg, nn, optim_ops, reduce, shape, stochastic  # noqa: F401
from .broadcast import broadcast_to, sum_to_shape
from .elementwise import *
from .registry import OPS, PUBLIC

globals().update(PUBLIC)
__all__ = ["OPS", "PUBLIC", "broadcast_to", "sum_to_shape", *sorted(PUBLIC)]  # noqa: PLE0604
