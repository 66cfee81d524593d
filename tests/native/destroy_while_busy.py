"""Run as a script by tests/native/test_threads.py (a wgpu-native panic aborts the whole
process, so a regression must kill this process, not the test run): destroys and shape-cache
evictions that land while a step or run is being submitted. Prints one line per scenario."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tensorgrad as tg
from tests.models import TinyMLP
from tests.native.api_helpers import compile_tiny, data, np_mlp, predict


def _stepper(train: tg.Training, got: list[str]) -> None:
    """Step `train` until a step does not complete (in this thread's own event loop)."""
    async def go() -> None:
        while True:
            result = await train.step(**data(0))
            got.append(result.kind)
            if result.kind != "completed":
                return
    asyncio.run(go())


def destroy_from_another_thread(device: object) -> str:
    """A thread steps a training in a loop; the main thread destroys it meanwhile."""
    kinds: set[str] = set()
    for attempt in range(6):
        train = asyncio.run(compile_tiny(device))
        got: list[str] = []
        thread = threading.Thread(target=_stepper, args=(train, got))
        thread.start()
        time.sleep(0.02 + 0.01 * attempt)
        train.destroy()
        thread.join(30)
        assert not thread.is_alive(), "a step hung after destroy"
        assert got and got[-1] == "aborted", got
        kinds.update(got)
    return f"destroy from a thread: {sorted(kinds)}"


async def destroy_between_chunks(device: object) -> str:
    """A destroy that runs while a step waits between two of its chunks (chunk_size=1)."""
    train = await compile_tiny(device, chunk_size=1)
    waits = 0
    wait = type(device)._wait

    async def turning_wait(self: object, done: object, fence: object) -> None:
        nonlocal waits
        waits += 1
        await asyncio.sleep(0)  # a turn of the event loop, as on a GPU still busy
        await wait(self, done, fence)

    type(device)._wait = turning_wait  # type: ignore[method-assign]
    try:
        step = asyncio.ensure_future(train.step(**data(0)))
        while not waits:
            await asyncio.sleep(0)
        train.destroy()
        result = await step
    finally:
        type(device)._wait = wait  # type: ignore[method-assign]
    return f"destroy between chunks: {result.kind}"


def evict_from_another_thread(device: object) -> str:
    """A thread runs a forward at one size; the main thread compiles other sizes, evicting
    it from a two-shape cache: every run gives the right output."""
    fwd = asyncio.run(tg.compile_forward(model=TinyMLP(), forward=predict,
                                         inputs={"x": (None, 2)}, seed=0, device=device,
                                         max_cached_shapes=2))
    params = asyncio.run(fwd.download_params())
    x = data(0)["x"]
    want = np_mlp(params, x)
    outcomes = {"right": 0, "wrong": 0}
    stop = threading.Event()

    def runner() -> None:
        async def go() -> None:
            while not stop.is_set():
                result = await fwd.run(x=x)
                ok = result.kind == "completed" and np.allclose(result.output, want, atol=1e-5)
                outcomes["right" if ok else "wrong"] += 1
        asyncio.run(go())

    thread = threading.Thread(target=runner)
    thread.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 3:
        for n in (7, 9, 11):
            fwd.output_shape(x=np.zeros((n, 2), np.float32))
    stop.set()
    thread.join(30)
    assert not thread.is_alive(), "a run hung"
    assert outcomes["wrong"] == 0 and outcomes["right"] > 0, outcomes
    fwd.destroy()
    return f"evict from a thread: {outcomes['right']} right"


def main() -> None:
    from tensorgrad.gpu.native import request_native_device

    device = asyncio.run(request_native_device())  # (the driver the test's environment chose)
    print(destroy_from_another_thread(device), flush=True)
    print(asyncio.run(destroy_between_chunks(device)), flush=True)
    print(evict_from_another_thread(device), flush=True)
    print("ok", flush=True)


if __name__ == "__main__":
    main()
