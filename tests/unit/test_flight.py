"""tg.single_flight: one call in flight, the newest queued, superseded calls Aborted; the
CallQueue of the handles: call order, cancellation (a queued call withdrawn, a running one
finished) and use from several threads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import tensorgrad as tg
from tensorgrad.flight import CallQueue, _Call
from tests.threads import in_threads


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


# ---- CallQueue: cancellation and threads -----------------------------------------------------

def test_a_queued_call_cancelled_before_its_turn_never_runs():
    async def main():
        queue, log, gate = CallQueue(), [], asyncio.Event()

        async def work(n: int) -> int:
            log.append(("start", n))
            await gate.wait()
            log.append(("end", n))
            return n

        first = asyncio.ensure_future(queue.submit(lambda: work(1)))
        queued = asyncio.ensure_future(queue.submit(lambda: work(2)))
        await asyncio.sleep(0)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        gate.set()
        assert await first == 1
        assert await queue.submit(lambda: work(3)) == 3
        assert log == [("start", 1), ("end", 1), ("start", 3), ("end", 3)]
        assert not queue.busy

    asyncio.run(main())


def test_a_running_call_runs_to_its_end_when_its_awaiter_is_cancelled():
    """The awaiter gets CancelledError at once; the call's work after its await (a step's
    bookkeeping) still runs, and the next call waits for it."""
    async def main():
        queue, log, gate = CallQueue(), [], asyncio.Event()

        async def work(n: int) -> int:
            log.append(("start", n))
            await gate.wait()
            log.append(("end", n))
            return n

        first = asyncio.ensure_future(queue.submit(lambda: work(1)))
        second = asyncio.ensure_future(queue.submit(lambda: work(2)))
        await until(lambda: log)
        assert log == [("start", 1)]
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert log == [("start", 1)] and queue.busy   # cancelled at once, still running
        gate.set()
        assert await second == 2
        assert log == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]

    asyncio.run(main())


@pytest.mark.parametrize("how", ["wait_for", "task_cancel"])
def test_a_timeout_does_not_stop_a_running_call(how: str):
    async def main():
        queue, log, gate = CallQueue(), [], asyncio.Event()

        async def work() -> str:
            await gate.wait()
            log.append("accounted")
            return "done"

        if how == "wait_for":
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(queue.submit(work), 0.01)
        else:
            task = asyncio.ensure_future(queue.submit(work))
            await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert log == [] and queue.busy
        after = asyncio.ensure_future(queue.submit(lambda: asyncio.sleep(0, "next")))
        gate.set()
        assert await after == "next"
        assert log == ["accounted"]

    asyncio.run(main())


def test_asyncio_run_ending_lets_a_running_call_finish():
    """asyncio.run cancels the tasks left at its end: a call that has its turn refuses and
    finishes there, a queued one is withdrawn, and the queue is free for the next loop."""
    queue, log = CallQueue(), []

    async def work(n: int) -> None:
        log.append(("start", n))
        await asyncio.sleep(0.05)
        log.append(("end", n))

    async def leave_them() -> None:
        asyncio.ensure_future(queue.submit(lambda: work(1)))
        asyncio.ensure_future(queue.submit(lambda: work(2)))
        while not log:
            await asyncio.sleep(0)

    asyncio.run(leave_them())
    assert log == [("start", 1), ("end", 1)] and not queue.busy
    asyncio.run(queue.submit(lambda: work(3)))
    assert log[2:] == [("start", 3), ("end", 3)]


def test_a_call_made_outside_a_loop_runs_when_awaited():
    queue = CallQueue()

    async def work() -> int:
        await asyncio.sleep(0)
        return 7

    pending = queue.submit(work)   # no running loop here
    assert asyncio.run(pending) == 7


def test_one_queue_serves_several_threads_and_their_loops():
    queue = CallQueue()
    inside, most, done = [0], [0], []

    async def work(k: int, i: int) -> tuple[int, int]:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        await asyncio.sleep(0.001)
        inside[0] -= 1
        done.append((k, i))
        return k, i

    async def calls(k: int) -> list:
        return await asyncio.gather(*(queue.submit(lambda i=i: work(k, i)) for i in range(20)))

    results = in_threads(lambda k: asyncio.run(calls(k)), 4, timeout=30)
    assert results == [[(k, i) for i in range(20)] for k in range(4)]
    assert len(done) == 80 and most[0] == 1, most    # one call at a time, across threads
    for k in range(4):                               # each thread's calls in its call order
        assert [i for kk, i in done if kk == k] == list(range(20))
    assert not queue.busy


def test_the_queue_is_a_lock_for_any_thread():
    queue = CallQueue()
    inside, most = [0], [0]

    async def hold(k: int) -> None:
        for _ in range(10):
            async with queue:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                await asyncio.sleep(0.001)
                inside[0] -= 1

    in_threads(lambda k: asyncio.run(hold(k)), 3, timeout=30)
    assert most[0] == 1 and not queue.busy


def test_idle_says_whether_a_call_made_now_runs_at_once():
    """CallQueue.idle (what the worker's express steps check): false from the moment a call
    is made (before its task has run), while a call holds the turn and while one waits for
    it, true again once they are done, and after a call cancelled before its task ran."""
    async def main():
        queue = CallQueue()
        gates = [asyncio.Event(), asyncio.Event()]
        assert queue.idle
        withdrawn = asyncio.ensure_future(queue.submit(gates[0].wait))
        assert not queue.idle and queue.busy  # made: the turn is its, its task not run yet
        call = next(t for t in asyncio.all_tasks() if isinstance(t, _Call))
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await withdrawn
        await asyncio.sleep(0)  # (the cancelled call's done callback gives its place up)
        assert queue.idle and call.cancelled()

        first = asyncio.ensure_future(queue.submit(gates[0].wait))
        assert not queue.idle and queue.busy
        second = asyncio.ensure_future(queue.submit(gates[1].wait))
        assert not queue.idle
        await asyncio.sleep(0)
        gates[0].set()
        await first
        assert queue.busy and not queue.idle  # the second call has the turn now
        gates[1].set()
        await second
        assert queue.idle and not queue.busy

    asyncio.run(main())


async def until(ready: Callable[[], object], iterations: int = 10) -> None:
    """Let the event loop run until `ready()` (at most `iterations` times round)."""
    for _ in range(iterations):
        if ready():
            return
        await asyncio.sleep(0)
    raise AssertionError("not ready after the event loop went round")


def test_a_call_whose_task_is_cancelled_before_it_ran_is_withdrawn():
    """A task made to await a call and cancelled before its first step (create_task then
    cancel, a TaskGroup whose body fails, asyncio.wait_for with no time) withdraws the call,
    queued behind another or not; calls made after it keep their order. A call nothing
    awaits, and one awaited directly, still run in call order."""
    async def main():
        queue, log = CallQueue(), []

        async def work(n: int) -> int:
            log.append(n)
            await asyncio.sleep(0)
            return n

        cancelled = asyncio.create_task(queue.submit(lambda: work(1)))
        cancelled.cancel()
        unawaited = queue.submit(lambda: work(2))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(queue.submit(lambda: work(3)), 0)
        with pytest.raises(ExceptionGroup):
            async with asyncio.TaskGroup() as group:
                group.create_task(queue.submit(lambda: work(4)))
                raise RuntimeError("the body failed")
        behind = asyncio.create_task(queue.submit(lambda: work(5)))
        assert await queue.submit(lambda: work(6)) == 6
        assert await behind == 5 and await unawaited == 2
        assert cancelled.cancelled()
        await asyncio.sleep(0)
        assert log == [2, 5, 6] and queue.idle

    asyncio.run(main())
