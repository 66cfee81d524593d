"""LR schedules: formulas against PyTorch's schedulers, rebasing, plain-data round trips.

Offsets. Our steps are 1-based and step s uses ``resolve(lr, s)``. PyTorch's scheduler value
after e calls of ``scheduler.step()`` is "lr at epoch e"; the s-th optimizer step runs at
e = s - 1. Our formulas follow the upstream library, so:

* ``linear``, ``cosine_annealing``, ``multi_step``: ours at s == PyTorch at e = s (one step
  ahead: the first step already uses the first decayed value);
* ``staircase``, ``warmup``: ours at s == PyTorch at e = s - 1 (StepLR's boundaries).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from tensorgrad import lr

PEAK = 0.1


def torch_lrs(make_scheduler, epochs: int) -> list[float]:
    """PyTorch's LR at epochs 0..epochs (after e calls of scheduler.step())."""
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=PEAK)
    sched = make_scheduler(opt)
    out = [opt.param_groups[0]["lr"]]
    for _ in range(epochs):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def ours(schedule: lr.LR, steps: int) -> list[float]:
    return [lr.resolve(schedule, s) for s in range(1, steps + 1)]


def test_numbers_are_constants() -> None:
    assert lr.resolve(0.5, 1) == 0.5
    assert lr.resolve(3, 100) == 3.0
    assert ours(lr.constant(0.2), 3) == [0.2, 0.2, 0.2]


def test_linear_matches_linear_lr() -> None:
    sched = lr.linear(PEAK, 0.01, 10)
    want = torch_lrs(lambda o: torch.optim.lr_scheduler.LinearLR(
        o, start_factor=1.0, end_factor=0.1, total_iters=10), 15)
    assert ours(sched, 15) == pytest.approx(want[1:16], rel=1e-9)
    assert lr.resolve(sched, 1) == pytest.approx(PEAK + (0.01 - PEAK) / 10)  # already moved


def test_cosine_matches_cosine_annealing_lr() -> None:
    sched = lr.cosine_annealing(PEAK, 0.001, 12)
    want = torch_lrs(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(
        o, T_max=12, eta_min=0.001), 12)
    assert ours(sched, 12) == pytest.approx(want[1:13], rel=1e-9)
    # PyTorch's cosine rises again after T_max; ours stays at `final`.
    assert ours(sched, 20)[12:] == pytest.approx([0.001] * 8)


def test_staircase_matches_step_lr() -> None:
    sched = lr.staircase(PEAK, 4, 0.5)
    want = torch_lrs(lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5), 20)
    assert ours(sched, 20) == pytest.approx(want[0:20], rel=1e-9)
    assert ours(sched, 5) == pytest.approx([PEAK] * 4 + [PEAK / 2])


def test_multi_step_matches_multi_step_lr() -> None:
    sched = lr.multi_step(PEAK, [3, 7, 8], 0.1)
    want = torch_lrs(lambda o: torch.optim.lr_scheduler.MultiStepLR(
        o, milestones=[3, 7, 8], gamma=0.1), 12)
    assert ours(sched, 12) == pytest.approx(want[1:13], rel=1e-9)


def test_warmup_matches_sequential_linear_then_step() -> None:
    sched = lr.warmup(PEAK, 5, lr.staircase(PEAK, 3, 0.5))

    def make(o):
        warm = torch.optim.lr_scheduler.LinearLR(o, start_factor=1 / 5, end_factor=1.0,
                                                 total_iters=4)
        after = torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)
        return torch.optim.lr_scheduler.SequentialLR(o, [warm, after], milestones=[5])

    want = torch_lrs(make, 20)
    assert ours(sched, 20) == pytest.approx(want[0:20], rel=1e-9)
    assert ours(sched, 6) == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.1, 0.1])


def test_warmup_runs_the_nested_schedule_on_its_own_timeline() -> None:
    inner = lr.linear(PEAK, 0.0, 10)
    sched = lr.warmup(PEAK, 4, inner)
    for k in range(1, 15):
        assert lr.resolve(sched, 4 + k) == lr.resolve(inner, k)
    assert lr.resolve(lr.warmup(0.3, 2, 0.05), 9) == 0.05


def test_start_step_shifts_and_clamps() -> None:
    sched = lr.linear(1.0, 0.0, 10, start_step=5)
    assert lr.resolve(sched, 6) == lr.resolve(lr.linear(1.0, 0.0, 10), 1)
    assert lr.resolve(sched, 2) == lr.resolve(lr.linear(1.0, 0.0, 10), 1)  # s = max(1, ...)


def test_rebase() -> None:
    sched = lr.cosine_annealing(1.0, 0.1, 8)
    assert lr.rebase(0.3, 11) == 0.3
    explicit = lr.linear(1.0, 0.0, 4, start_step=2)
    assert lr.rebase(explicit, 11) is explicit
    moved = lr.rebase(sched, 11)
    assert moved.start_step == 10 and sched.start_step is None
    assert ours(moved, 18)[10:] == ours(sched, 8)
    nested = lr.rebase(lr.warmup(1.0, 2, sched), 4)
    assert nested.start_step == 3 and nested.after.start_step is None


def test_set_lr_style_rebasing() -> None:
    """After 10 steps, set_lr(schedule) makes step 11 the schedule's step 1, while Adam's
    bias-correction step keeps counting globally (see test_optim)."""
    t = 10
    sched = lr.multi_step(0.2, [2, 4], 0.5)
    rebased = lr.rebase(sched, t + 1)
    assert [lr.resolve(rebased, t + k) for k in range(1, 7)] == ours(sched, 6)


@pytest.mark.parametrize("schedule", [
    lr.constant(0.1), lr.linear(0.1, 0.01, 5), lr.cosine_annealing(0.1, 0.0, 7, start_step=3),
    lr.warmup(0.1, 3, lr.linear(0.1, 0.0, 4)), lr.warmup(0.1, 3, 0.05),
    lr.staircase(0.1, 2, 0.9), lr.multi_step(0.1, [2, 5], 0.3)], ids=lambda s: s.kind)
def test_dict_round_trip(schedule: lr.Schedule) -> None:
    data = lr.to_dict(schedule)
    again = lr.from_dict(json.loads(json.dumps(data)))
    assert again == schedule
    assert ours(again, 12) == ours(schedule, 12)


def test_numbers_stay_numbers() -> None:
    assert lr.to_dict(0.25) == 0.25
    assert lr.from_dict(0.25) == 0.25
    assert not lr.is_schedule(0.25) and lr.is_schedule(lr.constant(0.25))


def test_bad_schedules_raise() -> None:
    with pytest.raises(ValueError, match="lr.linear: steps must be a positive int, got 0"):
        lr.linear(1.0, 0.0, 0)
    with pytest.raises(ValueError, match="milestones must be increasing"):
        lr.multi_step(1.0, [5, 3], 0.1)
    with pytest.raises(TypeError, match="lr.warmup: after must be a number"):
        lr.warmup(1.0, 3, "cosine")
    with pytest.raises(ValueError, match="start_step must be None or an int >= 0"):
        lr.staircase(1.0, 2, 0.5, start_step=-1)
    with pytest.raises(ValueError, match="unknown lr schedule kind 'exp'"):
        lr.from_dict({"kind": "exp"})
    with pytest.raises(ValueError, match="must be finite"):
        lr.resolve(math.nan, 1)
