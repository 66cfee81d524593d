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
import threading
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
        functools.update_wrapper(self, fn)

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
    """Runs calls one at a time, in the order they were made, from any thread and event loop.

    :meth:`submit` starts the call at once as a task (when an event loop runs), and the task
    waits for its turn first, so calls made in a row — a ``step`` not yet awaited, then an
    ``upload_params`` — run in that order however they are awaited, and never interleave.
    Calls made from several threads (each with its own event loop) share the one order: a
    call's turn is handed to the next call's own loop (``call_soon_threadsafe``), and each
    runs in the loop it was made in.

    Cancellation: a call cancelled while it waits for its turn is withdrawn and never runs.
    Once it has its turn it runs to its end, whether or not anything still awaits it: its
    task refuses ``cancel()`` (so neither a cancelled awaiter, a timeout, nor ``asyncio.run``
    cancelling leftover tasks at its end can stop it halfway through its GPU work or its
    bookkeeping), and an awaiter cancelled meanwhile gets ``CancelledError`` at once.

    A call made with ``staged=True`` gives its turn up before its end: ``fn()`` does what
    must run in turn (a training step: submitting its GPU work) and returns an awaitable of
    the rest (the step's readback), which is awaited once the next call has the turn. Every
    other call first awaits ``settle()`` (when set) in its turn: the owner's way to finish
    what staged calls left in flight before anything else touches the same state.

    ``async with queue:`` holds a turn without a task (a loop- and thread-agnostic lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = False
        self._waiters: deque[_Turn] = deque()
        self._unstarted = 0  # calls made whose task has not run yet (not in _waiters yet)
        self.settle: Callable[[], Awaitable[None]] | None = None

    @property
    def busy(self) -> bool:
        """True while a call holds the turn."""
        return self._busy

    @property
    def idle(self) -> bool:
        """True when no call holds the turn and none is made that waits for it (its task
        started or not): a call made now would run at once."""
        return not self._busy and not self._waiters and not self._unstarted

    def submit(self, fn: Callable[[], Awaitable[T]]) -> Coroutine[Any, Any, T]:
        """Queue ``fn()``; a coroutine of its result. When an event loop runs, the call is
        already under way as a task (so it keeps its place even if the coroutine is awaited
        late, or wrapped in ``asyncio.create_task``); otherwise it starts when awaited."""
        return self._start(lambda: self._run(fn))

    def submit_staged(self, fn: Callable[[], Awaitable[Awaitable[T]]]
                      ) -> Coroutine[Any, Any, T]:
        """Queue ``fn()``, which gives the turn up when it returns; a coroutine of the
        result of the awaitable it returned (see the class docstring)."""
        return self._start(lambda: self._run_staged(fn))

    def _start(self, make: Callable[[], Coroutine[Any, Any, T]]) -> Coroutine[Any, Any, T]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._start_when_awaited(make)
        call = _Call(make(), loop=loop)
        call.unstarted_in = self
        with self._lock:
            self._unstarted += 1
        call.add_done_callback(self._started)  # (a call cancelled before its task ran)
        return _result_of(call)

    def _started(self, call: object = None) -> None:
        """The current task's call (or `call`, done) no longer counts as not started."""
        call = call or asyncio.current_task()
        if isinstance(call, _Call) and call.unstarted_in is self:
            call.unstarted_in = None
            with self._lock:
                self._unstarted -= 1

    async def _start_when_awaited(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return await _result_of(_Call(make(), loop=asyncio.get_running_loop()))

    async def _run(self, fn: Callable[[], Awaitable[T]]) -> T:
        self._started()  # (in the same step as _acquire's place in the queue)
        await self._acquire()
        _mark_running()
        try:
            if self.settle is not None:
                await self.settle()
            return await fn()
        finally:
            self._release()

    async def _run_staged(self, fn: Callable[[], Awaitable[Awaitable[T]]]) -> T:
        self._started()  # (in the same step as _acquire's place in the queue)
        await self._acquire()
        _mark_running()
        try:
            rest = await fn()
        finally:
            self._release()
        return await rest

    async def __aenter__(self) -> None:
        await self._acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    async def _acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._busy:
                self._busy = True
                return
            turn = _Turn(loop, loop.create_future())
            self._waiters.append(turn)
        try:
            await turn.future
        except asyncio.CancelledError:
            with self._lock:
                granted = turn.granted
                if not granted:
                    self._waiters.remove(turn)
            if granted:
                self._release()  # given the turn, then cancelled: pass it on
            raise

    def _release(self) -> None:
        with self._lock:
            while self._waiters:
                turn = self._waiters.popleft()
                turn.granted = True
                if turn.wake():
                    return  # the next call runs; still busy
            self._busy = False


class _Turn:
    """A call waiting for its turn: its loop, the future it awaits, whether it was given."""

    __slots__ = ("future", "granted", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]):
        self.loop, self.future, self.granted = loop, future, False

    def wake(self) -> bool:
        """Resolve the future in its own loop; False when that loop is closed (the call will
        never run, so the turn goes to the next one)."""
        try:
            if _running_loop() is self.loop:
                _grant(self.future)
            else:
                self.loop.call_soon_threadsafe(_grant, self.future)
        except RuntimeError:  # "Event loop is closed"
            return False
        return True


def _mark_running() -> None:
    """The current call has its turn: from here on it runs to its end (called with no await
    since its turn was granted)."""
    call = asyncio.current_task()
    if isinstance(call, _Call):
        call.running = True


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _grant(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Call(asyncio.Task):  # type: ignore[type-arg]
    """The task of a queued call: ``cancel()`` withdraws it while it waits for its turn and is
    refused (returns False) once it runs."""

    running = False
    unstarted_in: CallQueue | None = None  # the queue counting it until its task runs

    def cancel(self, msg: Any = None) -> bool:
        if self.running:
            return False
        return super().cancel(msg)


def _consume(call: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a call nobody awaits any more (no "never retrieved" log)."""
    if not call.cancelled():
        call.exception()


async def _result_of(call: asyncio.Task[T]) -> T:
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        call.cancel()  # withdrawn if it still waits for its turn; refused once it runs
        call.add_done_callback(_consume)
        raise
