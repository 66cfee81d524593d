"""rope, cross_entropy, nll_loss, capture: forward vs PyTorch (rope vs an explicit pairwise
rotation), gradients vs autograd and finite differences, capture bookkeeping, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorgrad as tg
from tensorgrad import ShapeError, TraceError
from tensorgrad.hostdata import IndexBound, first_rejected, sentinel_only
from tensorgrad.ops.index import input_index_bounds
from tensorgrad.ops.registry import record
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


def _targets(shape, vocab, targets):
    """An i32 target Arg: random classes, or the given values (ignored ones among them)."""
    if targets is None:
        return Arg(shape, "i32", f"int:0:{vocab}")
    return Arg(shape, "i32", np.array(targets, np.int32).reshape(shape))


def ce_case(shape, reduction, name="", targets=None, ignore_index=None):
    """cross_entropy against F.cross_entropy; `ignore_index` None: the default (-100)."""
    vocab = shape[-1]
    kw = {} if ignore_index is None else {"ignore_index": ignore_index}

    def twin(logits, t):
        out = F.cross_entropy(logits.reshape(-1, vocab), t.reshape(-1), reduction=reduction,
                              **kw)
        return out.reshape(shape[:-1]) if reduction == "none" else out
    return Case("cross_entropy", lambda lg, t: tg.cross_entropy(lg, t, reduction, **kw),
                [Arg(shape), _targets(shape[:-1], vocab, targets)], torch_fn=twin,
                name=name or reduction, fd=not _all_ignored(reduction, targets, kw))


def nll_case(shape, reduction, name="", targets=None, ignore_index=None):
    """nll_loss against F.nll_loss; `ignore_index` None: the default (-100)."""
    vocab = shape[-1]
    kw = {} if ignore_index is None else {"ignore_index": ignore_index}

    def twin(lp, t):
        out = F.nll_loss(lp.reshape(-1, vocab), t.reshape(-1), reduction=reduction, **kw)
        return out.reshape(shape[:-1]) if reduction == "none" else out
    return Case("nll_loss", lambda lp, t: tg.nll_loss(lp, t, reduction, **kw),
                [Arg(shape), _targets(shape[:-1], vocab, targets)], torch_fn=twin,
                name=name or reduction, fd=not _all_ignored(reduction, targets, kw))


def _all_ignored(reduction, targets, kw) -> bool:
    """A 'mean' over no target: the loss is nan (as in torch), so finite differences are
    nan too; its gradients (zeros) are still checked against torch."""
    return reduction == "mean" and targets is not None and \
        bool(np.all(np.asarray(targets) == kw.get("ignore_index", -100)))


PAD = -100
IGNORED = [1, PAD, 3, PAD]                      # [4]: two padding targets
IGNORED_3D = [[2, PAD, 6], [PAD, 0, 5]]         # [2, 3]
ALL_IGNORED = [PAD] * 4


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
    # ignore_index: padding (-100) targets add 0, get no gradient and are not counted by 'mean'
    # (the default -100 for 'mean', where the count differs; explicit elsewhere)
    ce_case((4, 5), "mean", name="ignored-mean", targets=IGNORED),
    *(ce_case((4, 5), r, name=f"ignored-{r}", targets=IGNORED, ignore_index=PAD)
      for r in ("sum", "none")),
    ce_case((2, 3, 7), "mean", name="rank3-ignored-mean", targets=IGNORED_3D),
    ce_case((4, 5), "mean", name="all-ignored-mean", targets=ALL_IGNORED),
    *(ce_case((4, 5), r, name=f"all-ignored-{r}", targets=ALL_IGNORED, ignore_index=PAD)
      for r in ("sum", "none")),
    *(ce_case((4, 5), r, name=f"ignore-class-2-{r}", targets=[2, 0, 2, 4], ignore_index=2)
      for r in ("mean", "none")),
    ce_case((4, 5), "mean", name="ignore-index-7", targets=[7, 1, 7, 3], ignore_index=7),
    ce_case((5,), "mean", name="0d-ignored", targets=PAD),
    nll_case((4, 5), "mean", name="ignored-mean", targets=IGNORED),
    *(nll_case((4, 5), r, name=f"ignored-{r}", targets=IGNORED, ignore_index=PAD)
      for r in ("sum", "none")),
    nll_case((4, 5), "mean", name="all-ignored-mean", targets=ALL_IGNORED),
    nll_case((2, 3, 6), "sum", name="ignore-class-0-sum", targets=[[0, 1, 0], [5, 0, 2]],
             ignore_index=0),
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


def test_loss_targets_are_bounded_with_ignore_index_allowed() -> None:
    """The targets of cross_entropy/nll_loss from an input may hold 0..V - 1 and the
    ignore_index (the one_hot's sentinel); any other value is rejected, naming the use."""
    b = build(Case("cross_entropy", lambda lg, t: tg.cross_entropy(lg, t),
                   [Arg((4, 5)), Arg((4,), "i32", np.array(IGNORED, np.int32))]))
    (use,) = input_index_bounds(b.graph)["a1"]   # the forward and backward one-hot: one use
    assert (use.bound, use.sentinel) == (5, -100) and use.expected() == "0..4 or -100"
    assert use.what.startswith("one_hot(depth=5, ignore_index=-100) at ") and \
        "test_ops_nn.py" in use.what
    assert first_rejected([1, -100, 4, -100], [use]) is None
    assert first_rejected([1, -100, -1, 5], [use]) == (2, -1, use)
    assert first_rejected([5], [use]) == (0, 5, use)
    assert sentinel_only([-100] * 3, [use]) is use and sentinel_only([-100, 0], [use]) is None
    b = build(Case("nll_loss", lambda lp, t: tg.nll_loss(lp, t, ignore_index=3),
                   [Arg((4, 5)), Arg((4,), "i32", "int:0:5")]))
    (use,) = input_index_bounds(b.graph)["a1"]
    assert (use.bound, use.sentinel, use.expected()) == (5, 3, "0..4")  # a class: in range


def test_an_index_input_must_suit_every_use() -> None:
    """Targets also read by an embedding (no sentinel) may not hold the ignore_index; a
    sentinel allowed by every use (in range of the other) stays allowed."""
    ce = IndexBound(5, "one_hot(depth=5, ignore_index=-100)", -100)
    emb = IndexBound(9, "embedding(vocab=9)")
    assert first_rejected([0, -100], [ce, emb]) == (1, -100, emb)
    assert first_rejected([0, 7], [ce, emb]) == (1, 7, ce)
    past = IndexBound(5, "one_hot(depth=5, ignore_index=7)", 7)
    assert first_rejected([0, 7, 8], [past, emb]) == (2, 8, past)


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


IDS = Arg((4,), "i32", "int:0:5")


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
    (lambda lg, t: tg.cross_entropy(lg, t, ignore_index=True), [Arg((4, 5)), IDS],
     (r"cross_entropy: ignore_index must be an int in -2147483648\.\.2147483647 \(targets are "
     r"i32\), got True")),
    (lambda lg, t: tg.cross_entropy(lg, t, ignore_index=-100.0), [Arg((4, 5)), IDS],
     r"cross_entropy: ignore_index must be an int .*, got -100\.0"),
    (lambda lg, t: tg.nll_loss(lg, t, "sum", ignore_index=None), [Arg((4, 5)), IDS],
     r"nll_loss: ignore_index must be an int .*, got None"),
    (lambda lg, t: tg.nll_loss(lg, t, ignore_index=2**31), [Arg((4, 5)), IDS],
     (r"nll_loss: ignore_index must be an int in -2147483648\.\.2147483647 \(targets are i32\), "
     r"got 2147483648")),
    (lambda lg, t: record("one_hot", [tg.reshape(t, (4, 1))], depth=5, dtype="f32",
                          ignore_index=False), [Arg((4, 5)), IDS],
     (r"one_hot: ignore_index must be None or an int in -2147483648\.\.2147483647 \(indices "
     r"are i32\), got False")),
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
