"""conv2d, max_pool2d and nearest_upsample2d: forward vs PyTorch, gradients vs autograd and
finite differences (the reference's exemplars included), grouped-conv equivalence, pooling
ties and padding, and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorgrad as tg
from tensorgrad import ShapeError
from tensorgrad.autograd import append_grad
from tensorgrad.ops.registry import record
from tensorgrad.tensor import leaf, tracing
from tests.harness import Arg, Case, build, run_reference


def conv_case(x, w, stride=1, padding=0, groups=1, name="", x_param=True, w_param=True):
    return Case("conv2d", lambda a, b: tg.conv2d(a, b, stride, padding, groups),
                [Arg(x, gen="unit", param=x_param), Arg(w, gen="unit", param=w_param)],
                torch_fn=lambda a, b: F.conv2d(a, b, stride=stride, padding=padding,
                                               groups=groups), name=name)


def separated(shape, seed=0):
    """Distinct values 0.1 apart (so max-pool FD never crosses a tie)."""
    n = int(np.prod(shape))
    return (np.random.default_rng(seed).permutation(n).reshape(shape) * 0.1 - n * 0.05
            ).astype(np.float32)


POOL_NANS = separated((1, 2, 4, 4))
POOL_NANS[0, 0, 1, 2] = POOL_NANS[0, 1, 3, 0] = POOL_NANS[0, 1, 3, 1] = np.nan


def pool_case(shape, k, stride=None, padding=0, name=""):
    return Case("max_pool2d", lambda x: tg.max_pool2d(x, k, stride, padding),
                [Arg(shape, gen=separated(shape))],
                torch_fn=lambda x: F.max_pool2d(x, k, stride, padding), name=name)


def upsample_case(shape, f):
    return Case("nearest_upsample2d", lambda x: tg.nearest_upsample2d(x, f), [Arg(shape)],
                torch_fn=lambda x: F.interpolate(x, scale_factor=f, mode="nearest"),
                name=f"f{f}")


CASES = [
    conv_case((2, 3, 6, 6), (4, 3, 3, 3), name="basic"),
    conv_case((1, 2, 5, 5), (3, 2, 3, 3), stride=2, padding=1, name="s2p1"),
    conv_case((2, 2, 4, 5), (3, 2, 1, 1), name="1x1"),
    conv_case((1, 1, 6, 6), (1, 1, 3, 3), stride=2, name="s2-remainder"),
    conv_case((2, 4, 7, 6), (6, 2, 3, 2), stride=(2, 1), padding=(1, 0), groups=2,
              name="pairs-grouped"),
    # The reference's FD exemplars.
    conv_case((1, 2, 4, 4), (3, 2, 2, 2), w_param=False, name="input-grad"),
    conv_case((1, 2, 4, 4), (3, 2, 2, 2), stride=2, padding=1, x_param=False,
              name="weight-grad-s2p1"),
    conv_case((1, 4, 4, 4), (6, 2, 2, 2), groups=2, w_param=False, name="grouped-input-grad"),
    conv_case((1, 4, 4, 4), (6, 2, 2, 2), stride=2, padding=1, groups=2, x_param=False,
              name="grouped-weight-grad-s2p1"),
    conv_case((1, 3, 4, 4), (3, 1, 3, 3), padding=1, groups=3, w_param=False,
              name="depthwise-input-grad"),
    conv_case((2, 3, 5, 5), (6, 1, 3, 3), stride=2, padding=1, groups=3, name="depthwise-x2"),
    pool_case((1, 2, 4, 4), 2, name="k2"),
    pool_case((2, 2, 7, 7), 3, 2, 1, name="k3s2p1"),
    pool_case((1, 3, 5, 6), (2, 3), (1, 2), (1, 1), name="pairs"),
    pool_case((1, 1, 5, 5), 2, 1, name="overlap"),
    # a NaN wins its windows (the first one), as in PyTorch
    Case("max_pool2d", lambda x: tg.max_pool2d(x, 2, 1), [Arg((1, 2, 4, 4), gen=POOL_NANS)],
         torch_fn=lambda x: F.max_pool2d(x, 2, 1), grad=False, name="nan"),
    upsample_case((1, 2, 3, 3), 2),
    upsample_case((2, 1, 2, 4), 3),
    Case("nearest_upsample2d", lambda x: tg.nearest_upsample2d(x, 1) * 2.0, [Arg((1, 1, 2, 2))],
         torch_fn=lambda x: x * 2.0, name="f1"),
]


def test_grouped_conv_equals_dense_block_diagonal() -> None:
    """B=2, Cin=4, Cout=6, G=2, K=3, 5x5, pad 1: grouped = dense with a block-diagonal w."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    dense = np.zeros((6, 4, 3, 3), np.float32)
    dense[:3, :2], dense[3:, 2:] = w[:3], w[3:]
    grouped = build(Case("conv2d", lambda x, k: tg.conv2d(x, k, padding=1, groups=2),
                         [Arg((2, 4, 5, 5)), Arg((6, 2, 3, 3), gen=w)], grad=False))
    full = build(Case("conv2d", lambda x, k: tg.conv2d(x, k, padding=1),
                      [Arg((2, 4, 5, 5)), Arg((6, 4, 3, 3), gen=dense)], grad=False))
    np.testing.assert_allclose(run_reference(grouped)[grouped.out],
                               run_reference(full)[full.out], rtol=1e-5, atol=1e-5)


def test_conv_backward_uses_its_grad_primitives() -> None:
    b = build(conv_case((1, 2, 5, 5), (3, 2, 3, 3), stride=2, padding=1))
    ops = {b.graph[g].op for g in b.grads.values()}
    assert ops == {"conv2d_input_grad", "conv2d_weight_grad"}


def test_grad_primitives_are_not_differentiable() -> None:
    with tracing() as st:
        w = leaf("param", "w", (3, 2, 2, 2))
        dy = leaf("param", "dy", (1, 3, 3, 3))
        dx = record("conv2d_input_grad", [w, dy], in_hw=(4, 4), stride=(1, 1),
                    padding=(0, 0), groups=1)
        loss = tg.sum(dx)
    with pytest.raises(ShapeError, match="conv2d_input_grad: cannot differentiate"):
        append_grad(st.graph, loss.id)


def test_max_pool_ties_go_to_first_cell() -> None:
    case = Case("max_pool2d", lambda x: tg.max_pool2d(x, 2),
                [Arg((1, 1, 2, 4), gen=np.array([[1, 1, 3, 2], [1, 1, 3, 3]], np.float32))])
    b = build(case)
    dx = run_reference(b)[b.grads["a0"]]
    wy = b.weights.reshape(2)
    np.testing.assert_array_equal(dx, np.array([[[[wy[0], 0, wy[1], 0], [0, 0, 0, 0]]]]))


def test_max_pool_padding_never_wins() -> None:
    x = -np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3) - 5
    b = build(Case("max_pool2d", lambda t: tg.max_pool2d(t, 3, 1, 1), [Arg((1, 1, 3, 3), gen=x)],
                   grad=False))
    got = run_reference(b)[b.out]
    want = F.max_pool2d(torch.from_numpy(x), 3, 1, 1).numpy()
    np.testing.assert_array_equal(got, want)
    assert got.max() < 0


def test_reference_float64() -> None:
    b = build(conv_case((1, 2, 5, 5), (3, 2, 3, 3), stride=2, padding=1))
    vals = run_reference(b, float_dtype=np.float64)
    assert {vals[g].dtype for g in b.grads.values()} == {np.dtype(np.float64)}


X, W = Arg((1, 4, 5, 5)), Arg((6, 2, 3, 3))


@pytest.mark.parametrize("fn, args, match", [
    (lambda x, w: tg.conv2d(x, w), [Arg((4, 5, 5)), W],
     r"conv2d: input must be rank 4 \[B, Cin, H, W\], got shape \[4, 5, 5\]"),
    (lambda x, w: tg.conv2d(x, w), [X, Arg((6, 2, 3))], r"conv2d: weight must be rank 4"),
    (lambda x, w: tg.conv2d(x, w, groups=3), [X, W],
     r"conv2d: groups=3 must divide the input channels \(4"),
    (lambda x, w: tg.conv2d(x, w, groups=0), [X, W], r"conv2d: groups must be a positive int"),
    (lambda x, w: tg.conv2d(x, w), [X, W],
     (r"conv2d: weight \[6, 2, 3, 3\] expects 2 input channels per group but x "
     r"\[1, 4, 5, 5\] has 4 channels / 1 groups = 4")),
    (lambda x, w: tg.conv2d(x, w, stride=0, groups=2), [X, W],
     r"conv2d: stride must be >= 1, got \[0, 0\]"),
    (lambda x, w: tg.conv2d(x, w, padding=-1, groups=2), [X, W],
     r"conv2d: padding must be >= 0, got \[-1, -1\]"),
    (lambda x, w: tg.conv2d(x, w, stride=(1, 2, 3), groups=2), [X, W],
     r"conv2d: stride must be an int or a pair of ints"),
    (lambda x, w: tg.conv2d(x, w, groups=2), [Arg((1, 4, 2, 5)), W],
     r"conv2d: output height would be 0 \(input 2, kernel 3, stride 1, padding 0\)"),
    (lambda x, w: tg.conv2d(x, tg.less(w, 0.0), groups=2), [X, W],
     r"conv2d: weight must be f32, got bool"),
    (lambda x, w: tg.max_pool2d(x, 2), [Arg((4, 5)), W],
     r"max_pool2d: input must be rank 4 \[B, C, H, W\], got shape \[4, 5\]"),
    (lambda x, w: tg.max_pool2d(x, 0), [X, W], r"max_pool2d: kernel size must be >= 1"),
    (lambda x, w: tg.max_pool2d(x, 7), [X, W], r"max_pool2d: output height would be 0"),
    (lambda x, w: tg.nearest_upsample2d(x, 0), [X, W],
     r"nearest_upsample2d: factor must be an int >= 1, got 0"),
    (lambda x, w: tg.nearest_upsample2d(x, 1.5), [X, W],
     r"nearest_upsample2d: factor must be an int >= 1"),
    (lambda x, w: tg.nearest_upsample2d(tg.reshape(x, (4, 25)), 2), [X, W],
     r"nearest_upsample2d: x must be a rank-4 \[B, C, H, W\] tensor, got \[4, 25\]"),
])
def test_errors(fn, args, match) -> None:
    with pytest.raises(ShapeError, match=match):
        build(Case("err", fn, args, grad=False))


def test_error_names_user_line() -> None:
    with pytest.raises(ShapeError) as info:
        build(Case("err", lambda x, w: tg.conv2d(x, w), [X, W], grad=False))
    assert "test_ops_conv.py" in str(info.value)


@pytest.mark.parametrize("size, most, step, want", [
    (14, 8, 1, 7), (13, 8, 1, 7), (28, 8, 1, 7), (5, 8, 1, 5), (100, 8, 1, 8),
    (17, 8, 2, 6), (3, 8, 2, 4), (9, 4, 3, 3), (7, 1, 5, 5),
])
def test_tile_runs_split_an_axis_evenly(size, most, step, want) -> None:
    """Outputs per thread along an axis of the software kernels: a multiple of the step, as
    few runs as `most` allows, as even as possible."""
    from tensorgrad.ops.conv_tiled import _run
    assert _run(size, most, step) == want
