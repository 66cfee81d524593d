"""Reductions and row-wise ops: sum, mean, argmax/argmin, (log-)softmax, causal ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgrad as tg
from tensorgrad import ShapeError
from tensorgrad.ops.registry import record
from tests.harness import Arg, Case, build, run_reference

TIES = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, 2.0], [-5.0, -5.0, -5.0, -5.0]],
                np.float32)
# NaN wins an argmax or argmin (the first one), as in NumPy and PyTorch; LONG_NANS's rows
# are long enough for the workgroup kernel
NANS = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, -1.0, 2.0], [np.nan, np.nan, 0.0, 9.0]],
                np.float32)
LONG_NANS = np.random.default_rng(0).standard_normal((2, 3000)).astype(np.float32)
LONG_NANS[0, [2100, 900]] = np.nan
LONG_NANS[1, 2999] = np.nan
BIG = np.array([[1000.0, 999.0, -1000.0, 0.5], [-800.0, -801.0, -802.0, -799.5]], np.float32)


def _mask(t: int) -> torch.Tensor:
    return torch.triu(torch.ones(t, t, dtype=torch.bool), 1)


def t_softmax_causal(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.masked_fill(_mask(x.shape[-1]), float("-inf")), -1)


def t_where_causal(x: torch.Tensor, fill: float) -> torch.Tensor:
    return x.masked_fill(_mask(x.shape[-1]), fill)


def _sum(shape, axis=None, keepdims=False, name=""):
    def t(x):
        return torch.sum(x) if axis is None else torch.sum(x, dim=axis, keepdim=keepdims)
    return Case("sum", lambda x: tg.sum(x, axis, keepdims), [Arg(shape)], torch_fn=t,
                name=name or f"{shape}-axis{axis}-keep{keepdims}")


def _mean(shape, axis=None, keepdims=False, name=""):
    def t(x):
        return torch.mean(x) if axis is None else torch.mean(x, dim=axis, keepdim=keepdims)
    return Case("mean", lambda x: tg.mean(x, axis, keepdims), [Arg(shape)], torch_fn=t,
                name=name or f"{shape}-axis{axis}-keep{keepdims}")


def _arg(op, shape, axis=None, gen="normal", name=""):
    tfn = getattr(torch, op)
    return Case(op, lambda x: getattr(tg, op)(x, axis), [Arg(shape, gen=gen)],
                torch_fn=(lambda x: tfn(x)) if axis is None else (lambda x: tfn(x, dim=axis)),
                grad=False, name=name or f"{shape}-axis{axis}")


def _soft(op, shape, axis=-1, gen="normal", name=""):
    tfn = getattr(torch, op)
    return Case(op, lambda x: getattr(tg, op)(x, axis), [Arg(shape, gen=gen)],
                torch_fn=lambda x: tfn(x, axis), name=name or f"{shape}-axis{axis}")


CASES = [
    _sum((3, 4)),
    _sum((5,), name="rank1"),
    _sum((), name="0d"),
    _sum((3, 4), 0),
    _sum((3, 4), -1, True),
    _sum((2, 3, 4), 1, True),
    _sum((2, 3, 4), -3),
    _sum((2, 1, 3), 1),
    _sum((1, 1), None, True, name="keepdims-ignored"),
    _mean((3, 4)),
    _mean((3, 4), 0),
    _mean((3, 4), -1),
    _mean((3, 4), 1, True),
    _mean((2, 3, 5), 1, True),
    _mean((2, 3, 5), 0),
    _mean((4, 1), -1, True),
    _arg("argmax", (3, 5)),
    _arg("argmax", (3, 5), 0),
    _arg("argmax", (2, 3, 4), -1),
    _arg("argmax", (2, 3, 4), 1),
    _arg("argmax", (3, 4), -1, gen=TIES, name="ties"),
    _arg("argmax", (3, 4), 0, gen=TIES, name="ties-axis0"),
    _arg("argmax", (7,), None, name="rank1"),
    _arg("argmax", (3, 4), -1, gen=NANS, name="nan"),
    _arg("argmax", (3, 4), 0, gen=NANS, name="nan-axis0"),
    _arg("argmax", (2, 3000), -1, gen=LONG_NANS, name="nan-long"),
    _arg("argmin", (3, 4), -1, gen=NANS, name="nan"),
    _arg("argmin", (3, 5)),
    _arg("argmin", (3, 5), 1),
    _arg("argmin", (2, 3, 4), 0),
    _arg("argmin", (3, 4), -1, gen=TIES, name="ties"),
    _soft("softmax", (3, 4)),
    _soft("softmax", (3, 4), 0),
    _soft("softmax", (2, 3, 5), 1),
    _soft("softmax", (1, 7)),
    _soft("softmax", (2, 4), gen=BIG, name="big"),
    _soft("log_softmax", (3, 4)),
    _soft("log_softmax", (2, 3, 5), -2),
    _soft("log_softmax", (5,)),
    _soft("log_softmax", (4, 1), name="length1"),
    _soft("log_softmax", (2, 4), gen=BIG, name="big"),
    Case("softmax_causal", tg.softmax_causal, [Arg((4, 4))], torch_fn=t_softmax_causal),
    Case("softmax_causal", tg.softmax_causal, [Arg((2, 3, 3))], torch_fn=t_softmax_causal),
    Case("softmax_causal", tg.softmax_causal, [Arg((2, 1, 5, 5))],
         torch_fn=t_softmax_causal),
    Case("softmax_causal", tg.softmax_causal, [Arg((1, 1))], torch_fn=t_softmax_causal),
    Case("softmax_causal", lambda x: tg.softmax_causal(x, 0), [Arg((3, 3))], name="axis0",
         torch_fn=lambda x: t_softmax_causal(x.transpose(0, 1)).transpose(0, 1)),
    Case("softmax_causal", lambda x: tg.softmax_causal(x * 300.0), [Arg((3, 3))], name="big",
         torch_fn=lambda x: t_softmax_causal(x * 300.0), fd=False),
    Case("where_causal", lambda x: tg.where_causal(x, -2.5), [Arg((4, 4))],
         torch_fn=lambda x: t_where_causal(x, -2.5)),
    Case("where_causal", lambda x: tg.where_causal(x, 0), [Arg((2, 3, 3))],
         torch_fn=lambda x: t_where_causal(x, 0.0)),
    Case("where_causal", lambda x: tg.softmax(tg.where_causal(x, float("-inf"))),
         [Arg((2, 5, 5))], torch_fn=lambda x: torch.softmax(t_where_causal(x, -1e30), -1),
         name="neg-inf-then-softmax"),
    # the first stage of a split column sum (passes/split_reduce.py): never traced by users
    Case("sum_partials", lambda x: record("sum_partials", [x * 1.0], rows=8, parts=4),
         [Arg((2, 4, 3, 5))], grad=False, name="rank4",
         np_fn=lambda x: x.reshape(4, 2, 15).sum(1)),
    Case("sum_partials", lambda x: record("sum_partials", [x], rows=600, parts=2),
         [Arg((600, 3))], grad=False, name="long-workgroup",
         np_fn=lambda x: x.reshape(2, 300, 3).sum(1)),
]


def _out(fn, *args: Arg):
    b = build(Case("x", fn, list(args), grad=False))
    return b, run_reference(b)[b.out]


def test_shapes_and_dtypes() -> None:
    b, v = _out(lambda x: tg.sum(x), Arg((2, 3)))
    assert v.shape == () and b.graph[b.out].dtype == "f32"
    b, v = _out(lambda x: tg.argmax(x, -1), Arg((2, 3)))
    assert v.shape == (2,) and b.graph[b.out].dtype == "i32"
    b, v = _out(lambda x: tg.argmax(x), Arg((2, 3)))
    assert v.shape == () and v.dtype == np.int32
    _, v = _out(lambda x: tg.mean(x, 0, keepdims=True), Arg((2, 3)))
    assert v.shape == (1, 3)


def test_reductions_on_the_last_axis_need_no_permute() -> None:
    b, _ = _out(lambda x: tg.log_softmax(tg.mean(x, -1, keepdims=True)), Arg((2, 3)))
    assert "permute" not in {n.op for n in b.graph.nodes}
    b, _ = _out(lambda x: tg.sum(x, 0), Arg((2, 3)))
    assert [n.op for n in b.graph.nodes][1:] == ["permute", "sum_last"]


def test_causal_masked_entries_are_exactly_zero() -> None:
    _, v = _out(lambda x: tg.softmax_causal(x), Arg((2, 4, 4)))
    assert np.all(v[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0)
    np.testing.assert_allclose(v.sum(-1), 1.0, rtol=1e-6)


def test_where_causal_gradient_is_zero_where_filled() -> None:
    b = build(Case("where_causal", lambda x: tg.where_causal(x, 7.0), [Arg((3, 3))]))
    g = run_reference(b)[b.grads["a0"]]
    np.testing.assert_array_equal(g, np.where(np.triu(np.ones((3, 3)), 1) > 0, 0, b.weights))


def _err(fn, *args: Arg):
    build(Case("err", fn, list(args) or [Arg((3, 4))], grad=False))


@pytest.mark.parametrize("fn, match", [
    (lambda x: tg.sum(x, 2), (r"sum: axis 2 is out of range for a tensor of rank 2 "
                             r"\(valid: -2..1\)")),
    (lambda x: tg.mean(x, -3), r"mean: axis -3 is out of range for a tensor of rank 2"),
    (lambda x: tg.argmax(x, 5), r"argmax: axis 5 is out of range"),
    (lambda x: tg.softmax(x, 2), r"softmax: axis 2 is out of range"),
    (lambda x: tg.log_softmax(x, -3), r"log_softmax: axis -3 is out of range"),
    (lambda x: tg.sum(tg.sum(x), 0), r"sum: cannot reduce axis 0 of a 0-d tensor"),
    (lambda x: tg.log_softmax(tg.sum(x)), r"log_softmax: input must have rank >= 1"),
    (lambda x: tg.sum(tg.less(x, 0.0)), r"sum: input must be f32, got bool \(shape \[3, 4\]\)"),
    (lambda x: tg.argmin(tg.less(x, 0.0), 0), r"argmin: input must be f32, got bool"),
    (lambda x: tg.softmax_causal(x), (r"softmax_causal: with axis=-1 the last two axes must be "
                                     r"square \[..., T, T\], got shape \[3, 4\]")),
    (lambda x: tg.softmax_causal(tg.sum(x, 0)), r"softmax_causal: .*square.*got shape \[4\]"),
    (lambda x: tg.where_causal(x, 0.0), (r"where_causal: the last two axes must be square "
                                        r"\[..., T, T\], got shape \[3, 4\]")),
    (lambda x: tg.where_causal(x, "a"), r"where_causal: fill must be a Python number"),
    (lambda x: record("sum_partials", [x], rows=6, parts=2),
     (r"sum_partials: rows=6 must be the product of leading axes of \[3, 4\] and a multiple "
      r"of parts=2")),
    (lambda x: record("sum_partials", [x], rows=3, parts=2), r"sum_partials: rows=3 must"),
])
def test_errors(fn, match) -> None:
    with pytest.raises(ShapeError, match=match):
        _err(fn)


def test_argmax_of_i32_is_rejected() -> None:
    with pytest.raises(ShapeError, match=r"argmax: input must be f32, got i32 \(shape \[3\]\)"):
        _err(lambda i: tg.argmax(i), Arg((3,), "i32", "int:0:3"))


def test_error_names_user_line() -> None:
    with pytest.raises(ShapeError) as info:
        _err(lambda x: tg.sum(x, 7))
    assert "test_ops_reduce.py" in str(info.value)


@pytest.mark.parametrize("rows, length, software, team", [
    (98_304, 256, False, 32),    # GPT-2's causal softmax rows: teams of 32, 8 rows a workgroup
    (8_192, 768, False, 32),     # its LayerNorm rows
    (8_192, 50_304, False, 256),  # its vocabulary rows: 196 columns a thread
    (24, 1_000, False, 256),     # few rows: a workgroup each, to fill the GPU
    (1_024, 64, False, 64),      # a team never outgrows its row
    (100, 16, False, 1),         # short rows: a thread each
    (24, 40_000, True, 256),     # CPU rasterisers: a workgroup for rows past the loop budget
    (24, 1_000, True, 1),        # ... and serial loops otherwise
    (98_304, 256, True, 1),
])
def test_row_team_sizes(rows: int, length: int, software: bool, team: int) -> None:
    from tensorgrad.codegen.kernel import EmitContext, Target
    from tensorgrad.ops.reduce import _row_team

    ctx = EmitContext(None, (), Target(software=software))  # type: ignore[arg-type]
    assert _row_team(ctx, rows, length) == team
