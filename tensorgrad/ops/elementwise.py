"""Elementwise ops: constants, arithmetic, comparisons, where, unary math, activations."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeGuard

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..errors import ShapeError
from ..ir import DTYPES, Attrs, DType, Node, Shape
from ..tensor import Tensor
from .broadcast import broadcast_to, sum_to_shape
from .registry import NO_GRAD, InferFn, VjpFn, ZerosFn, define, public, record
from .rules import (
    broadcast_shapes,
    check_dims,
    is_finite_number,
    require_dtype,
    same_dtype,
)

TensorLike = Tensor | float | int

SQRT_HALF = 1.0 / math.sqrt(2.0)
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
# Abramowitz & Stegun 7.1.26 (max abs error 1.5e-7); the kernel and the reference share it.
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _np() -> ModuleType:
    import numpy as np
    return np


def erf_reference(x: Any) -> Any:
    np = _np()
    t = 1.0 / (1.0 + ERF_P * np.abs(x))
    a1, a2, a3, a4, a5 = ERF_A
    poly = t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * a5))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


ERF_WGSL = f"""fn erf_as(x: f32) -> f32 {{
  let t = 1.0f / (1.0f + {ERF_P}f * abs(x));
  let poly = t * ({ERF_A[0]}f + t * ({ERF_A[1]}f + t * ({ERF_A[2]}f + t * ({ERF_A[3]}f
    + t * {ERF_A[4]}f))));
  return sign(x) * (1.0f - poly * exp(-x * x));
}}"""


# WGSL leaves log/sqrt of a negative number indeterminate (SwiftShader's log gives log|x|):
# select NaN explicitly, as NumPy does. A runtime bitcast: a const NaN is a WGSL error.
NAN_WGSL = """fn nan_if(x: f32, bad: bool) -> f32 {
  return select(x, bitcast<f32>(0x7fc00000u | u32(bad)), bad);
}"""

# WGSL's builtin tanh loses all relative accuracy near 0 on some drivers (lavapipe gives
# tanh(1e-12) = 3e-8), which wrecks gradients of deep tanh nets at small init. Odd Taylor
# series below 0.1 (error < 3e-10 relative), a cancellation-free exp form above.
TANH_WGSL = """fn tanh_tg(x: f32) -> f32 {
  let a = abs(x);
  if (a < 0.1f) {
    let x2 = x * x;
    return x * (1.0f + x2 * (-0.33333334f + x2 * (0.13333334f - x2 * 0.05396825f)));
  }
  let e = exp(-2.0f * min(a, 15.0f));
  return sign(x) * (1.0f - e) / (1.0f + e);
}"""


# ---- constants -------------------------------------------------------------------------

def _infer_full(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    if attrs["dtype"] not in DTYPES:
        raise ShapeError("full", f"dtype must be one of {DTYPES}, got {attrs['dtype']!r}")
    return tuple(attrs["shape"]), attrs["dtype"]


def _torch_full(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    value = float(n.attrs["value"]) if n.dtype == "f32" else (
        bool(n.attrs["value"]) if n.dtype == "bool" else int(n.attrs["value"]))
    if not n.shape:
        return tx.constant(value)
    return tx.call("torch.full", cx.tuple_(n.shape), tx.literal(value),
                   f"dtype={tx.TORCH_DTYPES[n.dtype]}", f"device={cx.device()}")


define("full", infer=_infer_full,
       ref=lambda args, node: _np().full(node.shape, node.attrs["value"]),
       vjp=NO_GRAD,
       expr=lambda node: w.lit(node.attrs["value"], node.dtype),
       torch=_torch_full, doc="A tensor filled with one value.")


def full(shape: Sequence[int], value: float, dtype: DType = "f32") -> Tensor:
    """A tensor of `shape` filled with `value`."""
    shape = tuple(shape)
    if shape:
        check_dims("full", shape)
    return record("full", [], shape=shape, value=value, dtype=dtype)


@public
def zeros(shape: Sequence[int], dtype: DType = "f32") -> Tensor:
    """A tensor of zeros, `shape` of positive ints."""
    check_dims("zeros", tuple(shape))
    return full(shape, 0, dtype)


@public
def ones(shape: Sequence[int], dtype: DType = "f32") -> Tensor:
    """A tensor of ones, `shape` of positive ints."""
    check_dims("ones", tuple(shape))
    return full(shape, 1, dtype)


def scalar_of(op: str, value: float, dtype: DType) -> float:
    """A Python number as a scalar operand of a `dtype` tensor: an int for i32, where a
    number that is not an integer is refused (an i32 op would truncate 0.5 to 0 silently),
    else a float."""
    if dtype != "i32":
        return float(value)
    if isinstance(value, float) and not value.is_integer():
        raise ShapeError(op, f"the number {value!r} is not an integer, and the tensor it "
                         "meets is i32: an i32 op would truncate it. Pass an integer, or "
                         "compute with an f32 tensor")
    return int(value)


def _as_tensor(op: str, x: TensorLike, like: Tensor) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ShapeError(op, f"expected a Tensor or a Python number, got {type(x).__name__}")
    return full((), scalar_of(op, x, like.dtype), like.dtype)


def _both(op: str, a: TensorLike, b: TensorLike) -> tuple[Tensor, Tensor]:
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise ShapeError(op, "at least one operand must be a Tensor")
    like = a if isinstance(a, Tensor) else b
    return _as_tensor(op, a, like), _as_tensor(op, b, like)  # type: ignore[arg-type]


def _is_number(x: object) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ---- binary arithmetic -----------------------------------------------------------------

def _binary_infer(op: str, dtypes: tuple[DType, ...], out_dtype: DType | None = None
                  ) -> InferFn:
    def infer(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
        a, b = inputs
        dtype = same_dtype(op, inputs)
        require_dtype(op, a, *dtypes, what="operands")
        return broadcast_shapes(op, a.shape, b.shape), out_dtype or dtype
    return infer


def _binary(name: str, np_fn: Callable[[Any, Any], Any], expr: str, vjp: Any,
            torch: tx.TorchFn, dtypes: tuple[DType, ...] = ("f32", "i32"),
            out_dtype: DType | None = None, doc: str = "") -> None:
    define(name, infer=_binary_infer(name, dtypes, out_dtype),
           ref=lambda args, node: np_fn(args[0], args[1]),
           vjp=vjp, expr=lambda node: expr, torch=torch,
           doc=doc or f"elementwise {expr} with broadcasting")


_binary("add", lambda a, b: a + b, "(a0 + a1)",
        lambda ins, out, dy, at: [dy, dy],
        tx.operator("+", tx.ADD))
_binary("sub", lambda a, b: a - b, "(a0 - a1)",
        lambda ins, out, dy, at: [dy, neg(dy)],
        tx.operator("-", tx.ADD))
_binary("mul", lambda a, b: a * b, "(a0 * a1)",
        lambda ins, out, dy, at: [mul(dy, ins[1]), mul(dy, ins[0])],
        tx.operator("*", tx.MUL))
_binary("div", lambda a, b: a / b, "(a0 / a1)",
        lambda ins, out, dy, at: [div(dy, ins[1]),
                                  neg(div(mul(dy, ins[0]), mul(ins[1], ins[1])))],
        tx.operator("/", tx.MUL), dtypes=("f32",))


def _minmax_vjp(compare: Callable[[Tensor, Tensor], Tensor]) -> VjpFn:
    def vjp(ins: Sequence[Tensor], out: Tensor, dy: Tensor, attrs: Attrs) -> list[Tensor]:
        a, b = ins
        mask = compare(a, b)  # where a strictly wins; ties send the gradient to b
        return [where(mask, dy, 0.0), where(mask, 0.0, dy)]
    return vjp


def _torch_minmax(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    """torch.clamp against a number, else torch.minimum / torch.maximum."""
    x, y = a
    bound = "min" if n.op == "maximum" else "max"
    if y.scalar is not None and x.scalar is None:
        return tx.call("torch.clamp", x.text, f"{bound}={y.text}")
    if x.scalar is not None and y.scalar is None:
        return tx.call("torch.clamp", y.text, f"{bound}={x.text}")
    return tx.call(f"torch.{n.op}", cx.tensor(x, n.dtype).text, cx.tensor(y, n.dtype).text)


def _minmax_expr(fn: str) -> Callable[[Node], str]:
    """min/max of a0, a1; for floats a NaN operand gives NaN (as NumPy and PyTorch), which
    WGSL's min/max leave to the driver (several return the other operand)."""
    def expr(node: Node) -> str:
        if node.dtype == "i32":
            return f"{fn}(a0, a1)"
        return f"select(select({fn}(a0, a1), a0, is_nan(a0)), a1, is_nan(a1))"
    return expr


def _minmax(name: str, fn: str, compare: Callable[[Tensor, Tensor], Tensor]) -> None:
    define(name, infer=_binary_infer(name, ("f32", "i32")),
           ref=lambda args, node: getattr(_np(), name)(args[0], args[1]),
           vjp=_minmax_vjp(compare), expr=_minmax_expr(fn), prelude=w.IS_NAN_WGSL,
           torch=_torch_minmax, doc=f"elementwise {fn}(a, b) with broadcasting (NaN wins)")


_minmax("minimum", "min", lambda a, b: less(a, b))
_minmax("maximum", "max", lambda a, b: greater(a, b))
_binary("less", lambda a, b: a < b, "select(0u, 1u, a0 < a1)", NO_GRAD,
        tx.operator("<", tx.CMP), out_dtype="bool")
_binary("greater", lambda a, b: a > b, "select(0u, 1u, a0 > a1)", NO_GRAD,
        tx.operator(">", tx.CMP), out_dtype="bool")


def _scalar_infer(op: str) -> InferFn:
    def infer(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
        require_dtype(op, inputs[0], "f32", "i32")
        return inputs[0].shape, inputs[0].dtype
    return infer


def _torch_add_scalar(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    s = cx.number(n.attrs["scalar"])
    if s.scalar is not None and s.scalar < 0:
        return tx.binary(a[0], "-", tx.constant(-s.scalar), tx.ADD)
    return tx.binary(a[0], "+", s, tx.ADD)


def _torch_mul_scalar(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    s = cx.number(n.attrs["scalar"])
    if s.scalar == -1:
        return tx.negate(a[0])
    return tx.binary(a[0], "*", s, tx.MUL)


define("add_scalar", infer=_scalar_infer("add_scalar"),
       ref=lambda args, node: args[0] + node.attrs["scalar"],
       vjp=lambda ins, out, dy, at: [dy],
       expr=lambda node: f"(a0 + {w.lit(node.attrs['scalar'], node.dtype)})",
       torch=_torch_add_scalar, doc="x + scalar")
define("mul_scalar", infer=_scalar_infer("mul_scalar"),
       ref=lambda args, node: args[0] * node.attrs["scalar"],
       vjp=lambda ins, out, dy, at: [mul_scalar(dy, at["scalar"])],
       expr=lambda node: f"(a0 * {w.lit(node.attrs['scalar'], node.dtype)})",
       torch=_torch_mul_scalar, doc="x * scalar",
       zeros=lambda node, inputs, zeros: zeros[0] if is_finite_number(node.attrs["scalar"])
       else None)


def add_scalar(x: Tensor, s: float) -> Tensor:
    return record("add_scalar", [x], scalar=scalar_of("add", s, x.dtype))


def mul_scalar(x: Tensor, s: float) -> Tensor:
    return record("mul_scalar", [x], scalar=scalar_of("mul", s, x.dtype))


@public
def add(a: TensorLike, b: TensorLike) -> Tensor:
    """a + b with broadcasting; a Python number on either side."""
    if _is_number(b) and isinstance(a, Tensor):
        return add_scalar(a, b)
    if _is_number(a) and isinstance(b, Tensor):
        return add_scalar(b, a)
    return record("add", list(_both("add", a, b)))


@public
def sub(a: TensorLike, b: TensorLike) -> Tensor:
    """a - b with broadcasting; a Python number on either side."""
    if _is_number(b) and isinstance(a, Tensor):
        return add_scalar(a, -scalar_of("sub", b, a.dtype))
    return record("sub", list(_both("sub", a, b)))


@public
def mul(a: TensorLike, b: TensorLike) -> Tensor:
    """a * b with broadcasting; a Python number on either side."""
    if _is_number(b) and isinstance(a, Tensor):
        return mul_scalar(a, b)
    if _is_number(a) and isinstance(b, Tensor):
        return mul_scalar(b, a)
    return record("mul", list(_both("mul", a, b)))


@public
def div(a: TensorLike, b: TensorLike) -> Tensor:
    """a / b (f32) with broadcasting; a Python number on either side."""
    if _is_number(b) and isinstance(a, Tensor):
        if b == 0:
            raise ShapeError("div", "division by the scalar 0")
        require_dtype("div", a.node, "f32", what="dividend")
        return mul_scalar(a, 1.0 / b)
    return record("div", list(_both("div", a, b)))


@public
def minimum(a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise min with broadcasting (gradient ties go to `b`)."""
    return record("minimum", list(_both("minimum", a, b)))


@public
def maximum(a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise max with broadcasting (gradient ties go to `b`)."""
    return record("maximum", list(_both("maximum", a, b)))


@public
def less(a: TensorLike, b: TensorLike) -> Tensor:
    """a < b as a bool tensor, with broadcasting."""
    return record("less", list(_both("less", a, b)))


@public
def greater(a: TensorLike, b: TensorLike) -> Tensor:
    """a > b as a bool tensor, with broadcasting."""
    return record("greater", list(_both("greater", a, b)))


def _infer_where(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    cond, a, b = inputs
    require_dtype("where", cond, "bool", what="cond")
    dtype = same_dtype("where", [a, b])
    return broadcast_shapes("where", cond.shape, a.shape, b.shape), dtype


def _vjp_where(ins: Sequence[Tensor], out: Tensor, dy: Tensor, attrs: Attrs
               ) -> list[Tensor | None]:
    cond = ins[0]
    return [None, where(cond, dy, 0.0), where(cond, 0.0, dy)]


def _torch_where(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    c, x, y = a
    c = cx.tensor(c, "bool")
    if x.scalar is not None and y.scalar is not None:
        x = cx.tensor(x, n.dtype)
    return tx.call("torch.where", c.text, x.text, y.text)


define("where", infer=_infer_where,
       ref=lambda args, node: _np().where(args[0], args[1], args[2]),
       vjp=_vjp_where, expr=lambda node: "select(a2, a1, a0 != 0u)", torch=_torch_where,
       doc="cond ? a : b with 3-way broadcasting")


@public
def where(cond: Tensor, a: TensorLike, b: TensorLike) -> Tensor:
    """`a` where `cond` (bool) is true, else `b`; 3-way broadcasting, numbers allowed."""
    if not isinstance(cond, Tensor):
        raise ShapeError("where", f"cond must be a bool Tensor, got {type(cond).__name__}")
    a_t, b_t = _both("where", a, b)
    if not isinstance(a, Tensor) and isinstance(b, Tensor):
        a_t = full((), scalar_of("where", a, b.dtype), b.dtype)
    return record("where", [cond, a_t, b_t])


# ---- unary -----------------------------------------------------------------------------

def _unary_infer(op: str) -> InferFn:
    def infer(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
        require_dtype(op, inputs[0], "f32")
        return inputs[0].shape, "f32"
    return infer


def _unary(name: str, np_fn: Callable[[Any], Any], expr: str, vjp: Any, doc: str,
           torch: tx.TorchFn, prelude: str = "", zeros: ZerosFn | None = None
           ) -> Callable[[Tensor], Tensor]:
    define(name, infer=_unary_infer(name), ref=lambda args, node: np_fn(args[0]), vjp=vjp,
           expr=lambda node: expr, prelude=prelude, doc=doc, zeros=zeros, torch=torch)

    def fn(x: Tensor) -> Tensor:
        return record(name, [x])
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{doc} (elementwise, f32)."
    return public(fn)


sqrt = _unary("sqrt", lambda x: _np().sqrt(x), "nan_if(sqrt(a0), a0 < 0.0f)",
              lambda i, c, dy, at: [mul_scalar(div(dy, c), 0.5)], "Square root",
              prelude=NAN_WGSL,
              torch=tx.function("torch.sqrt"))
rsqrt = _unary("rsqrt", lambda x: 1.0 / _np().sqrt(x), "nan_if(1.0f / sqrt(a0), a0 < 0.0f)",
               lambda i, c, dy, at: [mul_scalar(mul(dy, mul(c, mul(c, c))), -0.5)],
               "1 / sqrt(x)", prelude=NAN_WGSL,
               torch=tx.function("torch.rsqrt"))
log = _unary("log", lambda x: _np().log(x), "nan_if(log(a0), a0 < 0.0f)",
             lambda i, c, dy, at: [div(dy, i[0])], "Natural log", prelude=NAN_WGSL,
             torch=tx.function("torch.log"))
exp = _unary("exp", lambda x: _np().exp(x), "exp(a0)",
             lambda i, c, dy, at: [mul(dy, c)], "e^x",
             torch=tx.function("torch.exp"))
neg: Callable[[Tensor], Tensor] = _unary("neg", lambda x: -x, "(-a0)", lambda i, c, dy, at: [neg(dy)], "-x",
             zeros=lambda node, inputs, zeros: zeros[0],
             torch=lambda n, a, cx: tx.negate(a[0]))
abs = _unary("abs", lambda x: _np().abs(x), "abs(a0)",
             lambda i, c, dy, at: [where(less(i[0], 0.0), neg(dy), dy)],
             "|x| (gradient +1 at 0)",
             torch=tx.function("torch.abs"))
tanh = _unary("tanh", lambda x: _np().tanh(x), "tanh_tg(a0)",
              lambda i, c, dy, at: [mul(dy, add_scalar(neg(mul(c, c)), 1.0))],
              "Hyperbolic tangent", prelude=TANH_WGSL,
              torch=tx.function("torch.tanh"))
sigmoid = _unary("sigmoid", lambda x: 0.5 + 0.5 * _np().tanh(0.5 * x),
                 "(0.5f + 0.5f * tanh_tg(0.5f * a0))",
                 lambda i, c, dy, at: [mul(dy, sub(c, mul(c, c)))],
                 "Logistic sigmoid, computed as 0.5 + 0.5 tanh(x/2)", prelude=TANH_WGSL,
                 torch=tx.function("torch.sigmoid"))
erf = _unary("erf", erf_reference, "erf_as(a0)",
             lambda i, c, dy, at: [mul(dy, mul_scalar(exp(neg(mul(i[0], i[0]))),
                                                      TWO_OVER_SQRT_PI))],
             "Error function (Abramowitz-Stegun 7.1.26)", prelude=ERF_WGSL,
             torch=tx.function("torch.erf"))
sin = _unary("sin", lambda x: _np().sin(x), "sin(a0)",
             lambda i, c, dy, at: [mul(dy, cos(i[0]))], "Sine",
             torch=tx.function("torch.sin"))
cos: Callable[[Tensor], Tensor] = _unary("cos", lambda x: _np().cos(x), "cos(a0)",
             lambda i, c, dy, at: [mul(dy, neg(sin(i[0])))], "Cosine",
             torch=tx.function("torch.cos"))
# max(NaN, 0) is 0 on some drivers: relu keeps a NaN (as NumPy and PyTorch), as maximum does
relu = _unary("relu", lambda x: _np().maximum(x, 0), "select(max(a0, 0.0f), a0, is_nan(a0))",
              lambda i, c, dy, at: [record("relu_grad", [c, dy])], "max(x, 0)",
              prelude=w.IS_NAN_WGSL,
              torch=tx.function("torch.relu"))


def _infer_relu_grad(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    x, dy = inputs
    if x.shape != dy.shape:
        raise ShapeError("relu_grad", f"x {list(x.shape)} and dy {list(dy.shape)} differ")
    return x.shape, "f32"


# relu_grad reads relu's output (y > 0 exactly where x > 0, NaN in neither), so the backward
# needs no pre-activation: a bias add + relu can then be a matmul's epilogue.
define("relu_grad", infer=_infer_relu_grad,
       ref=lambda args, node: _np().where(args[0] > 0, args[1], 0),
       vjp="grad_error", expr=lambda node: "select(0.0f, a1, a0 > 0.0f)",
       doc="dy where y > 0, else 0 (y: relu's output or input)")


def _infer_same(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    return inputs[0].shape, inputs[0].dtype


define("stop_gradient", infer=_infer_same, ref=lambda args, node: args[0].copy(),
       vjp=NO_GRAD, expr=lambda node: "a0", doc="identity, no gradient",
       torch=lambda n, a, cx: tx.method(cx.tensor(a[0], n.dtype), "detach()"))


@public
def stop_gradient(x: Tensor) -> Tensor:
    """Identity forward; no gradient flows back through it."""
    return record("stop_gradient", [x])


# ---- composed activations --------------------------------------------------------------

@public
def square(x: Tensor) -> Tensor:
    """x * x."""
    return mul(x, x)


def power(x: Tensor, exponent: Any) -> Tensor:
    """``x ** exponent`` for the exponents with a dedicated op: 2, 1, 0.5 and -0.5."""
    if exponent == 2:
        return square(x)
    if exponent == 1:
        return x
    if exponent == 0.5:
        return sqrt(x)
    if exponent == -0.5:
        return rsqrt(x)
    raise ShapeError("pow", f"only the exponents 2, 1, 0.5 and -0.5 are supported, "
                     f"got {exponent!r}")


@public
def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return mul(x, sigmoid(x))


@public
def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU: exact erf form by default (PyTorch's nn.GELU()), or approximate="tanh"."""
    if approximate == "none":
        return mul(mul_scalar(x, 0.5), add_scalar(erf(mul_scalar(x, SQRT_HALF)), 1.0))
    if approximate == "tanh":
        inner = mul_scalar(add(x, mul_scalar(mul(x, mul(x, x)), 0.044715)), 0.7978845608028654)
        return mul(mul_scalar(x, 0.5), add_scalar(tanh(inner), 1.0))
    raise ShapeError("gelu", f"approximate must be 'none' or 'tanh', got {approximate!r}")


@public
def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0 else negative_slope * x (right for any slope)."""
    if not _is_number(negative_slope):
        raise ShapeError("leaky_relu", f"negative_slope must be a number, got "
                         f"{type(negative_slope).__name__} {negative_slope!r}")
    return where(greater(x, 0.0), x, mul_scalar(x, negative_slope))


@public
def softplus(x: Tensor) -> Tensor:
    """log(1 + e^x), computed overflow-safely as (x + |x|) / 2 + log(1 + e^-|x|): its
    gradient is sigmoid(x) everywhere, 0.5 at 0 as in PyTorch (max(x, 0) in place of
    (x + |x|) / 2 would give -0.5 there, relu's and abs's choices at 0 disagreeing)."""
    return add(mul_scalar(add(x, abs(x)), 0.5), log(add_scalar(exp(neg(abs(x))), 1.0)))


@public
def clamp(x: Tensor, min: float | None = None, max: float | None = None) -> Tensor:
    """Limit x to [min, max] (either bound may be None). The gradient is 1 where min <= x <=
    max, bounds included, as torch.clamp's; a NaN stays NaN."""
    if min is None and max is None:
        raise ShapeError("clamp", "give at least one of min and max")
    out = x
    if min is not None:
        out = maximum(min, out)  # (ties send the gradient to the second operand: x)
    if max is not None:
        out = minimum(max, out)
    return out


__all__ = [
    "abs",
    "add",
    "add_scalar",
    "broadcast_to",
    "clamp",
    "cos",
    "div",
    "erf",
    "exp",
    "full",
    "gelu",
    "greater",
    "leaky_relu",
    "less",
    "log",
    "maximum",
    "minimum",
    "mul",
    "mul_scalar",
    "neg",
    "ones",
    "relu",
    "rsqrt",
    "sigmoid",
    "silu",
    "sin",
    "softplus",
    "sqrt",
    "square",
    "stop_gradient",
    "sub",
    "sum_to_shape",
    "tanh",
    "where",
    "zeros",
]
