"""Cancelling the awaiter of a call: a call still waiting for its turn never runs; a call
that has reached the GPU is completed and accounted (the step counter Adam's bias correction
reads, the PRNG counter, uploads, resets), whether or not anything still awaits it, so the
next steps give the bits of a run where nothing was cancelled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import tensorgrad as tg
from tests.models import DeepMLP
from tests.native.api_helpers import bits, run
from tests.native.deep_model import INPUTS, WIDTH, batch, compile_deep


@contextlib.asynccontextmanager
async def on_the_gpu(device: Any, call: asyncio.Future) -> AsyncIterator[None]:
    """Inside: the running call (the one just made) is held inside its GPU work, paused at
    its first wait for a submitted chunk; on leaving, it goes on. Holding it there makes the
    test the same on any machine: a fast GPU (lavapipe on many cores) can finish a whole step
    without the event loop ever seeing it busy."""
    reached, release = asyncio.Event(), asyncio.Event()
    wait = device._wait

    async def held_wait(done: Any, fence: Any) -> None:
        if not reached.is_set():
            reached.set()
            await release.wait()
        await wait(done, fence)

    device._wait = held_wait
    try:
        await asyncio.wait_for(reached.wait(), 60)
        assert not call.done(), "the call finished before it could be cancelled"
        yield
    finally:
        release.set()
        del device._wait


_reference: dict[str, Any] = {}


def reference(device: Any) -> dict[str, Any]:
    """Params and step counts of an uncancelled run: steps on batches 0, 1, 2."""
    if not _reference:
        async def go() -> None:
            train = await compile_deep(device)
            _reference["init"] = bits(await train.download_params())
            for k in range(3):
                assert (await train.step(**batch(k))).kind == "completed"
                _reference[k] = bits(await train.download_params())
            train.destroy()
        run(go())
    return _reference


async def go_on_as_the_reference(train: tg.Training, ref: dict[str, Any]) -> None:
    """Steps on batches 1 and 2 complete and leave the step count and params of the
    uncancelled run after its three steps."""
    for k in (1, 2):
        assert (await train.step(**batch(k))).kind == "completed"
    assert train.step_count == 3
    assert bits(await train.download_params()) == ref[2]


def test_a_step_cancelled_on_the_gpu_is_applied_and_counted(gpu_device) -> None:
    ref = reference(gpu_device)

    async def go() -> None:
        train = await compile_deep(gpu_device)
        step = asyncio.ensure_future(train.step(**batch(0)))
        async with on_the_gpu(gpu_device, step):
            step.cancel()
            with pytest.raises(asyncio.CancelledError):
                await step
        assert bits(await train.download_params()) == ref[0]   # the whole update landed
        assert train.step_count == 1                            # and was counted
        await go_on_as_the_reference(train, ref)
        train.destroy()

    run(go())


def test_a_step_timed_out_on_the_gpu_is_applied_and_counted(gpu_device) -> None:
    ref = reference(gpu_device)

    async def go() -> None:
        train = await compile_deep(gpu_device)
        step = asyncio.ensure_future(train.step(**batch(0)))
        async with on_the_gpu(gpu_device, step):  # (a fast step could beat any timeout)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(step, 0.001)
        await go_on_as_the_reference(train, ref)
        train.destroy()

    run(go())


def test_a_step_cancelled_in_the_queue_never_runs(gpu_device) -> None:
    ref = reference(gpu_device)

    async def go() -> None:
        train = await compile_deep(gpu_device)
        first = asyncio.ensure_future(train.step(**batch(0)))
        queued = asyncio.ensure_future(train.step(**batch(7)))
        async with on_the_gpu(gpu_device, first):
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
        assert (await first).kind == "completed"
        assert train.step_count == 1
        assert bits(await train.download_params()) == ref[0]
        await go_on_as_the_reference(train, ref)
        train.destroy()

    run(go())


def test_a_step_whose_task_is_cancelled_before_it_ran_never_runs(gpu_device) -> None:
    """A task wrapping the call, cancelled before its first step (``create_task(...)``
    then ``cancel()``, a TaskGroup cancelled by its body), withdraws the step: a coroutine
    cancelled before it starts never runs its own body, which used to let the step run."""
    ref = reference(gpu_device)

    async def go() -> None:
        train = await compile_deep(gpu_device)
        cancelled = asyncio.create_task(train.step(**batch(7)))
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        with pytest.raises(ExceptionGroup) as failed:
            async with asyncio.TaskGroup() as group:
                steps = [group.create_task(train.step(**batch(7))) for _ in range(2)]
                raise RuntimeError("the body failed")
        assert failed.group_contains(RuntimeError, match="the body failed")
        assert all(s.cancelled() for s in steps)
        await asyncio.sleep(0.05)   # (a step that was not withdrawn would run meanwhile)
        assert train.step_count == 0
        assert bits(await train.download_params()) == ref["init"]
        assert (await train.step(**batch(0))).kind == "completed"
        await go_on_as_the_reference(train, ref)
        train.destroy()

    run(go())


def test_a_step_left_running_when_its_event_loop_ends_completes(gpu_device) -> None:
    """The native tests' own pattern: one handle over several asyncio.run calls. asyncio.run
    cancels the tasks left at its end; a step on the GPU then finishes there (a queued one
    is withdrawn), and the next loop carries on from it."""
    ref = reference(gpu_device)
    train = run(compile_deep(gpu_device))

    async def leave_a_step() -> None:
        step = asyncio.ensure_future(train.step(**batch(0)))
        asyncio.ensure_future(train.step(**batch(7)))  # queued: withdrawn at the loop's end
        async with on_the_gpu(gpu_device, step):
            pass

    run(leave_a_step())
    assert train.step_count == 1

    async def go_on() -> None:
        assert bits(await train.download_params()) == ref[0]
        await go_on_as_the_reference(train, ref)

    run(go_on())
    train.destroy()


def test_uploads_resets_and_lr_changes_cancelled_in_the_queue_never_run(gpu_device) -> None:
    ref = reference(gpu_device)

    async def go() -> None:
        train = await compile_deep(gpu_device)
        zeros = {n: np.zeros(s, np.float32) for n, s in train.param_shapes.items()}
        first = asyncio.ensure_future(train.step(**batch(0)))
        queued = [asyncio.ensure_future(c) for c in (
            train.upload_params(zeros), train.reset(), train.reset_optimizer_state(),
            train.set_lr(0.0))]
        async with on_the_gpu(gpu_device, first):
            for call in queued:
                call.cancel()
            for call in queued:
                with pytest.raises(asyncio.CancelledError):
                    await call
        assert (await first).kind == "completed"
        await go_on_as_the_reference(train, ref)
        train.destroy()

    run(go())


class Noisy(tg.Module):
    def __init__(self) -> None:
        self.body = DeepMLP(width=WIDTH, depth=8, scale=0.1)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return tg.dropout(self.body(x), 0.5)


def test_a_forward_run_cancelled_on_the_gpu_keeps_its_place_in_the_prng_sequence(
        gpu_device) -> None:
    """Each run of a forward with dropout draws the next PRNG seed; a run cancelled on the
    GPU still drew its seed, so the runs after it give the outputs of an uncancelled run."""
    x = batch(0)["x"]

    async def outputs(cancel_first: bool) -> list[bytes]:
        forward = await tg.compile_forward(model=Noisy(), forward=lambda m, x: m(x),
                                           inputs={"x": INPUTS["x"]}, device=gpu_device,
                                           seed=2, chunk_size=2)
        got = []
        first = asyncio.ensure_future(forward.run(x=x))
        if cancel_first:
            async with on_the_gpu(gpu_device, first):
                first.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await first
        else:
            got.append((await first).output.tobytes())
        for _ in range(2):
            got.append((await forward.run(x=x)).output.tobytes())
        forward.destroy()
        return got

    plain = run(outputs(False))
    assert len(set(plain)) == 3  # each run draws new dropout masks
    assert run(outputs(True)) == plain[1:]
