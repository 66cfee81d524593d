"""Shape ops: reshape, permute, swap_axes, heads, narrow, concat, stack, split."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tensorgrad as tg
from tensorgrad import ShapeError
from tensorgrad.ops.shape import MAX_CONCAT_INPUTS, scatter_axis
from tests.harness import Arg, Case, build, run_reference

I32 = Arg((2, 3), "i32", "int:-9:9")


def _reshape(shape, target, name=""):
    return Case("reshape", lambda x: tg.reshape(x, target), [Arg(shape)],
                torch_fn=lambda x: torch.reshape(x, target), name=name or f"{shape}->{target}")


def _permute(shape, perm):
    return Case("permute", lambda x: tg.permute(x, perm), [Arg(shape)],
                torch_fn=lambda x: torch.permute(x, perm), name=f"{shape}-{perm}")


def _swap(shape, a, b):
    return Case("swap_axes", lambda x: tg.swap_axes(x, a, b), [Arg(shape)],
                torch_fn=lambda x: torch.transpose(x, a, b), name=f"{shape}-{a},{b}")


def _narrow(shape, axis, start, length):
    return Case("narrow", lambda x: tg.narrow(x, axis, start, length), [Arg(shape)],
                torch_fn=lambda x: torch.narrow(x, axis, start, length),
                name=f"{shape}-axis{axis}-{start}+{length}")


def _concat(shapes, axis, name=""):
    return Case("concat", lambda *xs: tg.concat(list(xs), axis), [Arg(s) for s in shapes],
                torch_fn=lambda *xs: torch.cat(xs, axis), name=name or f"{len(shapes)}-axis{axis}")


def _stack(shapes, axis):
    return Case("stack", lambda *xs: tg.stack(list(xs), axis), [Arg(s) for s in shapes],
                torch_fn=lambda *xs: torch.stack(xs, axis), name=f"{len(shapes)}-axis{axis}")


def _split(shape, sizes, axis):
    return Case("split", lambda x: tg.split(x, sizes, axis), [Arg(shape)],
                torch_fn=lambda x: torch.split(x, sizes, axis), name=f"{shape}-{sizes}-{axis}")


def t_split_heads(x: torch.Tensor, h: int) -> torch.Tensor:
    *lead, t, d = x.shape
    return x.reshape(*lead, t, h, d // h).transpose(-3, -2)


def t_merge_heads(x: torch.Tensor) -> torch.Tensor:
    *lead, h, t, d = x.shape
    return x.transpose(-3, -2).reshape(*lead, t, h * d)


CASES = [
    _reshape((3, 4), (2, 6)),
    _reshape((3, 4), (-1,)),
    _reshape((2, 3, 4), (4, -1)),
    _reshape((2, 3, 4), (1, 6, 1, 4)),
    _reshape((1,), (), name="to-0d"),
    _reshape((), (1, 1), name="from-0d"),
    Case("reshape", lambda i: tg.reshape(i, (3, 2)), [I32], torch_fn=lambda i: i.reshape(3, 2),
         grad=False, name="i32"),
    _permute((2, 3, 4), (2, 0, 1)),
    _permute((3, 4), (1, 0)),
    _permute((2, 1, 3, 1), (3, 2, 0, 1)),
    _permute((2, 3, 1, 4), (0, 2, 1, 3)),
    Case("permute", lambda i: tg.permute(i, (1, 0)), [I32], torch_fn=lambda i: i.T,
         grad=False, name="i32"),
    _swap((2, 3, 4), 0, -1),
    _swap((2, 3, 4), -2, -1),
    _swap((3, 4), 1, 1),
    Case("split_heads", lambda x: tg.split_heads(x, 3), [Arg((2, 5, 6))],
         torch_fn=lambda x: t_split_heads(x, 3)),
    Case("split_heads", lambda x: tg.split_heads(x, 2), [Arg((5, 4))],
         torch_fn=lambda x: t_split_heads(x, 2)),
    Case("split_heads", lambda x: tg.split_heads(x, 1), [Arg((1, 3, 2))],
         torch_fn=lambda x: t_split_heads(x, 1)),
    Case("merge_heads", tg.merge_heads, [Arg((2, 3, 5, 2))], torch_fn=t_merge_heads),
    Case("merge_heads", tg.merge_heads, [Arg((4, 3, 1))], torch_fn=t_merge_heads),
    Case("merge_heads", lambda x: tg.merge_heads(tg.split_heads(x, 2)), [Arg((3, 4))],
         torch_fn=lambda x: x, name="roundtrip"),
    _narrow((5, 4), 0, 1, 3),
    _narrow((5, 4), -1, 2, 2),
    _narrow((2, 5, 3), 1, 4, 1),
    _narrow((5, 4), 1, 0, 4),
    Case("narrow", lambda i: tg.narrow(i, 1, 1, 2), [I32], grad=False, name="i32",
         torch_fn=lambda i: torch.narrow(i, 1, 1, 2)),
    _concat([(2, 3), (2, 4)], -1),
    _concat([(1, 3), (2, 3), (3, 3)], 0),
    _concat([(2, 1, 3), (2, 2, 3)], 1),
    _concat([(2, 2)], 0, name="single"),
    _concat([(2, i + 1) for i in range(9)], 1, name="9-chained"),
    _concat([(1, 2)] * 15, 0, name="15-chained"),
    Case("concat", lambda a, b: tg.concat([a, b], 0), [I32, I32], grad=False, name="i32",
         torch_fn=lambda a, b: torch.cat([a, b], 0)),
    Case("concat", lambda x: tg.concat([tg.less(x, 0.0), tg.greater(x, 0.5)], 1),
         [Arg((2, 3))], grad=False, torch_fn=lambda x: torch.cat([x < 0, x > 0.5], 1),
         name="bool"),
    _stack([(2, 3), (2, 3)], 0),
    _stack([(2, 3), (2, 3), (2, 3)], -1),
    _stack([(2, 3), (2, 3), (2, 3)], 1),
    _stack([(4,)], 0),
    _split((5, 4), [2, 3], 0),
    _split((5, 4), [1, 1, 2], -1),
    _split((7, 2), 3, 0),
    _split((2, 6), 2, 1),
]


def _graph(fn, *args: Arg):
    b = build(Case("x", fn, list(args), grad=False))
    return b, run_reference(b)[b.out]


def test_concat_never_binds_more_than_8_buffers() -> None:
    for n in (7, 8, 9, 15, 49, 50):
        b, v = _graph(lambda *xs: tg.concat(list(xs), 0), *[Arg((1, 2))] * n)
        concats = [x for x in b.graph.nodes if x.op == "concat"]
        assert concats and all(len(x.inputs) <= MAX_CONCAT_INPUTS for x in concats)
        np.testing.assert_array_equal(v, np.concatenate([b.values[f"a{k}"] for k in range(n)]))


def test_no_op_shapes_record_nothing() -> None:
    b, _ = _graph(lambda x: tg.swap_axes(tg.reshape(tg.narrow(x, 1, 0, 4), (3, 4)), 0, -2),
                  Arg((3, 4)))
    assert [n.op for n in b.graph.nodes] == ["param"]
    b, _ = _graph(lambda x: tg.concat([x], 0), Arg((3, 4)))
    assert [n.op for n in b.graph.nodes] == ["param"]


def test_reshape_never_reorders() -> None:
    _, v = _graph(lambda x: tg.reshape(tg.permute(x, (1, 0)), (-1,)),
                  Arg((2, 3), gen=np.arange(6, dtype=np.float32)))
    np.testing.assert_array_equal(v, [0, 3, 1, 4, 2, 5])


def test_slice_backward_scatters_and_is_not_differentiable_itself() -> None:
    b = build(Case("narrow", lambda x: tg.narrow(x, 0, 1, 2), [Arg((4, 3))]))
    g = run_reference(b)[b.grads["a0"]]
    np.testing.assert_array_equal(g[[0, 3]], 0)
    np.testing.assert_array_equal(g[1:3], b.weights)
    with pytest.raises(ShapeError, match="scatter_axis: cannot differentiate"):
        build(Case("x", lambda x: scatter_axis(x, (4, 3), 0, 1, 3), [Arg((2, 3))]))


def test_split_returns_pieces() -> None:
    shapes = []

    def fn(x):
        pieces = tg.split(x, 3, -1)
        shapes.extend(p.shape for p in pieces)
        return pieces
    build(Case("split", fn, [Arg((2, 8))], grad=False))
    assert shapes == [(2, 3), (2, 3), (2, 2)]


def _err(fn, *args: Arg):
    build(Case("err", fn, list(args) or [Arg((3, 4))], grad=False))


@pytest.mark.parametrize("fn, match", [
    (lambda x: tg.reshape(x, (5, -1)), (r"reshape: cannot reshape \[3, 4\] \(12 elements\) to "
                                       r"\[5, -1\]: 12 is not divisible by 5")),
    (lambda x: tg.reshape(x, (5, 2)), (r"reshape: cannot reshape \[3, 4\] \(12 elements\) to "
                                      r"\[5, 2\] \(10 elements\)")),
    (lambda x: tg.reshape(x, (-1, -1)), (r"reshape: target shape \[-1, -1\] has more than "
                                        r"one -1")),
    (lambda x: tg.reshape(x, (0, 12)), (r"reshape: target shape \[0, 12\] must hold positive "
                                       r"ints")),
    (lambda x: tg.permute(x, (0, 0)), (r"permute: perm \[0, 0\] must be a permutation of 0..1 "
                                      r"for a tensor of shape \[3, 4\]")),
    (lambda x: tg.permute(x, (1, -2)), r"permute: perm \[1, -2\] must be a permutation"),
    (lambda x: tg.permute(x, (0, 1, 2)), r"permute: perm \[0, 1, 2\] must be a permutation"),
    (lambda x: tg.swap_axes(x, 0, 2), (r"swap_axes: axis 2 is out of range for a tensor of "
                                      r"rank 2")),
    (lambda x: tg.split_heads(x, 3), (r"split_heads: last dim 4 of shape \[3, 4\] is not "
                                     r"divisible by heads=3")),
    (lambda x: tg.split_heads(tg.reshape(x, (-1,)), 2), (r"split_heads: input must have rank "
                                                        r">= 2")),
    (lambda x: tg.merge_heads(x), (r"merge_heads: input must have rank >= 3 \(\[..., H, T, d\]\)"
                                  r", got shape \[3, 4\]")),
    (lambda x: tg.narrow(x, 0, 2, 2), r"narrow: start=2, length=2 do not fit axis 0 of size 3"),
    (lambda x: tg.narrow(x, 1, -1, 2), r"narrow: start=-1, length=2 do not fit axis 1"),
    (lambda x: tg.narrow(x, 1, 0, 0), r"narrow: start=0, length=0 do not fit"),
    (lambda x: tg.narrow(x, 2, 0, 1), r"narrow: axis 2 is out of range"),
    (lambda x: tg.concat([], 0), r"concat: needs at least one tensor"),
    (lambda x: tg.concat([x, tg.reshape(x, (4, 3))], 0), (r"concat: shapes must match except "
                                                         r"on axis 0, got \[3, 4\], \[4, 3\]")),
    (lambda x: tg.concat([x, tg.reshape(x, (12,))], 0), (r"concat: shapes must match except "
                                                        r"on axis 0")),
    (lambda x: tg.concat([x, tg.less(x, 0.0)], 1), (r"concat: operands must have the same "
                                                   r"dtype, got f32\[3, 4\], bool\[3, 4\]")),
    (lambda x: tg.concat([x, 1.0], 1), r"concat: expected a list of Tensors"),
    (lambda x: tg.concat([x, x], 2), r"concat: axis 2 is out of range"),
    (lambda x: tg.stack([x, tg.reshape(x, (4, 3))]), (r"stack: all tensors must have the same "
                                                     r"shape, got \[3, 4\], \[4, 3\]")),
    (lambda x: tg.stack([x, x], 3), (r"stack: axis 3 is out of range for a tensor of rank 2 "
                                    r"\(valid: -3..2\)")),
    (lambda x: tg.stack([]), r"stack: needs at least one tensor"),
    (lambda x: tg.split(x, [1, 1], 0), (r"split: sizes \[1, 1\] must be positive ints summing "
                                       r"to 3, the size of axis 0 of shape \[3, 4\]")),
    (lambda x: tg.split(x, [5, -1], 1), r"split: sizes \[5, -1\] must be positive ints"),
    (lambda x: tg.split(x, 0, 1), r"split: split size must be a positive int, got 0"),
])
def test_errors(fn, match) -> None:
    with pytest.raises(ShapeError, match=match):
        _err(fn)


def test_error_names_user_line() -> None:
    with pytest.raises(ShapeError) as info:
        _err(lambda x: tg.reshape(x, (7,)))
    assert "test_ops_shape.py" in str(info.value)
