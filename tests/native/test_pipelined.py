"""Steps in flight: a step gives its turn up once it is submitted, so the next step is written
and submitted while its readback is on its way; the results stay those of steps awaited one
by one, bit for bit (losses, params, the step counter, the loss scale), whatever the
optimizer, LR schedule and precision, and after a skipped step (a NaN batch, a mixed-precision
overflow), whose speculative successors the step guard skips and the host submits again."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tensorgrad as tg
from tests.models import TinyMLP
from tests.native.api_helpers import bits, run
from tests.native.deep_model import batch, compile_deep

B = 16


def _loss(m: TinyMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(m(x) - y))


def _batch(k: int, nan: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(k)
    x = rng.uniform(-1, 1, (B, 1)).astype(np.float32)
    if nan:
        x[3, 0] = np.nan
    return {"x": x, "y": (np.sin(3 * x) + 0.1).astype(np.float32)}


async def _compile(device: Any, optimizer: Any, **kw: Any) -> tg.Training:
    return await tg.compile(model=TinyMLP(n_in=1), loss=_loss, inputs={"x": (B, 1), "y": (B, 1)},
                            optimizer=optimizer, device=device, seed=3, **kw)


def _outcome(r: tg.Result) -> tuple[Any, ...]:
    """What a result says, bit for bit (a loss as its f32 bytes)."""
    if r.kind == "completed":
        return ("completed", np.float32(r.loss).tobytes(), r.skipped)
    return (r.kind, getattr(r, "message", ""))


async def _train(device: Any, optimizer: Any, batches: list[dict[str, np.ndarray]],
                 pipelined: bool, hold: bytes = b"", **kw: Any) -> dict[str, Any]:
    """Every batch stepped, awaited one by one or all called at once; the outcomes, the
    params' bits, the step counter and loss scale, and how many submissions the device got.
    `hold`: the input bytes of a step whose readback is held until 3 more steps are submitted
    (so that they are in flight when it turns out skipped, however fast the GPU)."""
    train = await _compile(device, optimizer, **kw)
    submits = _count_submits(device, hold if pipelined else b"")
    try:
        if pipelined:
            results = await asyncio.gather(*[train.step(**b) for b in batches])
        else:
            results = [await train.step(**b) for b in batches]
        return {"outcomes": [_outcome(r) for r in results],
                "params": bits(await train.download_params()), "t": train.step_count,
                "scale": train.loss_scale, "skipped": train.skipped_steps,
                "submits": submits()}
    finally:
        del device.submit
        train.destroy()


def _count_submits(device: Any, hold: bytes) -> Callable[[], int]:
    """Count the device's step submissions from now (until ``del device.submit``); the
    readback of the first that writes `hold` waits until 3 more were submitted."""
    calls = [0]
    submit = device.submit
    held: list[int] = []

    async def counted(program: Any, writes: Any, reads: Any) -> Any:
        calls[0] += 1
        me = calls[0]
        readback = await submit(program, writes, reads)
        if held or not hold or all(bytes(memoryview(d)) != hold for _, d in writes):
            return readback
        held.append(me)

        async def later() -> Any:
            for _ in range(30_000):  # (at most 30 s)
                if calls[0] >= me + 3:
                    break
                await asyncio.sleep(0.001)
            return await readback
        return later()

    device.submit = counted
    return lambda: calls[0]


OPTIMIZERS = {
    "adam-cosine": tg.optim.Adam(lr=tg.lr.warmup(0.05, 3, tg.lr.cosine_annealing(0.05, 0.001, 10))),
    "adamw-clip": tg.optim.AdamW(lr=0.02, weight_decay=0.1, clip_grad_norm=0.5),
    "sgd-momentum": tg.optim.SGD(lr=0.05, momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_steps_in_flight_match_awaited_steps_around_a_nan_batch(gpu_device, name) -> None:
    """A NaN batch in the middle of steps in flight: its step is Failed naming its own cause
    and step number; the steps after it, submitted speculatively and skipped on the GPU, are
    submitted again and give the awaited run's losses and params."""
    batches = [_batch(k, nan=k == 4) for k in range(12)]
    optimizer = OPTIMIZERS[name]
    awaited = run(_train(gpu_device, optimizer, batches, pipelined=False))
    pipelined = run(_train(gpu_device, optimizer, batches, pipelined=True,
                           hold=bytes(batches[4]["x"])))
    failed = awaited["outcomes"][4]
    assert failed[0] == "failed" and re.search(
        r"loss is nan at step 5: the update was skipped.*input 'x' holds nan at flat index 3",
        failed[1]), failed
    assert pipelined["outcomes"] == awaited["outcomes"]
    assert pipelined["params"] == awaited["params"]
    assert pipelined["t"] == awaited["t"] == 11
    assert awaited["submits"] == 12
    assert pipelined["submits"] > 12  # steps after the NaN batch were submitted again


def test_mixed_precision_overflows_in_flight_match_awaited_steps(gpu_device) -> None:
    """Under precision="mixed" an overflow skips a step and backs the scale off, and the
    scale grows after finite steps: either decides the next step's scale. With a scale that
    overflows at first and grows back into an overflow every few steps, steps in flight give
    the awaited run's results (skipped flags included), params, scale and counts."""
    scale = tg.LossScale(init_scale=2.0 ** 40, growth_factor=2.0 ** 12, growth_interval=4)
    batches = [_batch(k) for k in range(40)]
    optimizer = tg.optim.Adam(lr=tg.lr.cosine_annealing(0.02, 0.002, 30))
    kw = {"precision": "mixed", "loss_scale": scale}
    awaited = run(_train(gpu_device, optimizer, batches, pipelined=False, **kw))
    pipelined = run(_train(gpu_device, optimizer, batches, pipelined=True,
                           hold=bytes(batches[0]["x"]), **kw))
    skipped = [o[2] for o in awaited["outcomes"]]
    assert sum(skipped) >= 5 and not all(skipped[-10:]), skipped  # overflows, and steps
    assert any(skipped[k] and not skipped[k - 1] for k in range(10, 40)), skipped  # later too
    for key in ("outcomes", "params", "t", "scale", "skipped"):
        assert pipelined[key] == awaited[key], key
    assert pipelined["submits"] > awaited["submits"] == 40


def test_the_next_step_is_submitted_while_the_last_ones_readback_is_held(gpu_device) -> None:
    """Step 0's readback is held on its way back (its mapping waits): step 1's input data
    is written to the device meanwhile, i.e. step 0 gave its turn up once submitted. Both
    then complete with the bits of steps awaited one by one."""
    async def reference() -> list[Any]:
        train = await compile_deep(gpu_device)
        losses = [np.float32((await train.step(**batch(k))).loss).tobytes() for k in range(2)]
        params = bits(await train.download_params())
        train.destroy()
        return [losses, params]

    ref = run(reference())

    async def go() -> None:
        train = await compile_deep(gpu_device)
        held, release, written = asyncio.Event(), asyncio.Event(), asyncio.Event()
        second = bytes(batch(1)["x"])
        map_and_read, write_buffer = gpu_device._map_and_read, gpu_device.write_buffer

        async def held_map(*args: Any) -> Any:
            if not held.is_set():
                held.set()
                await release.wait()
            return await map_and_read(*args)

        def watched_write(buffer: Any, data: Any, offset: int = 0) -> None:
            if not release.is_set() and bytes(memoryview(data)) == second:
                written.set()
            write_buffer(buffer, data, offset)

        gpu_device._map_and_read, gpu_device.write_buffer = held_map, watched_write
        try:
            first = asyncio.ensure_future(train.step(**batch(0)))
            then = asyncio.ensure_future(train.step(**batch(1)))
            await asyncio.wait_for(held.wait(), 60)
            try:
                await asyncio.wait_for(written.wait(), 30)
            except TimeoutError:
                pytest.fail("step 1 was not written while step 0's readback was held")
            assert not first.done()
        finally:
            release.set()
            del gpu_device._map_and_read, gpu_device.write_buffer
        results = [await first, await then]
        assert [np.float32(r.loss).tobytes() for r in results] == ref[0]
        assert train.step_count == 2
        assert bits(await train.download_params()) == ref[1]
        train.destroy()

    run(go())


def test_other_calls_wait_for_the_steps_in_flight(gpu_device) -> None:
    """A reset, an upload, set_lr and a download made behind steps in flight (one of them a
    NaN batch, so its successors are submitted again) act on the state those steps leave,
    as with awaited steps: the step counter a schedule reads, the params downloaded."""
    lr = tg.lr.linear(0.05, 0.0, 8)

    async def go(pipelined: bool) -> list[Any]:
        train = await _compile(gpu_device, tg.optim.Adam(lr=lr))
        out: list[Any] = []
        calls = [lambda k=k: train.step(**_batch(k, nan=k == 1)) for k in range(4)]
        calls += [train.download_params, lambda: train.set_lr(tg.lr.linear(0.02, 0.0, 4))]
        calls += [lambda k=k: train.step(**_batch(k)) for k in range(4, 7)]
        calls += [lambda: train.reset(params=False),
                  lambda: train.step(**_batch(7)), train.download_params]
        if pipelined:
            got = await asyncio.gather(*[c() for c in calls])
        else:
            got = [await c() for c in calls]
        for r in got:
            out.append(bits(r) if isinstance(r, dict) else None if r is None else _outcome(r))
        out.append(train.step_count)
        train.destroy()
        return out

    awaited, pipelined = run(go(False)), run(go(True))
    assert awaited[1][0] == "failed" and awaited[-1] == 1
    assert [o[0] for o in awaited[6:9]] == ["completed"] * 3
    assert pipelined == awaited


def test_an_overflowing_batch_among_steps_in_flight_is_told_from_its_own_gradients(
        gpu_device) -> None:
    """One batch of large values overflows the scaled f16 gradients in mixed precision, its
    neighbours do not. Whether a skipped step was an overflow is read from its gradients
    after the fact, which the steps in flight behind it had overwritten: they are computed
    again for it (a forced skip), so it is Completed(skipped=True) as when awaited, the
    scale backs off once, and the steps after it match."""
    batches = [_batch(k) for k in range(10)]
    batches[3] = {"x": batches[3]["x"] * 100, "y": batches[3]["y"] * 100}
    optimizer = tg.optim.Adam(lr=0.01)
    kw = {"precision": "mixed"}
    awaited = run(_train(gpu_device, optimizer, batches, pipelined=False, **kw))
    pipelined = run(_train(gpu_device, optimizer, batches, pipelined=True,
                           hold=bytes(batches[3]["x"]), **kw))
    assert [o[2] for o in awaited["outcomes"]] == [k == 3 for k in range(10)]
    assert awaited["scale"] == 2.0 ** 15 and awaited["skipped"] == 1
    for key in ("outcomes", "params", "t", "scale", "skipped"):
        assert pipelined[key] == awaited[key], key
    assert pipelined["submits"] > awaited["submits"] == 10


def test_awaited_steps_and_steps_in_flight_interleaved_match_awaited_steps(gpu_device) -> None:
    """Steps awaited one by one (each submitted with none in flight, the fresh path) and
    bursts of steps in flight, one burst and one awaited step with a NaN batch, give the
    outcomes, params and step counter of steps all awaited one by one."""
    nan = {4, 9}
    batches = [_batch(k, nan=k in nan) for k in range(14)]
    groups = [[0], [1, 2], [3, 4, 5, 6], [7], [8], [9], [10, 11, 12], [13]]

    async def go(interleaved: bool) -> dict[str, Any]:
        optimizer = tg.optim.Adam(lr=tg.lr.cosine_annealing(0.05, 0.001, 12))
        train = await _compile(gpu_device, optimizer)
        try:
            results: list[tg.Result] = []
            for group in groups:
                if interleaved and len(group) > 1:
                    results += await asyncio.gather(*[train.step(**batches[k]) for k in group])
                else:
                    results += [await train.step(**batches[k]) for k in group]
            return {"outcomes": [_outcome(r) for r in results], "t": train.step_count,
                    "params": bits(await train.download_params())}
        finally:
            train.destroy()

    awaited, interleaved = run(go(False)), run(go(True))
    assert [o[0] for o in awaited["outcomes"]] == [
        "failed" if k in nan else "completed" for k in range(14)]
    assert awaited["t"] == 12
    assert interleaved == awaited


def test_an_awaited_step_writes_the_chain_flag_only_after_a_skipped_step(gpu_device) -> None:
    """The step guard's chain flag is 1 after an applied step, so a step submitted with
    none in flight writes it (1.0) only when the host does not know that: after a skipped
    step. The steps after an applied one write just their inputs."""
    from tensorgrad.update import STEP_CHAIN

    async def go() -> list[list[bytes]]:
        train = await _compile(gpu_device, tg.optim.Adam(lr=0.01))
        chain = train._exe.leaf_buffer("state", STEP_CHAIN)
        written: list[bytes] = []
        write_buffer = gpu_device.write_buffer

        def watched(buffer: Any, data: Any, offset: int = 0) -> None:
            if buffer is chain:
                written.append(bytes(memoryview(data)))
            write_buffer(buffer, data, offset)

        gpu_device.write_buffer = watched
        per_step: list[list[bytes]] = []
        try:
            for k in range(6):
                result = await train.step(**_batch(k, nan=k == 3))
                assert result.kind == ("failed" if k == 3 else "completed"), result
                per_step.append(list(written))
                written.clear()
        finally:
            del gpu_device.write_buffer
            train.destroy()
        return per_step

    per_step = run(go())
    one = np.float32(1.0).tobytes()
    assert per_step[1:] == [[], [], [], [one], []], per_step
