"""tg.single_flight: one call in flight, the newest queued, superseded calls Aborted."""

from __future__ import annotations

import asyncio

import pytest

import tensorgrad as tg


def test_newest_call_wins_and_superseded_ones_abort():
    async def main():
        started: list[int] = []
        gate = asyncio.Event()

        async def work(n: int) -> int:
            started.append(n)
            await gate.wait()
            return n * 10

        fn = tg.single_flight(work)
        first = asyncio.create_task(fn(1))
        await asyncio.sleep(0)
        assert fn.busy
        second = asyncio.create_task(fn(2))
        third = asyncio.create_task(fn(3))
        await asyncio.sleep(0)
        assert started == [1]                      # 2 and 3 wait; 3 superseded 2
        assert await second == tg.Aborted()
        gate.set()
        assert await first == 10
        assert await third == 30
        assert started == [1, 3]
        assert not fn.busy
        assert await fn(4) == 40                   # idle again: runs at once

    asyncio.run(main())


def test_errors_propagate_and_the_queue_moves_on():
    async def main():
        async def work(n: int) -> int:
            await asyncio.sleep(0.01)
            if n == 1:
                raise ValueError("bad input 1")
            return n

        fn = tg.single_flight(work)
        first = asyncio.create_task(fn(1))
        await asyncio.sleep(0)
        second = asyncio.create_task(fn(2))
        with pytest.raises(ValueError, match="bad input 1"):
            await first
        assert await second == 2

    asyncio.run(main())


def test_cancelled_waiter_does_not_block_the_next_call():
    async def main():
        gate = asyncio.Event()

        async def work(n: int) -> int:
            await gate.wait()
            return n

        fn = tg.single_flight(work)
        first = asyncio.create_task(fn(1))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(fn(2))
        await asyncio.sleep(0)
        waiting.cancel()
        gate.set()
        assert await first == 1
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not fn.busy
        assert await asyncio.wait_for(fn(3), 1) == 3

    asyncio.run(main())


def test_rejects_non_callables():
    with pytest.raises(TypeError, match="single_flight: expected an async function, got int"):
        tg.single_flight(3)
