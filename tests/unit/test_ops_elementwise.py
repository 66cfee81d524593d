"""Elementwise ops: forward vs PyTorch, gradients vs autograd and finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgrad as tg
from tensorgrad import ShapeError
from tests.harness import Arg, Case, build, run_reference

N = Arg((3, 4))
B = Arg((4,))
COL = Arg((3, 1))
POS = Arg((3, 4), gen="positive")
UNIT = Arg((2, 5), gen="unit")


def _bin(op, tfn, args, **kw):
    return Case(op, getattr(tg, op), args, torch_fn=tfn, **kw)


BOUNDS = np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 0.0], np.float32)
WITH_NAN = np.array([np.nan, -1.0, 0.25, np.nan, 2.0, 0.0], np.float32)

CASES = [
    _bin("add", torch.add, [N, B]),
    _bin("add", torch.add, [COL, Arg((1, 4))], name="both-stretch"),
    Case("add", lambda x: x + 2.5, [N], torch_fn=lambda x: x + 2.5, name="scalar-right"),
    Case("add", lambda x: 1 + x, [N], torch_fn=lambda x: 1 + x, name="scalar-left"),
    _bin("sub", torch.sub, [N, COL]),
    Case("sub", lambda x: 3.0 - x, [N], torch_fn=lambda x: 3.0 - x, name="scalar-left"),
    Case("sub", lambda x: x - 3.0, [N], torch_fn=lambda x: x - 3.0, name="scalar-right"),
    _bin("mul", torch.mul, [Arg((2, 3, 4)), Arg((3, 1))]),
    Case("mul", lambda x: 2 * x, [N], torch_fn=lambda x: 2 * x, name="scalar"),
    _bin("div", torch.div, [N, Arg((4,), gen="positive")]),
    Case("div", lambda x: x / 4.0, [N], torch_fn=lambda x: x / 4.0, name="by-scalar"),
    Case("div", lambda x: 1.0 / x, [POS], torch_fn=lambda x: 1.0 / x, name="scalar-over"),
    _bin("minimum", torch.minimum, [N, B]),
    _bin("maximum", torch.maximum, [N, COL]),
    Case("less", lambda a, b: a < b, [N, B], torch_fn=lambda a, b: a < b, grad=False),
    Case("greater", lambda a: a > 0.1, [N], torch_fn=lambda a: a > 0.1, grad=False),
    Case("where", lambda a, b: tg.where(a > 0.0, a, b), [N, B],
         torch_fn=lambda a, b: torch.where(a > 0, a, b)),
    Case("where", lambda a: tg.where(a < 0.0, 0.0, a), [N],
         torch_fn=lambda a: torch.where(a < 0, torch.zeros_like(a), a), name="scalar-a"),
    Case("sqrt", tg.sqrt, [POS], torch_fn=torch.sqrt),
    Case("rsqrt", tg.rsqrt, [POS], torch_fn=torch.rsqrt),
    Case("log", tg.log, [POS], torch_fn=torch.log),
    Case("exp", tg.exp, [N], torch_fn=torch.exp),
    Case("neg", tg.neg, [N], torch_fn=torch.neg),
    Case("neg", lambda x: -x, [N], torch_fn=lambda x: -x, name="operator"),
    Case("abs", tg.abs, [N], torch_fn=torch.abs),
    Case("square", tg.square, [N], torch_fn=torch.square),
    Case("square", lambda x: x ** 2, [N], torch_fn=lambda x: x ** 2, name="pow"),
    Case("sin", tg.sin, [N], torch_fn=torch.sin),
    Case("cos", tg.cos, [N], torch_fn=torch.cos),
    Case("erf", tg.erf, [N], torch_fn=torch.erf, atol=3e-7),
    Case("relu", tg.relu, [N], torch_fn=torch.relu),
    Case("tanh", tg.tanh, [N], torch_fn=torch.tanh),
    Case("sigmoid", tg.sigmoid, [N], torch_fn=torch.sigmoid),
    Case("gelu", tg.gelu, [N], torch_fn=torch.nn.functional.gelu, atol=3e-7),
    Case("gelu", lambda x: tg.gelu(x, approximate="tanh"), [N], name="tanh",
         torch_fn=lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
    Case("silu", tg.silu, [N], torch_fn=torch.nn.functional.silu),
    Case("leaky_relu", tg.leaky_relu, [N], torch_fn=torch.nn.functional.leaky_relu),
    Case("leaky_relu", lambda x: tg.leaky_relu(x, 2.0), [N], name="slope2",
         torch_fn=lambda x: torch.nn.functional.leaky_relu(x, 2.0)),
    Case("softplus", tg.softplus, [Arg((3, 4), gen=np.array(
        [[-30.0, -2, -0.5, 0.1], [0.7, 1.5, 3, 25], [-1, 1, 2, -2]], np.float32))],
        torch_fn=torch.nn.functional.softplus),
    Case("softplus", tg.softplus, [Arg((4,), gen=np.array([0.0, 1e-8, -1e-8, 0.0], np.float32))],
         name="at-zero", torch_fn=torch.nn.functional.softplus),  # sigmoid(0) = +0.5
    Case("clamp", lambda x: tg.clamp(x, -0.5, 0.5), [N],
         torch_fn=lambda x: torch.clamp(x, -0.5, 0.5), fd=False),
    # values on the bounds: gradient 1 there, as torch.clamp's
    Case("clamp", lambda x: tg.clamp(x, -0.5, 0.5), [Arg((6,), gen=BOUNDS)], name="bounds",
         torch_fn=lambda x: torch.clamp(x, -0.5, 0.5), fd=False),
    Case("clamp", lambda x: tg.clamp(x, min=0.0), [Arg((6,), gen=BOUNDS)],
         name="bounds-min-only", torch_fn=lambda x: torch.clamp(x, min=0.0), fd=False),
    Case("clamp", lambda x: tg.clamp(x, max=0.5), [Arg((6,), gen=BOUNDS)],
         name="bounds-max-only", torch_fn=lambda x: torch.clamp(x, max=0.5), fd=False),
    # a NaN stays NaN (WGSL's max/min leave it to the driver; several drop it)
    Case("maximum", tg.maximum, [Arg((6,), gen=WITH_NAN), Arg((6,), gen=WITH_NAN[::-1].copy())],
         name="nan", torch_fn=torch.maximum, grad=False),
    Case("minimum", tg.minimum, [Arg((6,), gen=WITH_NAN), Arg((6,), gen=np.zeros(6, np.float32))],
         name="nan", torch_fn=torch.minimum, grad=False),
    Case("clamp", lambda x: tg.clamp(x, -0.5, 0.5), [Arg((6,), gen=WITH_NAN)], name="nan",
         torch_fn=lambda x: torch.clamp(x, -0.5, 0.5), grad=False),
    Case("clamp", lambda x: tg.clamp(x, min=0.0), [N], name="min-only",
         torch_fn=lambda x: torch.clamp(x, min=0.0), fd=False),
    Case("stop_gradient", lambda x: tg.stop_gradient(x) * x, [N],
         torch_fn=lambda x: x.detach() * x, fd=False),  # FD sees through stop_gradient
    Case("zeros", lambda x: x + tg.zeros((3, 4)), [N], torch_fn=lambda x: x + 0),
    Case("ones", lambda x: x * tg.ones((4,)), [N], torch_fn=lambda x: x * 1),
    Case("add", lambda a, b: a + b, [Arg((3,), "i32", "int:-5:5"), Arg((3,), "i32", "int:0:9")],
         torch_fn=lambda a, b: a + b, grad=False, name="i32"),
]


def test_stop_gradient_blocks_exactly() -> None:
    case = Case("stop_gradient", lambda x: tg.stop_gradient(x) + x, [N])
    b = build(case)
    vals = run_reference(b)
    np.testing.assert_array_equal(vals[b.grads["a0"]], b.weights)


def test_min_max_ties_send_gradient_to_b() -> None:
    same = np.ones((2, 2), np.float32)
    case = Case("minimum", tg.minimum, [Arg((2, 2), gen=same), Arg((2, 2), gen=same)])
    b = build(case)
    vals = run_reference(b)
    np.testing.assert_array_equal(vals[b.grads["a0"]], 0)
    np.testing.assert_array_equal(vals[b.grads["a1"]], b.weights)


def test_abs_gradient_at_zero_is_plus_one() -> None:
    case = Case("abs", tg.abs, [Arg((3,), gen=np.zeros(3, np.float32))])
    b = build(case)
    np.testing.assert_array_equal(run_reference(b)[b.grads["a0"]], b.weights)


@pytest.mark.parametrize("fn, match", [
    (lambda a, b: a + b, r"add: shapes \[3, 4\] and \[5\] do not broadcast"),
    (lambda a, b: tg.where(a, a, a), r"where: cond must be bool, got f32"),
    (lambda a, b: tg.sqrt(tg.less(a, 0.0)), r"sqrt: input must be f32, got bool"),
    (lambda a, b: a / 0, r"div: division by the scalar 0"),
    (lambda a, b: tg.gelu(a, approximate="fast"), r"gelu: approximate must be"),
    (lambda a, b: a ** 3, r"pow: only the exponents"),
    (lambda a, b: tg.clamp(a), r"clamp: give at least one"),
    (lambda a, b: tg.leaky_relu(a, True),
     r"leaky_relu: negative_slope must be a number, got bool True"),
    (lambda a, b: tg.sum(a, (0, 1)),
     r"sum: axis must be one int, got tuple \(0, 1\): reduce one axis at a time"),
    (lambda a, b: tg.mean(a, [1]), r"mean: axis must be one int, got list \[1\]"),
    (lambda a, b: tg.zeros((2, 0)), r"zeros: dims must be positive ints, got \[2, 0\]"),
])
def test_errors(fn, match) -> None:
    with pytest.raises(ShapeError, match=match):
        build(Case("err", fn, [Arg((3, 4)), Arg((5,))], grad=False))


def test_error_names_user_line() -> None:
    with pytest.raises(ShapeError) as info:
        build(Case("err", lambda a, b: a + b, [Arg((3, 4)), Arg((5,))], grad=False))
    assert "test_ops_elementwise.py" in str(info.value)


@pytest.mark.parametrize("fn, op, number", [
    (lambda k: k * 0.5, "mul", "0.5"), (lambda k: 0.5 * k, "mul", "0.5"),
    (lambda k: k + 1.5, "add", "1.5"), (lambda k: k - 0.5, "sub", "0.5"),
    (lambda k: tg.maximum(k, 1.5), "maximum", "1.5"), (lambda k: tg.less(k, 1.5), "less", "1.5"),
    (lambda k: tg.where(tg.less(k, 2), k, 0.5), "where", "0.5"),
    (lambda k: tg.where(tg.less(k, 2), 0.5, k), "where", "0.5"),
])
def test_an_i32_tensor_refuses_a_number_that_is_not_an_integer(fn, op, number) -> None:
    """An i32 op would truncate it (arange(4) * 0.5 was all zeros, k < 1.5 read k < 1)."""
    with pytest.raises(ShapeError, match=rf"^{op}: the number {number} is not an integer, "
                                         r"and the tensor it meets is i32"):
        build(Case("err", fn, [Arg((3,), "i32", "int:0:3")], grad=False))


def test_an_i32_tensor_takes_integral_floats_as_their_ints() -> None:
    case = Case("mul", lambda k: k * 2.0 + 1.0, [Arg((3,), "i32", np.array([0, 1, 5]))],
                grad=False)
    b = build(case, with_grad=False)
    out = run_reference(b)[b.out]
    assert out.dtype == np.int32 and out.tolist() == [1, 3, 11]


def test_mixed_dtypes_rejected() -> None:
    with pytest.raises(ShapeError, match=r"add: operands must have the same dtype, "
                                         r"got f32\[3\], i32\[3\]"):
        build(Case("err", lambda a, b: a + b, [Arg((3,)), Arg((3,), "i32", "int:0:3")],
                   grad=False))


def test_bool_tensor_rejects_python_bool() -> None:
    with pytest.raises(TypeError, match="cannot be used as a bool"):
        build(Case("err", lambda a: tg.relu(a) if a > 0 else a, [Arg((3,))], grad=False))
