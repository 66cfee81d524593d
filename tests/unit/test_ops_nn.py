"""rope, cross_entropy, nll_loss, capture: forward vs PyTorch (rope vs an explicit pairwise
rotation), gradients vs autograd and finite differences, capture bookkeeping, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorgrad as tg
from tensorgrad import ShapeError, TraceError
from tensorgrad.tensor import leaf, tracing
from tests.harness import Arg, Case, build, run_reference


def torch_rope(q, k, base=10000.0):
    """Rotate each pair (x_i, x_{i+D/2}) by the angle t * base^(-2i/D), t = 0..T-1."""
    def rotate(x):
        t_len, dim = x.shape[-2:]
        half = dim // 2
        inv = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / dim)
        ang = torch.arange(t_len, dtype=torch.float64)[:, None] * inv[None, :]
        c, s = torch.cos(ang), torch.sin(ang)
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * c - b * s, b * c + a * s], -1)
    return rotate(q), rotate(k)


def ce_case(shape, reduction, name=""):
    vocab = shape[-1]

    def twin(logits, targets):
        out = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1),
                              reduction=reduction)
        return out.reshape(shape[:-1]) if reduction == "none" else out
    return Case("cross_entropy", lambda lg, t: tg.cross_entropy(lg, t, reduction),
                [Arg(shape), Arg(shape[:-1], "i32", f"int:0:{vocab}")], torch_fn=twin,
                name=name or reduction)


def nll_case(shape, reduction, name=""):
    vocab = shape[-1]

    def twin(lp, targets):
        out = F.nll_loss(lp.reshape(-1, vocab), targets.reshape(-1), reduction=reduction)
        return out.reshape(shape[:-1]) if reduction == "none" else out
    return Case("nll_loss", lambda lp, t: tg.nll_loss(lp, t, reduction),
                [Arg(shape), Arg(shape[:-1], "i32", f"int:0:{vocab}")], torch_fn=twin,
                name=name or reduction)


CASES = [
    Case("rope", tg.rope, [Arg((2, 5, 8)), Arg((2, 5, 8))], torch_fn=torch_rope),
    Case("rope", tg.rope, [Arg((3, 4)), Arg((2, 3, 4))], torch_fn=torch_rope,
         name="rank2-q"),
    Case("rope", lambda q, k: tg.rope(q, k, base=100.0), [Arg((1, 2, 6, 4)), Arg((1, 2, 6, 4))],
         torch_fn=lambda q, k: torch_rope(q, k, 100.0), name="base100"),
    Case("rope", tg.rope, [Arg((1, 2)), Arg((1, 2))], torch_fn=torch_rope, name="T1-D2"),
    ce_case((4, 5), "mean"),
    ce_case((4, 5), "sum"),
    ce_case((4, 5), "none"),
    ce_case((2, 3, 7), "mean", name="rank3-mean"),
    ce_case((2, 3, 7), "none", name="rank3-none"),
    ce_case((1, 1), "mean", name="one-class"),
    nll_case((4, 5), "mean"),
    nll_case((4, 5), "sum"),
    nll_case((2, 3, 6), "none", name="rank3-none"),
    Case("nll_loss", lambda lp, t: tg.nll_loss(tg.log_softmax(lp, -1), t),
         [Arg((6, 3)), Arg((6,), "i32", "int:0:3")],
         torch_fn=lambda lp, t: F.nll_loss(F.log_softmax(lp, -1), t), name="of-log-softmax"),
    Case("capture", lambda x: tg.capture("h", x * 2.0), [Arg((3, 2))],
         torch_fn=lambda x: x * 2.0),
]


def test_rope_position_zero_is_identity_and_norms_are_kept() -> None:
    b = build(Case("rope", lambda q, k: tg.rope(q, k)[0], [Arg((3, 6, 8)), Arg((3, 6, 8))],
                   grad=False))
    out, q = run_reference(b)[b.out], b.values["a0"]
    np.testing.assert_allclose(out[:, 0], q[:, 0], rtol=1e-6)
    pairs = lambda x: x[..., :4] ** 2 + x[..., 4:] ** 2
    np.testing.assert_allclose(pairs(out), pairs(q), rtol=1e-4, atol=1e-5)


def test_out_of_range_targets_count_as_zero_loss_in_the_mean() -> None:
    lp = np.log(np.full((3, 4), 0.25, np.float32))
    t = np.array([1, 7, -1], np.int32)
    for reduction, want in (("none", [np.log(4), 0, 0]), ("mean", np.log(4) / 3),
                            ("sum", np.log(4))):
        b = build(Case("nll_loss", lambda a, b, r=reduction: tg.nll_loss(a, b, r),
                       [Arg((3, 4), gen=lp), Arg((3,), "i32", t)], grad=False))
        np.testing.assert_allclose(run_reference(b)[b.out], want, rtol=1e-6)


def test_capture_records_the_tensor() -> None:
    with tracing() as st:
        x = leaf("param", "x", (3,))
        y = tg.relu(x)
        assert tg.capture("act", y) is y
    assert st.graph.captures == {"act": y.id}


def test_capture_is_a_no_op_when_disabled() -> None:
    with tracing(capture=False) as st:
        x = leaf("param", "x", (3,))
        assert tg.capture("act", x) is x
        tg.capture("act", x)  # no duplicate error either: nothing is recorded
    assert st.graph.captures == {}


def test_capture_duplicate_name_raises() -> None:
    with tracing():
        x = leaf("param", "x", (3,))
        tg.capture("act", x)
        with pytest.raises(TraceError, match="duplicate capture name 'act'"):
            tg.capture("act", tg.relu(x))


def test_capture_outside_a_trace_raises() -> None:
    with pytest.raises(TraceError, match="'capture' was called outside a trace"):
        tg.capture("x", None)


@pytest.mark.parametrize("fn, args, match", [
    (tg.rope, [Arg((2, 5, 7)), Arg((2, 5, 7))], r"rope: D \(axis -1\) must be even, got 7"),
    (tg.rope, [Arg((8,)), Arg((2, 8))], (r"rope: q must have rank >= 2 \(\[\.\.\., T, D\]\), "
                                       r"got shape \[8\]")),
    (tg.rope, [Arg((2, 5, 8)), Arg((2, 4, 8))],
     r"rope: q \[2, 5, 8\] and k \[2, 4, 8\] must share T \(axis -2\) and D \(axis -1\)"),
    (lambda q, k: tg.rope(q, tg.less(k, 0.0)), [Arg((5, 8)), Arg((5, 8))],
     r"rope: k must be f32, got bool"),
    (lambda lg, t: tg.cross_entropy(lg, lg), [Arg((4, 5)), Arg((4,))],
     r"cross_entropy: targets must be i32, got f32"),
    (lambda lg, t: tg.nll_loss(lg, t), [Arg((4, 5)), Arg((4,))],
     r"nll_loss: targets must be i32, got f32"),
    (lambda lg, t: tg.nll_loss(lg, t), [Arg((4, 5)), Arg((5,), "i32", "int:0:3")],
     r"nll_loss: targets \[5\] must be the shape of log_probs \[4, 5\] without its last axis"),
    (lambda lg, t: tg.cross_entropy(lg, t), [Arg((4, 5)), Arg((4, 1), "i32", "int:0:3")],
     r"cross_entropy: targets \[4, 1\] must be the shape of logits \[4, 5\]"),
    (lambda lg, t: tg.cross_entropy(lg, t, reduction="avg"),
     [Arg((4, 5)), Arg((4,), "i32", "int:0:3")],
     r"cross_entropy: reduction must be one of \('mean', 'sum', 'none'\), got 'avg'"),
    (lambda lg, t: tg.nll_loss(lg, t, reduction=None), [Arg((4, 5)), Arg((4,), "i32", "int:0:3")],
     r"nll_loss: reduction must be one of"),
    (lambda x, t: tg.capture("", x), [Arg((2,)), Arg((2,))],
     r"capture: name must be a non-empty str"),
])
def test_errors(fn, args, match) -> None:
    with pytest.raises(ShapeError, match=match):
        build(Case("err", fn, args, grad=False))


def test_loss_error_names_user_line() -> None:
    with pytest.raises(ShapeError) as info:
        build(Case("err", lambda lg, t: tg.cross_entropy(lg, t), [Arg((4, 5)), Arg((4,))],
                   grad=False))
    assert "test_ops_nn.py" in str(info.value)
