"""PyTorch source expressions: what the op table's `torch=` translations write with.

A translation (``OpDef.torch``, given by ``define(..., torch=...)`` next to the op's kernel)
writes one IR node as a PyTorch expression: ``torch(node, args, cx) -> Expr``. ``node`` is a
:class:`TorchNode` (op, dtype, and the shape and attrs with :class:`Sym` where a size follows
the exported None dim), ``args`` the operands' expressions, ``cx`` the :class:`TorchContext`
of the function being written (sizes, the device, the helpers the module needs).
``tensorgrad.export`` assembles the module from them. Everything here is text: no torch is
imported, and the module stays small (it loads with ``import tensorgrad``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from ..ir import DType


# Operator precedence of an expression's outermost operation (higher binds tighter).
ATOM, UNARY, MUL, ADD, CMP = 100, 90, 80, 70, 50

TORCH_DTYPES = {"f32": "torch.float32", "i32": "torch.int64", "bool": "torch.bool"}


# Plain classes and NamedTuples, not dataclasses: this module loads with `import tensorgrad`
# (in the browser too), and a dataclass costs about a millisecond to define.
class Expr:
    """Python source of one value, its outermost precedence, and the number it is when it is
    a 0-d constant written as a literal (`scalar`)."""

    __slots__ = ("prec", "scalar", "text")

    def __init__(self, text: str, prec: int = ATOM, scalar: Any = None):
        self.text, self.prec, self.scalar = text, prec, scalar

    def __repr__(self) -> str:
        return f"Expr({self.text!r}, prec={self.prec}, scalar={self.scalar!r})"


class Sym(NamedTuple):
    """A size that follows the None dim: a * N + c."""

    a: int
    c: int

    def render(self, name: str) -> str:
        """The size as source, in terms of the None dim's name."""
        core = name if self.a == 1 else f"{self.a} * {name}"
        if self.c > 0:
            return f"{core} + {self.c}"
        if self.c < 0:
            return f"{core} - {-self.c}"
        return core


class SymFloat(NamedTuple):
    """A float op argument that follows the None dim: 1 / (a * N + c) (``recip``) or a*N+c."""

    a: float
    c: float
    recip: bool


class TorchNode(NamedTuple):
    """One IR node as its translation sees it: sizes that follow the None dim are Syms."""

    op: str
    dtype: DType
    shape: Sequence[Any]
    attrs: Mapping[str, Any]


def literal(v: Any) -> str:
    """A Python literal of a number (infinities and NaN as ``float("...")``)."""
    if isinstance(v, float):
        if math.isinf(v):
            return 'float("inf")' if v > 0 else '-float("inf")'
        if math.isnan(v):
            return 'float("nan")'
    return repr(v)


def constant(v: Any) -> Expr:
    """A number as a literal expression (a 0-d constant)."""
    text = literal(v)
    return Expr(text, UNARY if text.startswith("-") else ATOM, scalar=v)


def paren(e: Expr, prec: int, right: bool = False) -> str:
    """`e`'s text, parenthesised where an operator of `prec` would bind it otherwise."""
    if e.prec < prec or (right and e.prec == prec and prec < ATOM):
        return f"({e.text})"
    return e.text


def binary(a: Expr, op: str, b: Expr, prec: int) -> Expr:
    """``a op b`` for a left-associative operator of precedence `prec`."""
    return Expr(f"{paren(a, prec)} {op} {paren(b, prec, right=True)}", prec)


def negate(x: Expr) -> Expr:
    """``-x``."""
    return Expr(f"-{paren(x, UNARY)}", UNARY)


def method(x: Expr, call: str) -> Expr:
    """``x.call`` (e.g. ``method(x, "sum(-1)")``)."""
    return Expr(f"{paren(x, ATOM)}.{call}")


def call(name: str, *args: str) -> Expr:
    """``name(args...)``."""
    return Expr(f"{name}({', '.join(args)})")


class TorchContext:
    """What a translation may ask of the function being written: sizes in terms of the None
    dim (`dim`, `dims`, `tuple_`, `number`), the device to create tensors on, scalars as
    tensors, and the runtime helpers (``tensorgrad.export``'s) the module must define."""

    def __init__(self, size_name: str | None, device_ref: str):
        self.size_name = size_name
        self.device_ref = device_ref
        self.helpers: set[str] = set()
        self.uses_size = False

    def dim(self, d: Any) -> str:
        """One size (an int or a Sym) as source."""
        if isinstance(d, Sym):
            assert self.size_name is not None
            self.uses_size = True
            return d.render(self.size_name)
        return str(d)

    def dims(self, shape: Sequence[Any]) -> str:
        """Sizes as comma-separated source."""
        return ", ".join(self.dim(d) for d in shape)

    def tuple_(self, shape: Sequence[Any]) -> str:
        """Sizes as a tuple literal."""
        inner = self.dims(shape)
        return f"({inner},)" if len(shape) == 1 else f"({inner})"

    def number(self, v: Any) -> Expr:
        """An op argument (a number or a SymFloat) as an expression."""
        if isinstance(v, SymFloat):
            assert self.size_name is not None
            self.uses_size = True
            inner = Sym(int(v.a), int(v.c)).render(self.size_name) if (
                float(v.a).is_integer() and float(v.c).is_integer()) else \
                f"{v.a!r} * {self.size_name} + {v.c!r}"
            return Expr(f"1.0 / ({inner})" if v.recip else inner, MUL if v.recip else ADD)
        return constant(v)

    def device(self) -> str:
        """Source of the device new tensors go on (that of an argument or a param)."""
        return f"{self.device_ref}.device"

    def helper(self, name: str) -> str:
        """The name of a runtime helper function, which the module will then define."""
        self.helpers.add(name)
        return name

    def tensor(self, e: Expr, dtype: DType) -> Expr:
        """A scalar literal as a 0-d tensor (for consumers that need a tensor)."""
        if e.scalar is None:
            return e
        return call("torch.tensor", e.text, f"dtype={TORCH_DTYPES[dtype]}",
                    f"device={self.device()}")


# translation(node, operand expressions, context) -> the node's expression.
TorchFn = Callable[[TorchNode, Sequence[Expr], TorchContext], Expr]


def operator(symbol: str, prec: int) -> TorchFn:
    """The translation of a binary operator (two literal operands: the first as a tensor)."""
    def translate(n: TorchNode, a: Sequence[Expr], cx: TorchContext) -> Expr:
        x, y = a
        if x.scalar is not None and y.scalar is not None:
            x = cx.tensor(x, "f32" if isinstance(x.scalar, float) else "i32")
        return binary(x, symbol, y, prec)
    return translate


def function(name: str) -> TorchFn:
    """The translation of a unary f32 function, ``name(x)`` (e.g. ``torch.exp``)."""
    def translate(n: TorchNode, a: Sequence[Expr], cx: TorchContext) -> Expr:
        return call(name, cx.tensor(a[0], "f32").text)
    return translate


def last_axis(call_text: str) -> TorchFn:
    """The translation of a reduction over the last axis, a method of the input
    (e.g. ``last_axis("sum(-1)")``)."""
    def translate(n: TorchNode, a: Sequence[Expr], cx: TorchContext) -> Expr:
        return method(a[0], call_text)
    return translate
