"""Calls in flight: :class:`single_flight` (at most one call running, the newest one queued)
and :class:`CallQueue` (every call runs, one at a time, in call order).

`single_flight` is made for forward runs driven by a UI (a canvas redrawn on every mouse
move): while one call runs, a newer call replaces the queued one, which returns
:class:`~tensorgrad.Aborted`. `CallQueue` orders everything a training handle does to its GPU
state (steps, uploads, resets, forward runs), so that nothing lands inside a step.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

from .results import Aborted

T = TypeVar("T")


class single_flight(Generic[T]):  # lower case: used like a function (a decorator)
    """Wrap ``fn`` so that one call runs at a time and at most one waits.

    A call made while another runs is queued; a newer call supersedes the queued one, whose
    await returns ``Aborted()``. The running call is never interrupted. Otherwise a call
    returns what ``fn`` returns (a ``Forward.run`` result passes through unchanged) and
    raises what it raises::

        predict = tg.single_flight(forward.run)
        match await predict(x=pixels):
            case tg.Completed(output=probs): draw(probs)
            case tg.Aborted(): pass            # a newer drawing superseded this one
    """

    def __init__(self, fn: Callable[..., Awaitable[T]]):
        if not callable(fn):
            raise TypeError(f"single_flight: expected an async function, got "
                            f"{type(fn).__name__}")
        self._fn = fn
        self._busy = False
        self._queued: asyncio.Future[bool] | None = None
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @property
    def busy(self) -> bool:
        """True while a call runs."""
        return self._busy

    async def __call__(self, *args: Any, **kwargs: Any) -> T | Aborted:
        if self._busy:
            if self._queued is not None and not self._queued.done():
                self._queued.set_result(False)  # superseded
            turn: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._queued = turn
            try:
                granted = await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled() and turn.result():
                    self._hand_over()  # cancelled after being given the turn: pass it on
                raise
            if not granted:
                return Aborted()
        self._busy = True
        try:
            return await self._fn(*args, **kwargs)
        finally:
            self._hand_over()

    def _hand_over(self) -> None:
        """Give the turn to the queued call, if any; else become idle."""
        turn, self._queued = self._queued, None
        if turn is not None and not turn.done():
            turn.set_result(True)  # it runs next; _busy stays True
        else:
            self._busy = False


class CallQueue:
    """Runs calls one at a time, in the order they were made.

    :meth:`submit` starts the call at once as a task (when an event loop runs), and the task
    waits for its turn first, so calls made in a row — a ``step`` not yet awaited, then an
    ``upload_params`` — run in that order however they are awaited, and never interleave.
    Loop-agnostic: waiters are futures of whichever loop the call runs in."""

    def __init__(self) -> None:
        self._busy = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    def submit(self, fn: Callable[[], Awaitable[T]]) -> Coroutine[Any, Any, T]:
        """Queue ``fn()``; a coroutine of its result. When an event loop runs, the call is
        already under way as a task (so it keeps its place even if the coroutine is awaited
        late, or wrapped in ``asyncio.create_task``); otherwise it starts when awaited."""
        coro = self._run(fn)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return coro
        return _result_of(loop.create_task(coro))

    async def _run(self, fn: Callable[[], Awaitable[T]]) -> T:
        await self._acquire()
        try:
            return await fn()
        finally:
            self._release()

    async def _acquire(self) -> None:
        if not self._busy:
            self._busy = True
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # given the turn, then cancelled: pass it on
            else:
                self._waiters.remove(turn)
            raise

    def _release(self) -> None:
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)  # the next call runs; still busy
                return
        self._busy = False


async def _result_of(task: asyncio.Task[T]) -> T:
    return await task
