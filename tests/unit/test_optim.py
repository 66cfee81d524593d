"""Optimizers: update primitives against NumPy twins, whole trajectories against torch.optim.

Trajectories run the training graph through the reference interpreter for 20 steps, applying
the plan's writebacks between steps, on params p1 [4, 3] and p2 [3] with
loss = sum((x @ p1 + p2 - y)²) and a fresh batch each step.

Adam note: our update is ``p - lrt m / (sqrt(v) + eps)`` with ``lrt`` bias-corrected on the
host, i.e. PyTorch's Adam with eps scaled by ``sqrt(1 - b2^t)``. With eps = 1e-8 and O(1)
gradients the difference is far below the tolerance; ``test_adam_eps_sits_outside_the_bias_
correction`` checks the exact form with a large eps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import tensorgrad as tg
from tensorgrad import lr, optim
from tensorgrad.autograd import append_grad
from tensorgrad.errors import ShapeError
from tensorgrad.gpu.interface import DeviceLimits
from tensorgrad.ops import optim_ops as oo
from tensorgrad.ops import update_check as uc
from tensorgrad.ops.arena import pack as oo_pack
from tensorgrad.ops.registry import record
from tensorgrad.reference import evaluate
from tensorgrad.tensor import leaf, tracing
from tests.harness import Arg, Case
from tests.harness import build as build_case
from tests.unit.op_tests import forward_check, params_for

# ---- primitive cases ------------------------------------------------------------------------

S = Arg((), gen="positive")  # a 0-d sum of squares
G = Arg((3, 4))
MV = Arg((2, 3, 4), gen="positive")


def _scale(gnorm: Any = None, gtotal: Any = None, clip: float | None = None) -> Any:
    s = 1.0
    if gnorm is not None:
        s = s / (np.sqrt(np.float64(gnorm)) + 1e-8)
    if gtotal is not None:
        s = s * min(clip / (np.sqrt(np.float64(gtotal)) + 1e-6), 1.0)
    return s


def _moments(state, g, part, b1=0.9, b2=0.999, **sc):
    g = g * _scale(**sc)

    def m(x):
        return b1 * x + (1 - b1) * g

    def v(x):
        return b2 * x + (1 - b2) * g * g

    if part == "mv":
        return np.stack([m(state[0]), v(state[1])])
    return m(state) if part == "m" else v(state)


def _total(*terms):
    return sum(s / (np.sqrt(s) + 1e-8) ** 2 if role == "normalized" else s
               for s, role in terms)


CASES = [
    Case("grad_sumsq", oo.grad_sumsq, [G], np_fn=lambda g: np.sum(np.float64(g) ** 2),
         grad=False),
    Case("grad_sumsq", oo.grad_sumsq, [Arg((300,))], np_fn=lambda g: np.sum(np.float64(g) ** 2),
         grad=False, name="workgroup"),
    Case("grad_sumsq", oo.grad_sumsq, [Arg(())], np_fn=lambda g: np.float64(g) ** 2,
         grad=False, name="0d"),
    Case("grad_norm_total",
         lambda a, b, c: oo.grad_norm_total([(a, "raw"), (b, "normalized"), (c, "raw")]),
         [S, S, S], np_fn=lambda a, b, c: _total((a, "raw"), (b, "normalized"), (c, "raw")),
         grad=False),
    Case("grad_norm_total",
         lambda *s: oo.grad_norm_total([(x, "normalized" if k % 3 == 0 else "raw")
                                        for k, x in enumerate(s)]),
         [S] * 15, np_fn=lambda *s: _total(*[(x, "normalized" if k % 3 == 0 else "raw")
                                             for k, x in enumerate(s)]),
         grad=False, name="chained-15"),
    Case("adam_moments", lambda s, g: oo.adam_moments(s, g, "mv", 0.9, 0.999), [MV, G],
         np_fn=lambda s, g: _moments(s, g, "mv"), grad=False, name="packed"),
    Case("adam_moments",
         lambda s, g, n, t: oo.adam_moments(s, g, "mv", 0.8, 0.99, gnorm=n, gtotal=t, clip=0.5),
         [MV, G, S, Arg((), gen=np.float32(9.0))],
         np_fn=lambda s, g, n, t: _moments(s, g, "mv", 0.8, 0.99, gnorm=n, gtotal=t, clip=0.5),
         grad=False, name="packed-normalized-clipped"),
    Case("adam_moments", lambda s, g: oo.adam_moments(s, g, "m", 0.9, 0.999), [G, G],
         np_fn=lambda s, g: _moments(s, g, "m"), grad=False, name="m"),
    Case("adam_moments",
         lambda s, g, t: oo.adam_moments(s, g, "v", 0.9, 0.95, gtotal=t, clip=2.0),
         [Arg((5,), gen="positive"), Arg((5,)), Arg((), gen=np.float32(16.0))],
         np_fn=lambda s, g, t: _moments(s, g, "v", 0.9, 0.95, gtotal=t, clip=2.0),
         grad=False, name="v-clipped"),
    Case("adam_update_p", lambda p, mv, lrt: oo.adam_update_p(p, [mv], lrt, 1e-8), [G, MV, S],
         np_fn=lambda p, mv, lrt: p - lrt * mv[0] / (np.sqrt(mv[1]) + 1e-8), grad=False,
         name="packed"),
    Case("adam_update_p",
         lambda p, m, v, lrt, s: oo.adam_update_p(p, [m, v], lrt, 1e-3, s),
         [G, G, Arg((3, 4), gen="positive"), S, Arg((), gen=np.float32(0.99))],
         np_fn=lambda p, m, v, lrt, s: s * p - lrt * m / (np.sqrt(v) + 1e-3), grad=False,
         name="split-shrink"),
    Case("sgd_velocity", lambda v, g: oo.sgd_velocity(v, g, 0.9), [G, G],
         np_fn=lambda v, g: 0.9 * v + g, grad=False),
    Case("sgd_velocity",
         lambda v, g, p, n, t: oo.sgd_velocity(v, g, 0.5, 0.1, p, n, t, 1.0),
         [G, G, G, S, Arg((), gen=np.float32(4.0))],
         np_fn=lambda v, g, p, n, t: 0.5 * v + g * _scale(n, t, 1.0) + 0.1 * p, grad=False,
         name="decay-scaled"),
    Case("sgd_update_p", lambda p, g, lr_: oo.sgd_update_p(p, lr_, g=g), [G, G, S],
         np_fn=lambda p, g, lr_: p - lr_ * g, grad=False, name="plain"),
    Case("sgd_update_p",
         lambda p, g, lr_, t: oo.sgd_update_p(p, lr_, g=g, weight_decay=0.2, gtotal=t,
                                             clip=0.5),
         [G, G, S, Arg((), gen=np.float32(25.0))],
         np_fn=lambda p, g, lr_, t: p - lr_ * (g * _scale(None, t, 0.5) + 0.2 * p),
         grad=False, name="decay-clipped"),
    Case("sgd_update_p", lambda p, v, lr_: oo.sgd_update_p(p, lr_, v=v, momentum=0.9),
         [G, G, S], np_fn=lambda p, v, lr_: p - lr_ * v, grad=False, name="momentum"),
    Case("sgd_update_p",
         lambda p, g, v, lr_, n: oo.sgd_update_p(p, lr_, g=g, v=v, momentum=0.9, nesterov=True,
                                                 weight_decay=0.1, gnorm=n),
         [G, G, G, S, S],
         np_fn=lambda p, g, v, lr_, n: p - lr_ * (g * _scale(n) + 0.1 * p + 0.9 * v),
         grad=False, name="nesterov-normalized"),
]
# the step guard: arrays with a NaN / an Inf somewhere, and the ok flag fed to updates
BAD = np.arange(12, dtype=np.float32).reshape(3, 4)
BAD[2, 1] = np.nan
HUGE = np.ones(700, np.float32)
HUGE[650] = np.inf
OK1, OK0 = Arg((), gen=np.float32(1.0)), Arg((), gen=np.float32(0.0))


def _sumsq_partials(width, *xs):
    out = np.zeros(width)
    for x in xs:
        for e, v in enumerate(np.asarray(x, np.float64).reshape(-1)):
            out[e % width] += v * v
    return out.astype(np.float32)


def _flags(width, *xs):
    out = np.ones(width, bool)
    for x in xs:
        flat = np.asarray(x, np.float64).reshape(-1)
        for e, v in enumerate(flat):
            out[e % width] &= bool(np.isfinite(v))
    return out.astype(np.float32)


CASES += [
    Case("finite_partials", lambda a, b: record("finite_partials", [a, b]), [G, Arg((5,))],
         np_fn=lambda a, b: _flags(1, a, b), grad=False, name="finite"),
    Case("finite_partials", lambda a, b: record("finite_partials", [a, b]),
         [Arg((3, 4), gen=BAD), Arg((700,), gen=HUGE)],
         np_fn=lambda a, b: _flags(oo.guard_width([12, 700]), a, b), grad=False,
         name="nan-and-inf"),
    Case("step_ok", lambda loss, a, b: oo.step_ok(loss, [a, b]), [S, G, G],
         np_fn=lambda *_: np.float32(1.0), grad=False, name="ok"),
    Case("step_ok", lambda loss, a: oo.step_ok(loss, [a]), [Arg((), gen=np.float32(np.inf)), G],
         np_fn=lambda *_: np.float32(0.0), grad=False, name="inf-loss"),
    Case("step_ok", lambda loss, *gs: oo.step_ok(loss, list(gs)),
         [S] + [G] * 40 + [Arg((3, 4), gen=BAD)],
         np_fn=lambda *_: np.float32(0.0), grad=False, name="chained-nan-grad"),
    Case("adam_moments", lambda s, g, ok: oo.adam_moments(s, g, "mv", 0.9, 0.999, ok=ok),
         [MV, G, OK0], np_fn=lambda s, g, ok: s, grad=False, name="guarded-skip"),
    Case("adam_moments", lambda s, g, ok: oo.adam_moments(s, g, "m", 0.9, 0.999, ok=ok),
         [G, G, OK1], np_fn=lambda s, g, ok: _moments(s, g, "m"), grad=False,
         name="guarded-apply"),
    Case("adam_update_p",
         lambda p, mv, lrt, s, ok: oo.adam_update_p(p, [mv], lrt, 1e-8, s, ok=ok),
         [G, MV, S, S, OK0], np_fn=lambda p, mv, lrt, s, ok: p, grad=False,
         name="guarded-skip"),
    Case("sgd_velocity", lambda v, g, ok: oo.sgd_velocity(v, g, 0.9, ok=ok), [G, G, OK0],
         np_fn=lambda v, g, ok: v, grad=False, name="guarded-skip"),
    Case("sgd_update_p", lambda p, g, lr_, ok: oo.sgd_update_p(p, lr_, g=g, ok=ok),
         [G, G, S, OK1], np_fn=lambda p, g, lr_, ok: p - lr_ * g, grad=False,
         name="guarded-apply"),
    Case("sgd_update_p",
         lambda p, g, v, lr_, n, t, ok: oo.sgd_update_p(p, lr_, g=g, v=v, momentum=0.9,
                                                        nesterov=True, gnorm=n, gtotal=t,
                                                        clip=1.0, ok=ok),
         [G, G, G, S, S, S, OK0], np_fn=lambda p, *_: p, grad=False,
         name="guarded-skip-eight-bindings"),
]
# The update's trial (update_partials): what the update would write, in f32, checked finite
# per interleaved slice. Values chosen so that one slice overflows (or holds a NaN).
N7 = 700
W7 = oo.guard_width([N7])
TWOS = np.full(N7, 2.0, np.float32)
SPIKE = TWOS.copy()
SPIKE[650] = 1e10          # lr * 1e10 overflows f32 for lr = 1e30; its square overflows too
SQ_SPIKE = TWOS.copy()
SQ_SPIKE[123] = 1e22       # finite, but (1 - b2) g² = 1e41 is not: Adam's v would be inf
NAN_G = TWOS.copy()
NAN_G[5] = np.nan
M_BIG = np.stack([np.full(N7, 10.0, np.float32), np.full(N7, 1e-6, np.float32)])  # m >> sqrt(v)
P7, G7 = Arg((N7,), gen="unit"), Arg((N7,), gen="unit")
V7 = Arg((N7,), gen="positive")
LR_HUGE = Arg((), gen=np.float32(1e30))
LRT_HUGE = Arg((), gen=np.float32(1e37))  # Adam: lrt m'/sqrt(v') ~ 1e37 * 146 overflows
SGD_ATTRS = {"momentum": 0.0, "nesterov": False, "weight_decay": 0.0, "clip": None}
ADAM_ATTRS = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "clip": None}


def _f32(x):
    return np.asarray(x, np.float32)


def _sgd_trial(width, p, g, lr_, v=None, mu=0.0, nesterov=False, wd=0.0, gs=1.0):
    with np.errstate(all="ignore"):
        ge = _f32(_f32(g) * np.float32(gs) + np.float32(wd) * _f32(p))
        outs, u = [g], ge
        if v is not None:
            vn = _f32(np.float32(mu) * _f32(v) + ge)
            outs.append(vn)
            u = _f32(ge + np.float32(mu) * vn) if nesterov else vn
        outs.append(_f32(_f32(p) - np.float32(lr_) * u))
        return _flags(width, *outs)


def _adam_trial(width, p, g, m, v, lrt, shrink=1.0, gs=1.0, eps=1e-8, check_p=True):
    with np.errstate(all="ignore"):
        gg = _f32(_f32(g) * np.float32(gs))
        m1 = _f32(np.float32(0.9) * _f32(m) + np.float32(1 - 0.9) * gg)
        v1 = _f32(np.float32(0.999) * _f32(v) + np.float32(1 - 0.999) * (gg * gg))
        outs = [g, m1, v1]
        if check_p:
            outs.append(_f32(np.float32(shrink) * _f32(p) - np.float32(lrt) * m1 /
                             (np.sqrt(v1) + np.float32(eps))))
        return _flags(width, *outs)


def _sgd_check(p, g, lr_, v=None, **attrs):
    return uc.update_partials("sgd", p, g, [("v", v)] if v is not None else [],
                              [("lr", lr_)], {**SGD_ATTRS, **attrs}, (("w", 0, p.node.size),))


def _adam_check(p, g, states, lrt, shrink=None, gnorm=None, gtotal=None, clip=None,
                max_inputs=7):
    return uc.update_partials("adam", p, g, states,
                              [("lr", lrt), ("shrink", shrink), ("gnorm", gnorm),
                               ("gtotal", gtotal)], {**ADAM_ATTRS, "clip": clip},
                              (("w", 0, p.node.size),), max_inputs)


CASES += [
    Case("update_partials", lambda p, g, lr_: _sgd_check(p, g, lr_), [G, G, S],
         np_fn=lambda p, g, lr_: _sgd_trial(1, p, g, lr_), grad=False, name="sgd-finite"),
    Case("update_partials", lambda p, g, lr_: _sgd_check(p, g, lr_),
         [P7, Arg((N7,), gen=SPIKE), LR_HUGE],
         np_fn=lambda p, g, lr_: _sgd_trial(W7, p, g, lr_), grad=False, name="sgd-lr-overflow"),
    Case("update_partials", lambda p, g, lr_: _sgd_check(p, g, lr_),
         [P7, Arg((N7,), gen=NAN_G), S],
         np_fn=lambda p, g, lr_: _sgd_trial(W7, p, g, lr_), grad=False, name="sgd-nan-grad"),
    Case("update_partials",
         lambda p, g, v, lr_, t: uc.update_partials(
             "sgd", p, g, [("v", v)], [("lr", lr_), ("gtotal", t)],
             {"momentum": 0.9, "nesterov": True, "weight_decay": 0.1, "clip": 0.5},
             (("w", 0, N7),)),
         [P7, Arg((N7,), gen=SPIKE), G7, LR_HUGE, Arg((), gen=np.float32(4.0))],
         np_fn=lambda p, g, v, lr_, t: _sgd_trial(W7, p, g, lr_, v, 0.9, True, 0.1,
                                                  _scale(None, t, 0.5)),
         grad=False, name="sgd-nesterov-decay-clipped"),
    Case("update_partials", lambda p, g, v, lr_: _sgd_check(p, g, lr_, v, momentum=0.9),
         [G, G, G, S], np_fn=lambda p, g, v, lr_: _sgd_trial(1, p, g, lr_, v, 0.9),
         grad=False, name="sgd-momentum-finite"),
    Case("update_partials",
         lambda p, g, mv, lrt, s, n, t: _adam_check(p, g, [("mv", mv)], lrt, s, n, t, 1.0),
         [G, G, MV, S, Arg((), gen=np.float32(0.99)), S, Arg((), gen=np.float32(9.0))],
         np_fn=lambda p, g, mv, lrt, s, n, t: _adam_trial(1, p, g, mv[0], mv[1], lrt, s,
                                                          _scale(n, t, 1.0)),
         grad=False, name="adam-packed-finite"),
    Case("update_partials", lambda p, g, mv, lrt: _adam_check(p, g, [("mv", mv)], lrt),
         [P7, Arg((N7,), gen=TWOS), Arg((2, N7), gen=M_BIG), LRT_HUGE],
         np_fn=lambda p, g, mv, lrt: _adam_trial(W7, p, g, mv[0], mv[1], lrt), grad=False,
         name="adam-lr-overflow"),
    Case("update_partials",
         lambda p, g, m, v, lrt: _adam_check(p, g, [("m", m), ("v", v)], lrt),
         [P7, Arg((N7,), gen=SQ_SPIKE), G7, V7, S],
         np_fn=lambda p, g, m, v, lrt: _adam_trial(W7, p, g, m, v, lrt), grad=False,
         name="adam-split-v-overflow"),
    Case("update_partials",  # 8 inputs for 7 slots: the new param is not tried
         lambda p, g, m, v, lrt, s, n, t: _adam_check(p, g, [("m", m), ("v", v)], lrt, s, n,
                                                      t, 2.0),
         [P7, Arg((N7,), gen=SQ_SPIKE), Arg((N7,), gen=M_BIG[0]), Arg((N7,), gen=M_BIG[1]),
          LRT_HUGE, Arg((), gen=np.float32(0.99)), Arg((), gen=np.float32(1.0)),
          Arg((), gen=np.float32(1.0))],
         np_fn=lambda p, g, m, v, lrt, s, n, t: _adam_trial(W7, p, g, m, v, lrt, s,
                                                            _scale(n, t, 2.0), check_p=False),
         grad=False, name="adam-eight-inputs-skips-p"),
]
CASES += [
    Case("pack", lambda a, b: oo_pack([a, b], (0, 64), 128), [G, Arg((5,))],
         np_fn=lambda a, b: np.concatenate([a.reshape(-1), np.zeros(52), b, np.zeros(59)]),
         grad=False),
    Case("copy", lambda a: record("copy", [a]), [G], np_fn=lambda a: a, grad=False),
    Case("sumsq_partials", lambda a, b: record("sumsq_partials", [a, b]),
         [G, Arg((700,))], np_fn=lambda a, b: _sumsq_partials(oo.guard_width([12, 700]), a, b),
         grad=False),
    Case("sumsq_partials", lambda *xs: oo.sumsq_total(list(xs)), [G] * 9 + [Arg((300,))],
         np_fn=lambda *xs: sum(np.sum(np.float64(x) ** 2) for x in xs), grad=False,
         name="total-of-10"),
]
COVERS = ["grad_sumsq", "grad_norm_total", "adam_moments", "adam_update_p", "sgd_velocity",
          "sgd_update_p", "finite_partials", "step_ok", "sumsq_partials", "pack", "copy",
          "update_partials"]


@pytest.mark.parametrize("case", params_for(CASES))
def test_primitive_forward(case: Case) -> None:
    forward_check(case)


@pytest.mark.parametrize("name, zeros", [
    ("sgd-finite", 0), ("sgd-lr-overflow", 1), ("sgd-nan-grad", 1),
    ("sgd-nesterov-decay-clipped", 1), ("sgd-momentum-finite", 0), ("adam-packed-finite", 0),
    ("adam-lr-overflow", W7), ("adam-split-v-overflow", 1), ("adam-eight-inputs-skips-p", 1)])
def test_update_trial_cases_flag_what_they_mean_to(name: str, zeros: int) -> None:
    """The trial cases really overflow where they say (in any order of the products: WGSL
    may reassociate), so the kernel checks compare flags that matter."""
    case = next(c for c in CASES if c.op == "update_partials" and c.name == name)
    b = build_case(case)
    flags = evaluate(b.graph, b.values)[b.out]
    assert int((np.asarray(flags) == 0).sum()) == zeros, flags


def test_cases_cover_every_primitive() -> None:
    assert {c.op for c in CASES} == set(COVERS)


def _node_error(op: str, inputs: list[tuple[tuple[int, ...], str]], **attrs: Any) -> None:
    with tracing():
        ts = [leaf("input", f"i{k}", shape, dtype) for k, (shape, dtype) in enumerate(inputs)]
        record(op, ts, **attrs)


@pytest.mark.parametrize("op, inputs, attrs, match", [
    ("adam_moments", [((3, 4), "f32"), ((3, 4), "f32")],
     {"roles": ("state", "g"), "part": "mv", "beta1": 0.9, "beta2": 0.999, "clip": None},
     r"adam_moments: state has shape \[3, 4\], expected \[2, 3, 4\] for part 'mv'"),
    ("adam_moments", [((2, 3), "f32"), ((3,), "f32")],
     {"roles": ("state", "g"), "part": "mv", "beta1": 1.0, "beta2": 0.999, "clip": None},
     r"beta1 must be in \[0, 1\), got 1.0"),
    ("adam_moments", [((3,), "f32"), ((3,), "i32")],
     {"roles": ("state", "g"), "part": "m", "beta1": 0.9, "beta2": 0.999, "clip": None},
     r"input 'g' must be f32, got i32\[3\]"),
    ("adam_moments", [((3,), "f32"), ((3,), "f32"), ((), "f32")],
     {"roles": ("state", "g", "gtotal"), "part": "m", "beta1": 0.9, "beta2": 0.999, "clip": None},
     r"a 'gtotal' input and attrs clip=None go together"),
    ("adam_moments", [((3,), "f32"), ((3,), "f32"), ((3,), "f32")],
     {"roles": ("state", "g", "gnorm"), "part": "m", "beta1": 0.9, "beta2": 0.999, "clip": None},
     r"input 'gnorm' must be 0-d, got shape \[3\]"),
    ("adam_update_p", [((3,), "f32"), ((3,), "f32"), ((), "f32")],
     {"roles": ("p", "m", "lrt"), "eps": 1e-8},
     r"adam_update_p: needs 'mv' or both 'm' and 'v'"),
    ("adam_update_p", [((3,), "f32"), ((2, 4), "f32"), ((), "f32")],
     {"roles": ("p", "mv", "lrt"), "eps": 1e-8}, r"expected a packed 'mv' of shape \[2, 3\]"),
    ("adam_update_p", [((3,), "f32"), ((2, 3), "f32")],
     {"roles": ("p", "mv", "lrt"), "eps": 1e-8}, r"roles \['p', 'mv', 'lrt'\] must name each"),
    ("adam_update_p", [((3,), "f32"), ((2, 3), "f32"), ((), "f32")],
     {"roles": ("p", "mv", "lr"), "eps": 1e-8}, r"unknown \['lr'\], missing \['lrt'\]"),
    ("grad_norm_total", [((), "f32")] * 8, {"roles": ("raw",) * 8},
     r"grad_norm_total: expected 1..7 inputs"),
    ("grad_norm_total", [((2,), "f32")], {"roles": ("raw",)},
     r"inputs must be 0-d f32, got f32\[2\]"),
    ("grad_sumsq", [((2,), "i32")], {}, r"grad_sumsq: input must be f32, got i32\[2\]"),
    ("sgd_velocity", [((3,), "f32"), ((4,), "f32")],
     {"roles": ("v", "g"), "momentum": 0.9, "weight_decay": 0.0, "clip": None},
     r"sgd_velocity: input 'g' has shape \[4\], expected the shape of 'v' \[3\]"),
    ("sgd_velocity", [((3,), "f32"), ((3,), "f32")],
     {"roles": ("v", "g"), "momentum": 0.9, "weight_decay": 0.1, "clip": None},
     r"a 'p' input and weight_decay > 0 go together"),
    ("sgd_update_p", [((3,), "f32"), ((3,), "f32"), ((), "f32")],
     {"roles": ("p", "v", "lr"), "momentum": 0.0, "nesterov": False, "weight_decay": 0.0,
      "clip": None},
     r"do not fit momentum=0.0"),
    ("sgd_update_p", [((3,), "f32"), ((3,), "f32"), ((), "f32")],
     {"roles": ("p", "g", "lr"), "momentum": 0.0, "nesterov": True, "weight_decay": 0.0,
      "clip": None},
     r"nesterov needs momentum > 0"),
])
def test_primitive_errors(op: str, inputs: list, attrs: dict, match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        _node_error(op, inputs, **attrs)


# ---- the trajectory model -------------------------------------------------------------------

STEPS = 20
RNG = np.random.default_rng(7)
P1 = RNG.standard_normal((4, 3)) * 0.5
P2 = RNG.standard_normal(3)
XS = RNG.standard_normal((STEPS, 5, 4))
YS = RNG.standard_normal((STEPS, 5, 3)) * 2.0


def build(config: optim.OptimizerConfig, decay: dict | None = None,
          limits: DeviceLimits | None = None, arena: bool = False):
    with tracing() as st:
        x = leaf("input", "x", (5, 4))
        y = leaf("input", "y", (5, 3))
        p1 = leaf("param", "p1", (4, 3))
        p2 = leaf("param", "p2", (3,))
        loss = tg.sum(tg.square(tg.matmul(x, p1) + p2 - y))
    graph = st.graph
    graph.outputs = [loss.id]
    grads = append_grad(graph, loss.id)
    plan = optim.append_optimizer(graph, grads, config, decay, limits=limits, arena=arena,
                                  loss=loss.id if arena else None)
    return graph, loss.id, grads, plan


def run_ours(config: optim.OptimizerConfig, decay: dict | None = None,
             lr_at: Callable[[int], Any] | None = None, float_dtype: Any = np.float64,
             limits: DeviceLimits | None = None, arena: bool = False
             ) -> tuple[dict, list[float]]:
    graph, loss, _, plan = build(config, decay, limits, arena)
    params = {"p1": P1.copy(), "p2": P2.copy()}
    states: dict[str, np.ndarray] = {}
    losses = []
    for t in range(1, STEPS + 1):
        scalars = plan.host_scalars(config if lr_at is None else lr_at(t), t)
        feeds = {**params, **states, "x": XS[t - 1], "y": YS[t - 1], **scalars}
        values = evaluate(graph, feeds, float_dtype=float_dtype)
        losses.append(float(values[loss]))
        packed = None
        for wb in plan.writebacks:
            if wb.kind == "node":  # a range of the param arena
                packed = values[wb.dest].copy() if packed is None else packed
                start = wb.offset // 4
                packed[start:start + values[wb.source].size] = values[wb.source]
            else:
                (params if wb.kind == "param" else states)[wb.dest] = values[wb.source]
        if packed is not None:
            for name, offset in plan.layout.items():
                size = params[name].size
                params[name] = packed[offset:offset + size].reshape(params[name].shape)
    return params, losses


def run_torch(make_opt: Callable[[list], torch.optim.Optimizer], clip: float | None = None,
              normalize: tuple[str, ...] = (), lr_at: Callable[[int], float] | None = None
              ) -> tuple[dict, list[float]]:
    p1 = torch.tensor(P1, requires_grad=True)
    p2 = torch.tensor(P2, requires_grad=True)
    named = {"p1": p1, "p2": p2}
    opt = make_opt([p1, p2])
    losses = []
    for t in range(1, STEPS + 1):
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(t)
        opt.zero_grad()
        x, y = torch.tensor(XS[t - 1]), torch.tensor(YS[t - 1])
        loss = ((x @ p1 + p2 - y) ** 2).sum()
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for name in normalize:
                named[name].grad /= named[name].grad.norm() + 1e-8
        if clip is not None:
            total = torch.nn.utils.clip_grad_norm_([p1, p2], clip)
            assert t > 1 or total > clip, "clipping should be active on the first step"
        opt.step()
    return {k: v.detach().numpy() for k, v in named.items()}, losses


def assert_same(ours: tuple[dict, list], theirs: tuple[dict, list], rtol: float = 1e-4) -> None:
    np.testing.assert_allclose(ours[1], theirs[1], rtol=rtol, atol=1e-6, err_msg="losses")
    for name in ("p1", "p2"):
        np.testing.assert_allclose(ours[0][name], theirs[0][name], rtol=rtol, atol=1e-6,
                                   err_msg=name)


def _groups(p1_kw: dict, p2_kw: dict) -> Callable[[list], list]:
    return lambda ps: [{"params": [ps[0]], **p1_kw}, {"params": [ps[1]], **p2_kw}]


TRAJECTORIES = {
    "adam": (optim.Adam(0.05), None,
             lambda ps: torch.optim.Adam(ps, lr=0.05, eps=1e-8), {}),
    "adamw-bias-not-decayed": (
        optim.AdamW(0.05, weight_decay=0.1), {"p2": False},
        lambda ps: torch.optim.AdamW(_groups({}, {"weight_decay": 0.0})(ps), lr=0.05,
                                     weight_decay=0.1), {}),
    "adamw-filter": (
        optim.AdamW(0.05, beta1=0.8, beta2=0.99, weight_decay=0.2, decay_filter="p1"), None,
        lambda ps: torch.optim.AdamW(_groups({}, {"weight_decay": 0.0})(ps), lr=0.05,
                                     betas=(0.8, 0.99), weight_decay=0.2), {}),
    "adamw-flags-win": (
        optim.AdamW(0.05, weight_decay=0.1, decay_filter=lambda n: n == "p2"),
        {"p1": True, "p2": False},
        lambda ps: torch.optim.AdamW(_groups({}, {"weight_decay": 0.0})(ps), lr=0.05,
                                     weight_decay=0.1), {}),
    "sgd": (optim.SGD(0.01), None, lambda ps: torch.optim.SGD(ps, lr=0.01), {}),
    "sgd-momentum": (optim.SGD(0.01, momentum=0.9), None,
                     lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), {}),
    "sgd-nesterov-decay": (
        optim.SGD(0.01, momentum=0.9, nesterov=True, weight_decay=0.05), None,
        lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True,
                                   weight_decay=0.05), {}),
    "sgd-decay-bias-not-decayed": (
        optim.SGD(0.01, weight_decay=0.3), {"p2": False},
        lambda ps: torch.optim.SGD(_groups({}, {"weight_decay": 0.0})(ps), lr=0.01,
                                   weight_decay=0.3), {}),
    "adam-clip": (optim.Adam(0.05, clip_grad_norm=1.0), None,
                  lambda ps: torch.optim.Adam(ps, lr=0.05), {"clip": 1.0}),
    "sgd-momentum-clip": (optim.SGD(0.05, momentum=0.5, clip_grad_norm=2.0), None,
                          lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5),
                          {"clip": 2.0}),
    # Clipped, normalized gradients make v small, where the eps forms differ most (~1e-4
    # relative with eps = 1e-8), so this one uses a tiny eps.
    "adamw-normalize-then-clip": (
        optim.AdamW(0.05, eps=1e-12, weight_decay=0.1, clip_grad_norm=0.5,
                    normalize_grads="p2"), None,
        lambda ps: torch.optim.AdamW(ps, lr=0.05, eps=1e-12, weight_decay=0.1),
        {"clip": 0.5, "normalize": ("p2",)}),
    "sgd-normalize-all": (
        optim.SGD(0.1, momentum=0.9, nesterov=True, normalize_grads=True), None,
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
        {"normalize": ("p1", "p2")}),
}


ARENA = ["adam", "adamw-filter", "adamw-flags-win", "sgd-nesterov-decay",
         "sgd-decay-bias-not-decayed", "adam-clip", "sgd-momentum-clip"]


@pytest.mark.parametrize("name", ARENA)
def test_arena_trajectory_matches_torch(name: str) -> None:
    """Params and grads packed into arenas, one update per decay group: the same steps."""
    config, decay, make_opt, kw = TRAJECTORIES[name]
    assert_same(run_ours(config, decay, arena=True), run_torch(make_opt, **kw))


def test_arena_groups_and_layout() -> None:
    config = optim.AdamW(0.05, weight_decay=0.1, decay_filter="p2", clip_grad_norm=1.0)
    graph, _, _, plan = build(config, arena=True)
    assert plan.layout == {"p2": 0, "p1": 64} and plan.arena_size == 128  # decayed first
    ops = [n.op for n in graph.nodes]
    assert ops.count("pack") == 2 and ops.count("adam_update_p") == 2  # one per group
    assert ops.count("adam_moments") == 2 and "sum_last" in ops  # clip: a parallel norm
    assert ops.count("sumsq_partials") == 1 and ops.count("step_ok") == 1
    kinds = [wb.kind for wb in plan.writebacks]
    assert kinds.count("node") == 2 and kinds.count("state") == 3  # m and v; the chain flag
    # normalize_grads needs each param's own norm: no arena then
    _, _, _, plain = build(optim.Adam(0.1, normalize_grads=True), arena=True)
    assert plain.layout is None


def test_every_optimizer_kind_has_a_torch_trajectory() -> None:
    covered = {config.kind for config, *_ in TRAJECTORIES.values()}
    assert covered == set(optim.CONFIGS), \
        f"optimizers without a trajectory against torch.optim: {set(optim.CONFIGS) - covered}"


@pytest.mark.parametrize("name", sorted(TRAJECTORIES))
def test_trajectory_matches_torch(name: str) -> None:
    config, decay, make_opt, kw = TRAJECTORIES[name]
    assert_same(run_ours(config, decay), run_torch(make_opt, **kw))


@pytest.mark.parametrize("name", ["adam-clip", "adamw-normalize-then-clip",
                                  "sgd-nesterov-decay"])
def test_trajectory_in_float32(name: str) -> None:
    config, decay, make_opt, kw = TRAJECTORIES[name]
    assert_same(run_ours(config, decay, float_dtype=np.float32), run_torch(make_opt, **kw),
                rtol=1e-4)


def test_scheduled_lr_drives_adamw_and_its_decay() -> None:
    sched = lr.warmup(0.05, 4, lr.cosine_annealing(0.05, 0.001, 16))
    config = optim.AdamW(sched, weight_decay=0.5)
    ours = run_ours(config, {"p2": False})
    theirs = run_torch(lambda ps: torch.optim.AdamW(_groups({}, {"weight_decay": 0.0})(ps),
                                                    lr=0.05, weight_decay=0.5),
                       lr_at=lambda t: lr.resolve(sched, t))
    assert_same(ours, theirs)


def test_set_lr_updates_the_adamw_shrink() -> None:
    """Upstream baked 1 - lr*wd as a literal for a numeric LR, so set_lr left the decay at
    the old LR. Here the shrink is always a per-step input."""
    config = optim.AdamW(0.05, weight_decay=0.5)

    def lr_at(t: int) -> float:
        return 0.05 if t <= 10 else 0.01

    ours = run_ours(config, lr_at=lambda t: lr.rebase(lr_at(t), t))
    theirs = run_torch(lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.5),
                       lr_at=lr_at)
    assert_same(ours, theirs)
    _, _, _, plan = build(config)
    assert plan.host_scalars(0.01, 11)[optim.ADAM_SHRINK] == pytest.approx(1 - 0.01 * 0.5)


def test_set_lr_schedule_keeps_the_global_bias_correction_step() -> None:
    config = optim.Adam(0.05)
    _, _, _, plan = build(config)
    rebased = lr.rebase(lr.linear(0.02, 0.0, 10), 11)
    got = plan.host_scalars(rebased, 11)[optim.ADAM_LRT]
    want = lr.resolve(lr.linear(0.02, 0.0, 10), 1) * np.sqrt(1 - 0.999 ** 11) / (1 - 0.9 ** 11)
    assert got == pytest.approx(want)


def test_split_moments_match_packed() -> None:
    """Params whose packed [2, ...] state would not fit one binding keep m and v apart."""
    config = optim.AdamW(0.05, weight_decay=0.1, clip_grad_norm=1.0)
    tiny = DeviceLimits(max_storage_buffer_binding_size=64, max_buffer_size=64)
    graph, _, _, plan = build(config, limits=tiny)
    assert sorted(plan.states) == ["adam_m_p1", "adam_mv_p2", "adam_v_p1"]
    assert sum(n.op == "adam_moments" for n in graph.nodes) == 3
    np.testing.assert_allclose(run_ours(config, limits=tiny)[0]["p1"],
                               run_ours(config)[0]["p1"], rtol=1e-12)


def test_adam_eps_sits_outside_the_bias_correction() -> None:
    config = optim.Adam(0.1, beta1=0.5, beta2=0.75, eps=0.5)
    graph, _, grads, plan = build(config)
    feeds = {"p1": P1, "p2": P2, "x": XS[0], "y": YS[0], **plan.host_scalars(config, 1)}
    values = evaluate(graph, feeds, float_dtype=np.float64)
    g = values[grads["p1"]]
    m, v = 0.5 * g, 0.25 * g * g
    lrt = 0.1 * np.sqrt(1 - 0.75) / (1 - 0.5)
    new_p1 = next(values[wb.source] for wb in plan.writebacks if wb.dest == "p1")
    np.testing.assert_allclose(new_p1, P1 - lrt * m / (np.sqrt(v) + 0.5), rtol=1e-12)


# ---- plan structure and configuration errors ------------------------------------------------

def test_writebacks_and_hidden_inputs() -> None:
    _, _, _, plain = build(optim.SGD(0.1))
    assert [(w.dest, w.kind) for w in plain.writebacks] == [("p1", "param"), ("p2", "param")]
    assert plain.scalar_inputs == (optim.SGD_LR,) and plain.states == ()
    graph, _, _, mom = build(optim.SGD(0.1, momentum=0.9))
    assert [w.dest for w in mom.writebacks if w.kind == "state"] == ["sgd_v_p1", "sgd_v_p2"]
    assert graph.states["sgd_v_p1"].attrs["init"] == 0.0
    _, _, _, adam = build(optim.Adam(0.1))
    assert adam.scalar_inputs == (optim.ADAM_LRT,)
    _, _, _, adamw = build(optim.AdamW(0.1, weight_decay=0.1))
    assert adamw.scalar_inputs == (optim.ADAM_LRT, optim.ADAM_SHRINK)
    assert adamw.decayed == ("p1", "p2")
    _, _, _, none = build(optim.AdamW(0.1, weight_decay=0.0))
    assert none.scalar_inputs == (optim.ADAM_LRT,) and none.decayed == ()
    graph, _, _, _ = build(optim.Adam(0.1))
    assert sum(n.op in oo.__all__ for n in graph.nodes) == 4  # two kernels per param
    assert "adam" in str(adam) and "-> param 'p1'" in str(adam)


def test_update_ops_are_not_differentiable() -> None:
    graph, _, _, plan = build(optim.Adam(0.1))
    new_p1 = next(w.source for w in plan.writebacks if w.dest == "p1")
    with tracing(graph, capture=False):
        out = tg.sum(tg.Tensor(graph, new_p1))
    with pytest.raises(ShapeError, match="adam_update_p: cannot differentiate"):
        append_grad(graph, out.id)


def test_host_scalars() -> None:
    _, _, _, plan = build(optim.AdamW(lr.linear(0.1, 0.0, 10), weight_decay=0.2))
    got = plan.host_scalars(plan.config, 3)
    lr3 = lr.resolve(lr.linear(0.1, 0.0, 10), 3)
    assert got == pytest.approx({optim.ADAM_LRT: lr3 * np.sqrt(1 - 0.999 ** 3) / (1 - 0.9 ** 3),
                                 optim.ADAM_SHRINK: 1 - lr3 * 0.2})
    assert plan.host_scalars(0.5, 1) == plan.host_scalars(optim.AdamW(0.5, weight_decay=0.2), 1)
    with pytest.raises(ValueError, match="in more than lr; only the LR can change"):
        plan.host_scalars(optim.AdamW(0.5, weight_decay=0.3), 1)
    with pytest.raises(ValueError, match="step t is 1-based, got 0"):
        plan.host_scalars(0.1, 0)
    _, _, _, sgd = build(optim.SGD(lr.staircase(1.0, 2, 0.5)))
    assert sgd.host_scalars(sgd.config, 3) == {optim.SGD_LR: 0.5}


def test_config_dicts_round_trip() -> None:
    import json
    configs = [optim.Adam(lr.warmup(0.1, 3, 0.05), clip_grad_norm=1.0, normalize_grads="*.w"),
               optim.AdamW(0.1, weight_decay=0.3, decay_filter="p1"),
               optim.SGD(lr.multi_step(0.1, [3], 0.5), momentum=0.9, nesterov=True)]
    for config in configs:
        data = json.loads(json.dumps(config.to_dict()))
        assert optim.from_dict(data) == config


def test_callable_filter_survives_only_as_a_marker() -> None:
    config = optim.AdamW(0.1, decay_filter=lambda n: n == "p1")
    data = config.to_dict()
    assert data["decay_filter"] == optim.CALLABLE_MARK
    back = optim.from_dict(data)
    _, _, _, plan = build(config)
    assert plan.decayed == ("p1",)
    assert plan.host_scalars(back, 2) == plan.host_scalars(config, 2)
    with pytest.raises(ValueError, match="decay_filter was a callable that did not survive"):
        build(back)


def test_bad_configs_raise() -> None:
    with pytest.raises(ValueError, match="nesterov=True needs momentum > 0, got momentum=0"):
        optim.SGD(0.1, nesterov=True)
    with pytest.raises(ValueError, match="SGD: momentum must be >= 0"):
        optim.SGD(0.1, momentum=-0.5)
    with pytest.raises(ValueError, match=r"Adam: beta2 must be < 1.0"):
        optim.Adam(0.1, beta2=1.0)
    with pytest.raises(ValueError, match="clip_grad_norm must be > 0"):
        optim.Adam(0.1, clip_grad_norm=0.0)
    with pytest.raises(TypeError, match="Adam: lr must be a number"):
        optim.Adam("fast")
    with pytest.raises(TypeError, match="normalize_grads must be True, False, a glob"):
        optim.Adam(0.1, normalize_grads=3)
    with pytest.raises(ValueError, match="unknown optimizer kind 'lamb'"):
        optim.from_dict({"kind": "lamb", "lr": 0.1})


def test_filters_and_names_checked_at_append() -> None:
    with pytest.raises(ValueError, match=r"normalize_grads='\*.bias' matches none of the "
                                         r"params \['p1', 'p2'\]"):
        build(optim.Adam(0.1, normalize_grads="*.bias"))
    with pytest.raises(ValueError, match="matches none"):
        build(optim.Adam(0.1, normalize_grads=lambda n: False))
    with pytest.raises(ValueError, match=r"decay flags for unknown params \['p3'\]"):
        build(optim.AdamW(0.1), {"p3": True})
    _, _, _, plan = build(optim.Adam(0.1, normalize_grads="p?"))
    assert plan.normalized == ("p1", "p2")
    graph, _, grads, _ = build(optim.SGD(0.1))
    with pytest.raises(ValueError, match="gradient given for 'q', which is not a param"):
        optim.append_optimizer(graph, {"q": grads["p1"]}, optim.SGD(0.1))
    with pytest.raises(ValueError, match=r"param 'p2' is f32\[3\] but its gradient"):
        optim.append_optimizer(graph, {"p2": grads["p1"]}, optim.SGD(0.1))
    with pytest.raises(TypeError, match="expected an optim.Adam, AdamW or SGD config"):
        optim.append_optimizer(graph, grads, {"kind": "sgd", "lr": 0.1})


def test_no_grads_appends_nothing() -> None:
    with tracing() as st:
        leaf("param", "p", (2,))
    plan = optim.append_optimizer(st.graph, {}, optim.Adam(0.1, normalize_grads=True))
    assert plan.writebacks == () and plan.scalar_inputs == () and len(st.graph.nodes) == 1


def test_a_none_flag_leaves_the_choice_to_the_filter() -> None:
    _, _, _, plan = build(optim.AdamW(0.1, decay_filter="p2"), {"p1": None, "p2": None})
    assert plan.decayed == ("p2",)
    _, _, _, plan = build(optim.SGD(0.1, weight_decay=0.1, decay_filter=False), {"p1": True})
    assert plan.decayed == ("p1",)


@pytest.mark.parametrize("shapes, expect", [
    (((), ()), 2),     # one gradient node for both params: both occurrences are copied
    (((), (1,)), 1),   # the 0-d param's gradient is summed from the other's: it is copied
    (((3,), (4,)), 0),
])
def test_arena_members_the_plan_cannot_place_are_copied(shapes, expect) -> None:
    from tensorgrad.compiler import Options, Request, compile_graph
    from tests.fuzz_graphs import FuzzModel, Program, fuzz_loss

    steps = (("add", (0, 1, 0, 0)),) if shapes[0] == shapes[1] or shapes[1] == (1,) else \
        (("sum", (0, 0, 0, 0)), ("sum", (1, 0, 0, 0)), ("add", (2, 3, 0, 0)))
    model = FuzzModel(Program(shapes, steps))
    c = compile_graph(Request("training", model, fuzz_loss, {}, optimizer=optim.SGD(lr=0.1),
                              seed=0), Options(), until="plan")   # plans without a PlanError
    assert sum(n.op == "copy" for n in c.graph.nodes) == expect


def test_an_optimizer_is_one_class_appending_its_own_update() -> None:
    """A new config class is all an optimizer needs: subclassing registers its kind (plain
    data over the worker protocol), append_optimizer and the plan call its own methods."""
    from dataclasses import dataclass
    from typing import ClassVar

    from tensorgrad.update import CONFIGS, OptimizerConfig

    @dataclass(frozen=True)
    class HalfSGD(OptimizerConfig):
        lr: Any
        clip_grad_norm: float | None = None
        normalize_grads: Any = False
        kind: ClassVar[str] = "test_half_sgd"

        def append_update(self, a, decayed, limits):
            half = a.scalar("__half_lr")
            a.guard("sgd", [(n, [], [("lr", half)]) for n in a.grads],
                    {"momentum": 0.0, "nesterov": False, "weight_decay": 0.0})
            for n, g in a.grads.items():
                a.write(oo.sgd_update_p(a.params[n], half, g, None, momentum=0.0,
                                        nesterov=False, weight_decay=0.0, **a.scale(n)),
                        n, "param")
            return ("__half_lr",)

        def host_scalars(self, lr, t):
            return {"__half_lr": lr / 2}

    try:
        config = HalfSGD(0.05, clip_grad_norm=1.0)
        assert optim.CONFIGS["test_half_sgd"] is HalfSGD
        assert optim.from_dict(config.to_dict()) == config
        theirs = run_torch(lambda ps: torch.optim.SGD(ps, lr=0.025), clip=1.0)
        for arena in (False, True):
            assert_same(run_ours(config, arena=arena), theirs)
        _, _, _, plan = build(config, arena=True)
        assert plan.scalar_inputs == ("__half_lr",) and plan.status is not None
        assert plan.host_scalars(0.2, 3) == {"__half_lr": 0.1}
        with pytest.raises(ValueError, match=r"optimizer kind 'test_half_sgd' is taken by "
                           r".*HalfSGD"):
            type("Other", (HalfSGD,), {"kind": "test_half_sgd"})
    finally:
        CONFIGS.pop("test_half_sgd", None)


def test_a_config_without_its_update_cannot_be_made() -> None:
    from dataclasses import dataclass
    from typing import ClassVar

    from tensorgrad.update import CONFIGS, OptimizerConfig

    @dataclass(frozen=True)
    class NoUpdate(OptimizerConfig):
        lr: float
        kind: ClassVar[str] = "test_no_update"

    try:
        with pytest.raises(TypeError, match="abstract methods? .*append_update"):
            NoUpdate(0.1)
    finally:
        CONFIGS.pop("test_no_update", None)


class _Decays(tg.Module):
    def __init__(self) -> None:
        self.l1 = tg.Linear(2, 3)
        self.l2 = tg.Linear(3, 1)
        self.kept = tg.Linear(3, 3, decay=False)    # flags given: they win over any filter
        self.forced = self.param((3,), init=tg.init.zeros(), decay=True)


def _decayed(optimizer: optim.OptimizerConfig) -> list[str]:
    from tensorgrad.compiler import Options, Request, compile_graph

    def loss(m: _Decays, x: tg.Tensor) -> tg.Tensor:
        return tg.mean(m.l2(m.kept(tg.relu(m.l1(x))) + m.forced))

    c = compile_graph(Request("training", _Decays(), loss, {"x": (4, 2)}, optimizer=optimizer,
                              seed=0), Options(), until="optimizer")
    return sorted(c.optimizer.decayed)


@pytest.mark.parametrize("make", [
    lambda f: optim.AdamW(lr=1e-3, weight_decay=0.1, decay_filter=f),
    lambda f: optim.SGD(lr=1e-3, weight_decay=0.1, decay_filter=f)], ids=["adamw", "sgd"])
def test_decay_filter_decides_for_the_params_declared_without_a_flag(make) -> None:
    """Module params without a decay flag follow decay_filter (they all carried their init's
    default flag, so a filter was silently ignored); flags given at declaration win."""
    flagged = ["forced"]   # decay=True given; kept.* have decay=False given
    assert _decayed(make(True)) == sorted(["l1.W", "l2.W", *flagged])   # by init: weights
    assert _decayed(make(False)) == flagged
    assert _decayed(make("l2.*")) == sorted(["l2.W", "l2.b", *flagged])
    # Linear's decay= flags its W only: kept.b has no flag, so the filter decides for it
    assert _decayed(make("*.b")) == sorted(["l1.b", "l2.b", "kept.b", *flagged])
    assert _decayed(make(lambda name: name == "l1.W")) == sorted(["l1.W", *flagged])
