"""Handles used from several threads, each thread with its own event loop (asyncio.run): the
calls of one handle run one at a time in call order whatever thread made them, and give the
bits of the same calls made from one thread. Threads are joined with a timeout, so a hang
fails the test instead of stalling the suite."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

import tensorgrad as tg
from tests.models import TinyMLP
from tests.native.api_helpers import bits, compile_tiny, data, np_mlp, predict, run
from tests.threads import in_threads

THREADS, STEPS = 3, 4


async def steps(train: tg.Training, n: int, feeds: dict[str, Any]) -> list[float]:
    losses = []
    for _ in range(n):
        result = await train.step(**feeds)
        assert result.kind == "completed", result
        losses.append(result.loss)
    return losses


def test_one_training_handle_from_several_threads(gpu_device) -> None:
    """Every thread steps the same handle (and reads it through an attached forward): all the
    steps run and count, as many as from one thread, to the same params (the same batch each
    step, so the order of the threads' turns does not change the bits)."""
    feeds = data(0)

    async def alone() -> dict[str, bytes]:
        train = await compile_tiny(gpu_device)
        await steps(train, THREADS * STEPS, feeds)
        out = bits(await train.download_params())
        train.destroy()
        return out

    want = run(alone())
    train = run(compile_tiny(gpu_device))
    forward = run(train.attach(forward=predict, inputs={"x": (None, 2)}))

    def thread(k: int) -> int:
        async def go() -> int:
            await steps(train, STEPS, feeds)
            got = await forward.run(x=feeds["x"][: k + 1])  # a shape per thread
            assert got.kind == "completed", got
            return got.output.shape[0]
        return asyncio.run(go())

    assert in_threads(thread, THREADS) == [k + 1 for k in range(THREADS)]
    assert train.step_count == THREADS * STEPS
    assert bits(run(train.download_params())) == want
    train.destroy()


def test_one_forward_from_several_threads(gpu_device) -> None:
    """A standalone forward with a free batch dim, run from every thread at sizes of its own
    (so graphs are compiled and evicted from several threads): every output matches NumPy."""
    forward = run(tg.compile_forward(model=TinyMLP(), forward=predict, inputs={"x": (None, 2)},
                                     device=gpu_device, seed=4, max_cached_shapes=2))
    params = run(forward.download_params())

    def thread(k: int) -> int:
        async def go() -> int:
            for b in range(1, 4):
                x = data(k * 10 + b, batch=b + 3 * k)["x"]
                got = await forward.run(x=x)
                assert got.kind == "completed", got
                np.testing.assert_allclose(got.output, np_mlp(params, x), rtol=1e-5,
                                           atol=1e-6)
            return k
        return asyncio.run(go())

    assert in_threads(thread, THREADS) == list(range(THREADS))
    forward.destroy()


def test_handles_of_one_device_in_parallel_threads(gpu_device) -> None:
    """Several handles on the one device, each trained in a thread of its own at the same
    time: each gives the losses and params of the same training run alone."""
    async def train_one(seed: int) -> tuple[list[float], dict[str, bytes]]:
        train = await compile_tiny(gpu_device, seed=seed)
        losses = await steps(train, 2 * STEPS, data(seed))
        params = bits(await train.download_params())
        train.destroy()
        return losses, params

    alone = [run(train_one(seed)) for seed in range(THREADS)]
    together = in_threads(lambda k: asyncio.run(train_one(k)), THREADS)
    assert together == alone


def test_destroys_and_evictions_while_a_call_is_submitted_neither_crash_nor_misread(
        gpu_device) -> None:
    """A training destroyed from another thread while it steps, one destroyed while a step
    waits between two of its chunks, and a forward's shape evicted by another thread's new
    shape while it runs: the calls end Aborted or give the right output. wgpu-native aborts
    the whole process on a submission that uses a destroyed buffer (so the scenarios run in
    a child process), and a program dropped before a submission took its chunks ran nothing
    and read back zeros."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("destroy_while_busy.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "ok", out[-3000:]
    assert any(line.startswith("destroy from a thread: ") and "aborted" in line
               for line in lines), out
    assert "destroy between chunks: aborted" in lines, out
    assert any(line.startswith("evict from a thread: ") for line in lines), out
