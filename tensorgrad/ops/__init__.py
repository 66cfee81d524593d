"""The op set. Importing this package fills the op table (:mod:`.registry`): each family
module defines its primitives and registers its public functions; the Python operators of
:class:`~tensorgrad.tensor.Tensor` are bound to the op functions here."""

from .. import tensor as _tensor
from . import (  # noqa: F401  (each family module fills the op table)
    arena,
    attention,
    conv,
)

# isort: split
from . import pool  # noqa: F401  (right after conv: the op table and tg.* keep their order)

# isort: split
from . import (  # noqa: F401
    index,
    linalg,
    nn,
    norm,
    optim_ops,
    reduce,
    shape,
    step_guard,
    stochastic,
    update_check,
)
from .broadcast import broadcast_to, sum_to_shape
from .elementwise import *
from .elementwise import power as _power
from .registry import OPS, PUBLIC

globals().update(PUBLIC)
_tensor.OPERATORS.update(add=add, sub=sub, mul=mul, div=div, matmul=linalg.matmul,
                         less=less, greater=greater, neg=neg, pow=_power)
__all__ = ["OPS", "PUBLIC", "broadcast_to", "sum_to_shape", *sorted(PUBLIC)]  # noqa: PLE0604
