"""Host-side writes are ordered with respect to whole steps: an upload, a reset or an LR
change called while a step is in flight lands wholly after it (calls run one at a time, in
call order), never between its GPU submissions, and inputs are copied when a call is made."""

from __future__ import annotations

import asyncio

import numpy as np

from tests.native.api_helpers import run
from tests.native.deep_model import batch, compile_deep


def test_upload_during_a_step_lands_wholly_after_it(gpu_device) -> None:
    async def go() -> None:
        train = await compile_deep(gpu_device)
        assert train.kernel_count > 60
        zeros = {n: np.zeros(s, np.float32) for n, s in train.param_shapes.items()}
        in_flight = 0
        for seed in range(5):
            step = asyncio.ensure_future(train.step(**batch(seed)))  # not awaited yet
            for _ in range(3):
                await asyncio.sleep(0)  # let it start submitting
            in_flight += not step.done()
            await train.upload_params(zeros)
            assert (await step).kind == "completed"
            got = await train.download_params()
            assert all(not np.any(v) for v in got.values()), \
                {n: int(np.count_nonzero(v)) for n, v in got.items()}
        assert in_flight >= 3, "the steps finished before the uploads: nothing was tested"
        train.destroy()

    run(go())


def test_calls_run_in_call_order_however_they_are_awaited(gpu_device) -> None:
    async def go() -> None:
        train = await compile_deep(gpu_device)
        init = await train.download_params()
        # step, reset, step: the second step starts from the initial params again, so both
        # steps see the same params and give the same loss
        first = train.step(**batch(0))
        reset = train.reset()
        second = train.step(**batch(0))
        r2, _, r1 = await second, await reset, await first  # awaited in reverse
        assert r1.kind == r2.kind == "completed" and r1.loss == r2.loss
        assert train.step_count == 1
        # an upload called right after a step is not part of that step
        step = train.step(**batch(1))
        upload = train.upload_params(init)
        await asyncio.gather(upload, step)
        got = await train.download_params()
        assert all(np.array_equal(got[n], init[n]) for n in init)
        train.destroy()

    run(go())


def test_inputs_are_copied_when_the_call_is_made(gpu_device) -> None:
    async def go() -> None:
        train = await compile_deep(gpu_device)
        d = batch(3)
        want = await train.step(**d)
        await train.reset()
        x = d["x"].copy()
        pending = train.step(x=x, y=d["y"])
        x[:] = 1e6  # reusing the buffer for the next batch changes nothing already called
        got = await pending
        assert got.kind == "completed" and got.loss == want.loss
        params = {n: v + 1 for n, v in (await train.download_params()).items()}
        upload = train.upload_params(params)
        for v in params.values():
            v[...] = 0.0
        await upload
        after = await train.download_params()
        assert all(np.any(v) for v in after.values())  # the values as uploaded, not zeros
        train.destroy()

    run(go())


def test_set_lr_applies_after_the_steps_called_before_it(gpu_device) -> None:
    async def go() -> None:
        train = await compile_deep(gpu_device)
        before = await train.download_params()
        step = train.step(**batch(2))        # runs at lr 1e-2
        freeze = train.set_lr(0.0)           # then nothing moves
        frozen_step = train.step(**batch(3))
        await asyncio.gather(step, freeze, frozen_step)
        moved = await train.download_params()
        assert any(not np.array_equal(moved[n], before[n]) for n in before)
        again = train.step(**batch(4))
        await again
        after = await train.download_params()
        assert all(np.array_equal(after[n], moved[n]) for n in moved)
        train.destroy()

    run(go())
