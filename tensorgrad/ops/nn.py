"""Composite neural-network ops: rotary position embedding, losses, captures.

None of these defines a primitive: they compose the reduction, shape, indexing and
elementwise families, so their gradients come from those ops' rules.
"""

from __future__ import annotations

import math

from ..errors import ShapeError, TraceError
from ..tensor import Tensor, current_trace
from .elementwise import add, cos, exp, mul, mul_scalar, neg, sin
from .index import arange, one_hot
from .reduce import log_softmax, mean
from .reduce import sum as reduce_sum
from .registry import public
from .rules import require_dtype
from .shape import concat, narrow, reshape

REDUCTIONS = ("mean", "sum", "none")


# ---- rope ------------------------------------------------------------------------------

def _check_rope(q: Tensor, k: Tensor) -> tuple[int, int]:
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor):
            raise ShapeError("rope", f"{name} must be a Tensor, got {type(t).__name__}")
        require_dtype("rope", t.node, "f32", what=name)
        if t.ndim < 2:
            raise ShapeError("rope", f"{name} must have rank >= 2 ([..., T, D]), got shape "
                             f"{list(t.shape)}")
    if q.shape[-2:] != k.shape[-2:]:
        raise ShapeError("rope", f"q {list(q.shape)} and k {list(k.shape)} must share T "
                         "(axis -2) and D (axis -1)")
    t_len, dim = q.shape[-2:]
    if dim % 2:
        raise ShapeError("rope", f"D (axis -1) must be even, got {dim} (q {list(q.shape)})")
    return t_len, dim


def _rotate_half(x: Tensor, half: int) -> Tensor:
    """concat([-x[..., half:], x[..., :half]], -1)."""
    return concat([neg(narrow(x, -1, half, half)), narrow(x, -1, 0, half)], -1)


@public
def rope(q: Tensor, k: Tensor, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """Rotary position embedding of q and k [..., T, D] (D even), rotate-half convention,
    positions 0..T-1: x' = x cos(t f_i) + rotate_half(x) sin(t f_i), f_i = base^(-2i/D)."""
    t_len, dim = _check_rope(q, k)
    half = dim // 2
    freqs = exp(mul_scalar(arange(half, "f32"), -math.log(base) / half))       # [half]
    angles = mul(reshape(arange(t_len, "f32"), (t_len, 1)), freqs)           # [T, half]
    c, s = cos(angles), sin(angles)
    cos_t, sin_t = concat([c, c], -1), concat([s, s], -1)                     # [T, D]
    return tuple(add(mul(x, cos_t), mul(_rotate_half(x, half), sin_t))  # type: ignore
                 for x in (q, k))


# ---- losses ----------------------------------------------------------------------------

def _reduce(per: Tensor, reduction: str) -> Tensor:
    if reduction == "none" or per.ndim == 0:
        return per
    return mean(per) if reduction == "mean" else reduce_sum(per)


@public
def nll_loss(log_probs: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of i32 `targets` [...] under `log_probs` [..., V]:
    -sum(log_probs * one_hot(targets, V), -1) per position, then 'mean' (0-d, over all
    positions), 'sum' (0-d) or 'none' ([...]). Out-of-range targets contribute 0 but are
    still counted by 'mean'."""
    if reduction not in REDUCTIONS:
        raise ShapeError("nll_loss", f"reduction must be one of {REDUCTIONS}, got "
                         f"{reduction!r}")
    for name, t in (("log_probs", log_probs), ("targets", targets)):
        if not isinstance(t, Tensor):
            raise ShapeError("nll_loss", f"{name} must be a Tensor, got {type(t).__name__}")
    require_dtype("nll_loss", targets.node, "i32", what="targets")
    require_dtype("nll_loss", log_probs.node, "f32", what="log_probs")
    if log_probs.ndim < 1 or log_probs.shape[:-1] != targets.shape:
        raise ShapeError("nll_loss", f"targets {list(targets.shape)} must be the shape of "
                         f"log_probs {list(log_probs.shape)} without its last axis (classes)")
    picked = reduce_sum(mul(log_probs, one_hot(targets, log_probs.shape[-1])), -1)
    return _reduce(mul_scalar(picked, -1.0), reduction)


@public
def cross_entropy(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy of raw `logits` [..., V] against i32 `targets` [...]
    = nll_loss(log_softmax(logits, -1), targets, reduction)."""
    if reduction not in REDUCTIONS:
        raise ShapeError("cross_entropy", f"reduction must be one of {REDUCTIONS}, got "
                         f"{reduction!r}")
    for name, t in (("logits", logits), ("targets", targets)):
        if not isinstance(t, Tensor):
            raise ShapeError("cross_entropy", f"{name} must be a Tensor, got "
                             f"{type(t).__name__}")
    require_dtype("cross_entropy", targets.node, "i32", what="targets")
    require_dtype("cross_entropy", logits.node, "f32", what="logits")
    if logits.ndim < 1 or logits.shape[:-1] != targets.shape:
        raise ShapeError("cross_entropy", f"targets {list(targets.shape)} must be the shape "
                         f"of logits {list(logits.shape)} without its last axis (classes)")
    return nll_loss(log_softmax(logits, -1), targets, reduction)


# ---- capture ---------------------------------------------------------------------------

@public
def capture(name: str, t: Tensor) -> Tensor:
    """Return `t`, recording it under `name` in the graph's captures so its value can be
    read after a step or run (only while the user's forward is traced)."""
    state = current_trace("capture")
    if not isinstance(name, str) or not name:
        raise ShapeError("capture", f"name must be a non-empty str, got {name!r}")
    if not isinstance(t, Tensor):
        raise ShapeError("capture", f"'{name}': expected a Tensor, got {type(t).__name__}")
    if t.graph is not state.graph:
        raise TraceError(f"capture '{name}' got a tensor from another trace")
    if not state.capture_enabled:
        return t
    if name in state.graph.captures:
        raise TraceError(f"duplicate capture name '{name}' (each capture in a trace needs "
                         "its own name)")
    state.graph.captures[name] = t.id
    return t


__all__ = ["capture", "cross_entropy", "nll_loss", "rope"]
