"""Learning-rate schedules: plain data, so they cross the worker boundary as dicts.

An LR is a Python number (a constant) or one of the schedules below. Steps are 1-based: the
runtime resolves the LR for step t (t = 1 on the first step) with :func:`resolve`. Each
schedule carries `start_step` (None: not set, which counts as 0); the schedule sees the local
step ``s = max(1, step - start_step)``.

* ``constant(value)``: value.
* ``linear(peak, final, steps)``: ``peak + (final - peak) * min(s / steps, 1)`` (so s = 1 is
  already one increment away from `peak`).
* ``cosine_annealing(peak, final, steps)``: ``final + (peak - final) * (1 + cos(pi f)) / 2``
  with ``f = min(s / steps, 1)``.
* ``warmup(peak, steps, after)``: ``peak * s / steps`` while ``s <= steps``, then
  ``resolve(after, s - steps)`` (the nested LR runs on its own timeline).
* ``staircase(peak, every, gamma)``: ``peak * gamma ** ((s - 1) // every)``.
* ``multi_step(peak, milestones, gamma)``: ``peak * gamma ** (number of milestones m <= s)``.

:func:`rebase` restarts a schedule at a given step (what ``set_lr`` does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any


def _check_number(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return float(value)


def _check_rate(what: str, value: Any) -> float:
    """A learning rate: a finite number >= 0."""
    rate = _check_number(what, value)
    if rate < 0:
        raise ValueError(f"{what} must be >= 0 (a learning rate), got {value!r}")
    return rate


def _check_steps(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def _check_start(kind: str, start: Any) -> None:
    if start is not None and (isinstance(start, bool) or not isinstance(start, int)
                              or start < 0):
        raise ValueError(f"lr.{kind}: start_step must be None or an int >= 0, got {start!r}")


@dataclass(frozen=True)
class Constant:
    """A constant LR as a schedule (a plain number means the same)."""

    value: float
    start_step: int | None = None
    kind = "constant"

    def __post_init__(self) -> None:
        _check_rate("lr.constant: value", self.value)
        _check_start(self.kind, self.start_step)

    def at(self, s: int) -> float:
        """The LR at local step `s` (1-based): `value`."""
        return float(self.value)


@dataclass(frozen=True)
class Linear:
    """Linear from `peak` to `final` over `steps` steps, then `final`."""

    peak: float
    final: float
    steps: int
    start_step: int | None = None
    kind = "linear"

    def __post_init__(self) -> None:
        _check_rate("lr.linear: peak", self.peak)
        _check_rate("lr.linear: final", self.final)
        _check_steps("lr.linear: steps", self.steps)
        _check_start(self.kind, self.start_step)

    def at(self, s: int) -> float:
        """The LR at local step `s` (1-based): ``peak + (final - peak) * min(s / steps, 1)``."""
        f = min(s / self.steps, 1.0)
        return self.peak + (self.final - self.peak) * f


@dataclass(frozen=True)
class CosineAnnealing:
    """Half a cosine from `peak` down to `final` over `steps` steps, then `final`."""

    peak: float
    final: float
    steps: int
    start_step: int | None = None
    kind = "cosine_annealing"

    def __post_init__(self) -> None:
        _check_rate("lr.cosine_annealing: peak", self.peak)
        _check_rate("lr.cosine_annealing: final", self.final)
        _check_steps("lr.cosine_annealing: steps", self.steps)
        _check_start(self.kind, self.start_step)

    def at(self, s: int) -> float:
        """The LR at local step `s` (1-based): ``final + (peak - final) * (1 + cos(pi f)) / 2``
        with ``f = min(s / steps, 1)``."""
        f = min(s / self.steps, 1.0)
        return self.final + 0.5 * (self.peak - self.final) * (1.0 + math.cos(math.pi * f))


@dataclass(frozen=True)
class Warmup:
    """Linear warmup to `peak` over `steps` steps, then the LR `after` from its step 1."""

    peak: float
    steps: int
    after: LR
    start_step: int | None = None
    kind = "warmup"

    def __post_init__(self) -> None:
        _check_rate("lr.warmup: peak", self.peak)
        _check_steps("lr.warmup: steps", self.steps)
        _check_lr("lr.warmup: after", self.after)
        _check_start(self.kind, self.start_step)

    def at(self, s: int) -> float:
        """The LR at local step `s` (1-based): ``peak * s / steps`` up to `steps`, then the
        LR `after` at step ``s - steps``."""
        if s <= self.steps:
            return self.peak * s / self.steps
        return resolve(self.after, s - self.steps)


@dataclass(frozen=True)
class Staircase:
    """`peak` times `gamma` every `every` steps (PyTorch StepLR's boundaries)."""

    peak: float
    every: int
    gamma: float
    start_step: int | None = None
    kind = "staircase"

    def __post_init__(self) -> None:
        _check_rate("lr.staircase: peak", self.peak)
        _check_steps("lr.staircase: every", self.every)
        _check_number("lr.staircase: gamma", self.gamma)
        _check_start(self.kind, self.start_step)

    def at(self, s: int) -> float:
        """The LR at local step `s` (1-based): ``peak * gamma ** ((s - 1) // every)``."""
        return self.peak * self.gamma ** ((s - 1) // self.every)


@dataclass(frozen=True)
class MultiStep:
    """`peak` times `gamma` once for each milestone already reached (s >= milestone)."""

    peak: float
    milestones: tuple[int, ...]
    gamma: float
    start_step: int | None = None
    kind = "multi_step"

    def __post_init__(self) -> None:
        _check_rate("lr.multi_step: peak", self.peak)
        object.__setattr__(self, "milestones", tuple(self.milestones))
        for m in self.milestones:
            _check_steps("lr.multi_step: each milestone", m)
        if list(self.milestones) != sorted(self.milestones):
            raise ValueError(f"lr.multi_step: milestones must be increasing, got "
                             f"{list(self.milestones)}")
        _check_number("lr.multi_step: gamma", self.gamma)
        _check_start(self.kind, self.start_step)

    def at(self, s: int) -> float:
        """The LR at local step `s` (1-based): `peak` times `gamma` per milestone <= s."""
        return self.peak * self.gamma ** sum(1 for m in self.milestones if s >= m)


Schedule = Constant | Linear | CosineAnnealing | Warmup | Staircase | MultiStep
"""Any of the schedule classes."""
LR = float | Schedule
"""A learning rate: a number (constant) or a schedule."""
SCHEDULES: dict[str, type] = {c.kind: c for c in
                              (Constant, Linear, CosineAnnealing, Warmup, Staircase, MultiStep)}


def _check_lr(what: str, value: Any) -> None:
    if isinstance(value, tuple(SCHEDULES.values())):
        return
    _check_rate(what, value)


def constant(value: float, *, start_step: int | None = None) -> Constant:
    """A constant LR `value` (a plain number does the same)."""
    return Constant(value, start_step)


def linear(peak: float, final: float, steps: int, *, start_step: int | None = None) -> Linear:
    """From `peak` linearly to `final` over `steps` steps, then `final` (:class:`Linear`)."""
    return Linear(peak, final, steps, start_step)


def cosine_annealing(peak: float, final: float, steps: int, *,
                     start_step: int | None = None) -> CosineAnnealing:
    """Half a cosine from `peak` down to `final` over `steps` steps, then `final`
    (:class:`CosineAnnealing`)."""
    return CosineAnnealing(peak, final, steps, start_step)


def warmup(peak: float, steps: int, after: LR, *, start_step: int | None = None) -> Warmup:
    """Linear warmup from 0 to `peak` over `steps` steps, then the LR `after` (a number or
    a schedule, on its own timeline from its step 1) (:class:`Warmup`)."""
    return Warmup(peak, steps, after, start_step)


def staircase(peak: float, every: int, gamma: float, *,
              start_step: int | None = None) -> Staircase:
    """`peak` multiplied by `gamma` every `every` steps, as PyTorch's StepLR
    (:class:`Staircase`)."""
    return Staircase(peak, every, gamma, start_step)


def multi_step(peak: float, milestones: list[int] | tuple[int, ...], gamma: float, *,
               start_step: int | None = None) -> MultiStep:
    """`peak` multiplied by `gamma` at each of the `milestones` (steps): step s uses
    ``peak * gamma ** (number of milestones <= s)``, as the upstream library's multiStep
    (:class:`MultiStep`). That is PyTorch's MultiStepLR one step ahead: its LR after s
    ``scheduler.step()`` calls, so the step at a milestone already uses the decayed LR."""
    return MultiStep(peak, tuple(milestones), gamma, start_step)


def is_schedule(lr: LR) -> bool:
    """True for a schedule (anything but a plain number), even a `constant` one."""
    return isinstance(lr, tuple(SCHEDULES.values()))


def resolve(lr: LR, step: int) -> float:
    """The LR for 1-based `step`."""
    if not is_schedule(lr):
        return _check_number("lr", lr)
    s = max(1, step - (lr.start_step or 0))  # type: ignore[union-attr]
    return float(lr.at(s))  # type: ignore[union-attr]


def rebase(lr: LR, base: int) -> LR:
    """`lr` restarted so that step `base` is its step 1; numbers and schedules with an
    explicit `start_step` are returned unchanged. ``set_lr`` uses ``base = t + 1``."""
    _check_lr("lr", lr)
    if not is_schedule(lr) or lr.start_step is not None:  # type: ignore[union-attr]
        return lr
    return replace(lr, start_step=base - 1)  # type: ignore[type-var]


def to_dict(lr: LR) -> float | dict[str, Any]:
    """Plain data for `lr`: a number stays a number; a schedule becomes a dict with `kind`."""
    if not is_schedule(lr):
        return _check_number("lr", lr)
    out: dict[str, Any] = {"kind": lr.kind}  # type: ignore[union-attr]
    for f in fields(lr):  # type: ignore[arg-type]
        value = getattr(lr, f.name)
        if f.name == "after":
            value = to_dict(value)
        elif f.name == "milestones":
            value = list(value)
        out[f.name] = value
    return out


def from_dict(data: object) -> LR:
    """Inverse of :func:`to_dict` (plain data, checked: a number, or a dict with `kind`)."""
    if not isinstance(data, dict):
        return _check_number("lr", data)
    kind = data.get("kind")
    if kind not in SCHEDULES:
        raise ValueError(f"unknown lr schedule kind {kind!r} (known: {sorted(SCHEDULES)})")
    args = {k: v for k, v in data.items() if k != "kind"}
    if "after" in args:
        args["after"] = from_dict(args["after"])
    return SCHEDULES[kind](**args)


__all__ = ["LR", "Constant", "CosineAnnealing", "Linear", "MultiStep", "Schedule", "Staircase",
           "Warmup", "constant", "cosine_annealing", "from_dict", "is_schedule",
           "linear", "multi_step", "rebase", "resolve", "staircase", "to_dict", "warmup"]
