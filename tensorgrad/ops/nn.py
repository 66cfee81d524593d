"""Composite neural-network ops: rotary position embedding, losses, captures.

None of these defines a primitive: they compose the reduction, shape, indexing and
elementwise families, so their gradients come from those ops' rules.

The losses pick each target's log-probability with a one-hot mask that skips targets equal
to `ignore_index` (the one_hot primitive's attr, which also lets the bound check of inputs
accept that value): `where(one_hot(targets, V), log_probs, 0)` summed over the classes, an
elementwise product fused into the reduction that reads it. 'mean' divides by the count of
targets other than `ignore_index` (one more small reduction over the targets).
"""

from __future__ import annotations

import math

from ..errors import ShapeError, TraceError
from ..tensor import Tensor, current_trace
from .elementwise import add, cos, div, exp, full, greater, less, mul, mul_scalar, neg, sin, where
from .index import I32_RANGE, arange
from .reduce import log_softmax
from .reduce import sum as reduce_sum
from .registry import public, record
from .rules import is_int, require_dtype
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

IGNORE_INDEX = -100  # PyTorch's default


def _check_loss(op: str, scores: tuple[str, Tensor], targets: Tensor, reduction: str,
                ignore_index: int) -> None:
    """Check a loss's arguments: `scores` ('logits' or 'log_probs', tensor) [..., V] f32,
    i32 `targets` [...], the reduction and an i32 ignore_index."""
    if reduction not in REDUCTIONS:
        raise ShapeError(op, f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not is_int(ignore_index) or not I32_RANGE[0] <= ignore_index <= I32_RANGE[1]:
        raise ShapeError(op, f"ignore_index must be an int in {I32_RANGE[0]}..{I32_RANGE[1]} "
                         f"(targets are i32), got {ignore_index!r}")
    name, x = scores
    for what, t in ((name, x), ("targets", targets)):
        if not isinstance(t, Tensor):
            raise ShapeError(op, f"{what} must be a Tensor, got {type(t).__name__}")
    require_dtype(op, targets.node, "i32", what="targets")
    require_dtype(op, x.node, "f32", what=name)
    if x.ndim < 1 or x.shape[:-1] != targets.shape:
        raise ShapeError(op, f"targets {list(targets.shape)} must be the shape of {name} "
                         f"{list(x.shape)} without its last axis (classes)")


def _counted(targets: Tensor, ignore_index: int) -> Tensor:
    """f32 0-d: how many targets differ from ignore_index."""
    ignore, one, zero = full((), ignore_index, "i32"), full((), 1.0), full((), 0.0)
    kept = where(less(targets, ignore), one, where(greater(targets, ignore), one, zero))
    return reduce_sum(kept)


@public
def nll_loss(log_probs: Tensor, targets: Tensor, reduction: str = "mean",
             ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Negative log-likelihood of i32 `targets` [...] under `log_probs` [..., V], as
    torch.nn.functional.nll_loss: -log_probs[..., target] per position, 0 where the target
    equals `ignore_index` (default -100; a class 0..V - 1 too), then 'mean' (0-d: the sum
    over the targets not ignored divided by their count, nan when every target is ignored,
    with zero gradients), 'sum' (0-d) or 'none' ([...]). Targets from an input must lie in
    0..V - 1 or equal ignore_index: any other value fails the step or run, naming it. A
    computed target out of range contributes 0 (and is counted by 'mean')."""
    _check_loss("nll_loss", ("log_probs", log_probs), targets, reduction, ignore_index)
    hot = record("one_hot", [reshape(targets, (*targets.shape, 1))],
                 depth=log_probs.shape[-1], dtype="bool", ignore_index=ignore_index)
    # where, not a product with a 0/1 mask: a -inf log-probability of another class stays
    # out of the sum, and the gradient of an all-ignored 'mean' (1/0) stays 0, as in torch;
    # an ignored position sums zeros only (+0, as torch gives)
    per = reduce_sum(where(hot, neg(log_probs), 0.0), -1)
    if reduction == "none":
        return per
    total = per if per.ndim == 0 else reduce_sum(per)
    return total if reduction == "sum" else div(total, _counted(targets, ignore_index))


@public
def cross_entropy(logits: Tensor, targets: Tensor, reduction: str = "mean",
                  ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Softmax cross-entropy of raw `logits` [..., V] against i32 `targets` [...], as
    torch.nn.functional.cross_entropy: nll_loss(log_softmax(logits, -1), targets,
    reduction, ignore_index) (targets equal to ignore_index, default -100, e.g. padding,
    add 0 and get no gradient; 'mean' divides by the count of the others)."""
    _check_loss("cross_entropy", ("logits", logits), targets, reduction, ignore_index)
    return nll_loss(log_softmax(logits, -1), targets, reduction, ignore_index)


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
