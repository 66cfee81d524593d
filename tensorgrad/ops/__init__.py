"""The op set. Importing this package fills the op table (:mod:`.registry`)."""

from . import index, reduce, shape  # noqa: F401  (reductions, shape ops, indexing)
from . import conv, linalg, nn, stochastic  # noqa: F401  (conv/pool, matmul, losses, prng)
from . import optim_ops  # noqa: F401  (optimizer update primitives)
from .broadcast import broadcast_to, sum_to_shape
from .elementwise import *  # noqa: F401,F403
from .registry import OPS, PUBLIC

globals().update(PUBLIC)
__all__ = ["OPS", "PUBLIC", "broadcast_to", "sum_to_shape", *sorted(PUBLIC)]
