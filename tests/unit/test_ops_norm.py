"""layer_norm and rms_norm: forward vs PyTorch, gradients vs autograd and finite differences,
the one-kernel-per-row primitives they trace to, and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorgrad as tg
from tensorgrad import ShapeError
from tests.harness import Arg, Case, build, run_reference


def t_rms_norm(x: torch.Tensor, w: torch.Tensor | None = None, eps: float = 1e-6):
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def t_layer_norm(x: torch.Tensor, w=None, b=None, eps: float = 1e-5):
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


CASES = [
    Case("layer_norm", tg.layer_norm, [Arg((4, 8)), Arg((8,)), Arg((8,))],
         torch_fn=t_layer_norm),
    Case("layer_norm", tg.layer_norm, [Arg((2, 3, 5))], torch_fn=t_layer_norm, name="plain"),
    Case("layer_norm", lambda x, w: tg.layer_norm(x, w, eps=0.5), [Arg((3, 4)), Arg((4,))],
         torch_fn=lambda x, w: t_layer_norm(x, w, eps=0.5), name="eps0.5"),
    Case("layer_norm", lambda x: tg.layer_norm(x) * 2.0, [Arg((3, 1))],
         torch_fn=lambda x: t_layer_norm(x) * 2.0, name="D1"),
    Case("layer_norm", lambda x, w, b: tg.layer_norm(x * 2.0 + 1.0, w, b) * x,
         [Arg((5, 6)), Arg((6,)), Arg((6,))],
         torch_fn=lambda x, w, b: t_layer_norm(x * 2.0 + 1.0, w, b) * x, name="around"),
    Case("layer_norm", tg.layer_norm, [Arg((6, 300)), Arg((300,)), Arg((300,))],
         torch_fn=t_layer_norm, fd=False, name="long-rows"),
    Case("rms_norm", tg.rms_norm, [Arg((4, 6)), Arg((6,))], torch_fn=t_rms_norm),
    Case("rms_norm", tg.rms_norm, [Arg((3, 1, 7))], torch_fn=t_rms_norm, name="plain"),
    Case("rms_norm", lambda x, w: tg.rms_norm(x + 1.0, w, eps=0.1) - x,
         [Arg((2, 5)), Arg((5,))], torch_fn=lambda x, w: t_rms_norm(x + 1.0, w, 0.1) - x,
         name="around-eps0.1"),
    Case("rms_norm", tg.rms_norm, [Arg((5, 513)), Arg((513,))], torch_fn=t_rms_norm,
         fd=False, name="long-rows"),
]


def test_each_norm_is_one_primitive_forward_and_one_backward() -> None:
    for fn in (tg.layer_norm, tg.rms_norm):
        b = build(Case("norm", fn, [Arg((3, 4))]))
        ops = [n.op for n in b.graph.nodes]
        assert ops.count("normalize_last") == 1 and ops.count("normalize_last_grad") == 1
        assert not {"mean_last", "sum_last", "sqrt"} & set(ops), ops


def test_rows_are_normalized() -> None:
    b = build(Case("layer_norm", lambda x: tg.layer_norm(x), [Arg((6, 50))], grad=False))
    y = run_reference(b)[b.out]
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-6)
    np.testing.assert_allclose(y.var(-1), 1.0, rtol=1e-3)
    b = build(Case("rms_norm", lambda x: tg.rms_norm(x), [Arg((6, 50))], grad=False))
    y = run_reference(b)[b.out]
    np.testing.assert_allclose((y * y).mean(-1), 1.0, rtol=1e-4)


@pytest.mark.parametrize("fn, args, match", [
    (lambda x, w: tg.layer_norm(x, w), [Arg((3, 4)), Arg((5,))],
     r"layer_norm: weight \[5\] must be \[4\], the last axis of x \[3, 4\]"),
    (lambda x, b: tg.layer_norm(x, None, b), [Arg((3, 4)), Arg((1, 4))],
     r"layer_norm: bias \[1, 4\] must be \[4\]"),
    (lambda x, w: tg.rms_norm(x, w), [Arg((2, 6)), Arg((3,))],
     r"rms_norm: weight \[3\] must be \[6\], the last axis of x \[2, 6\]"),
    (lambda x: tg.layer_norm(x, eps=-1.0), [Arg((3, 4))],
     r"layer_norm: eps must be a finite Python number >= 0, got -1.0"),
    (lambda x: tg.rms_norm(x, eps=float("nan")), [Arg((3, 4))], r"rms_norm: eps must be"),
    (lambda x: tg.layer_norm(tg.sum(x)), [Arg((3, 4))],
     r"layer_norm: x must have rank >= 1 .*got a 0-d tensor"),
    (lambda i: tg.rms_norm(i), [Arg((3,), "i32", "int:0:3")],
     r"rms_norm: x must be f32, got i32 \(shape \[3\]\)"),
    (lambda x: tg.layer_norm(x, np.ones(4)), [Arg((3, 4))],
     r"layer_norm: weight must be a Tensor or None, got ndarray"),
])
def test_errors(fn, args, match) -> None:
    with pytest.raises(ShapeError, match=match):
        build(Case("err", fn, args, grad=False))


def test_modules_use_the_fused_norms() -> None:
    for layer in (tg.LayerNorm(4), tg.RMSNorm(4)):
        f = tg.trace_forward(layer, lambda m, x: m(x), {"x": ((2, 4), "f32")})
        assert [n.op for n in f.graph.nodes].count("normalize_last") == 1
    with pytest.raises(ShapeError, match=r"layer_norm: weight \[4\] must be \[5\]"):
        tg.trace_forward(tg.LayerNorm(4), lambda m, x: m(x), {"x": ((2, 5), "f32")})
