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
from collections.abc import Awaitable, Callable, Coroutine, Generator
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

    :meth:`submit` takes the call's place in the queue as it is made and starts it as a task
    (when an event loop runs), which waits for its turn first, so calls made in a row — a
    ``step`` not yet awaited, then an ``upload_params`` — run in that order however they are
    awaited, and never interleave. Calls made from several threads (each with its own event
    loop) share the one order: a call's turn is handed to the next call's own loop
    (``call_soon_threadsafe``), and each runs in the loop it was made in.

    Cancellation: a call cancelled while it waits for its turn is withdrawn and never runs;
    so is one whose awaiting task is cancelled before that task's first step
    (``asyncio.create_task(train.step(x)).cancel()``, a TaskGroup whose body fails at once):
    a call nothing awaits yet lets such a task run first. Once it has its turn it runs to
    its end, whether or not anything still awaits it: its task refuses ``cancel()`` (so
    neither a cancelled awaiter, a timeout, nor ``asyncio.run`` cancelling leftover tasks at
    its end can stop it halfway through its GPU work or its bookkeeping), and an awaiter
    cancelled meanwhile gets ``CancelledError`` at once.

    A call made with ``staged=True`` gives its turn up before its end: ``fn()`` does what
    must run in turn (a training step: submitting its GPU work) and returns an awaitable of
    the rest (the step's readback), which is awaited once the next call has the turn. Every
    other call first awaits ``settle()`` (when set) in its turn: the owner's way to finish
    what staged calls left in flight before anything else touches the same state.

    ``async with queue:`` holds a turn without a task (a loop- and thread-agnostic lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = False  # a turn is held (by a call, possibly not started yet)
        self._waiters: deque[_Turn] = deque()
        self.settle: Callable[[], Awaitable[None]] | None = None

    @property
    def busy(self) -> bool:
        """True while a call holds the turn (from when it is made, if the queue was idle)."""
        return self._busy

    @property
    def idle(self) -> bool:
        """True when no call holds the turn or waits for it (its task started or not): a
        call made now would run at once."""
        return not self._busy and not self._waiters

    def submit(self, fn: Callable[[], Awaitable[T]]) -> Coroutine[Any, Any, T]:
        """Queue ``fn()``; a coroutine of its result. When an event loop runs, the call is
        already under way as a task (so it keeps its place even if the coroutine is awaited
        late, or wrapped in ``asyncio.create_task``); otherwise it starts when awaited."""
        return self._start(lambda turn: self._run(fn, turn))

    def submit_staged(self, fn: Callable[[], Awaitable[Awaitable[T]]]
                      ) -> Coroutine[Any, Any, T]:
        """Queue ``fn()``, which gives the turn up when it returns; a coroutine of the
        result of the awaitable it returned (see the class docstring)."""
        return self._start(lambda turn: self._run_staged(fn, turn))

    def _start(self, make: Callable[[_Turn], Coroutine[Any, Any, T]]
               ) -> Coroutine[Any, Any, T]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._start_when_awaited(make)
        call = self._launch(make, loop)
        call.result_of = _ResultOf(call)
        return call.result_of

    async def _start_when_awaited(self, make: Callable[[_Turn], Coroutine[Any, Any, T]]) -> T:
        return await _awaited(self._launch(make, asyncio.get_running_loop()))

    def _launch(self, make: Callable[[_Turn], Coroutine[Any, Any, T]],
                loop: asyncio.AbstractEventLoop) -> _Call:
        """The task of a call made now, its place in the queue taken."""
        turn = self._reserve(loop)
        call = _Call(make(turn), loop=loop)
        call.add_done_callback(functools.partial(self._dropped, turn))
        return call

    def _reserve(self, loop: asyncio.AbstractEventLoop) -> _Turn:
        """A place in the queue, made now: the turn itself when none is held."""
        turn = _Turn(loop, loop.create_future())
        with self._lock:
            if self._busy:
                self._waiters.append(turn)
                return turn
            self._busy = True
            turn.granted = True
        turn.future.set_result(None)
        return turn

    def _dropped(self, turn: _Turn, call: _Call) -> None:
        """A call cancelled before its task first ran gives its place up."""
        if not call.began:
            self._give_up(turn)

    def _give_up(self, turn: _Turn) -> None:
        """Leave the queue from `turn`'s place, passing the turn on if it was given."""
        with self._lock:
            granted = turn.granted
            if not granted and turn in self._waiters:
                self._waiters.remove(turn)
        if granted:
            self._release()

    async def _wait(self, turn: _Turn) -> None:
        try:
            await turn.future
        except asyncio.CancelledError:
            self._give_up(turn)
            raise

    async def _begin(self, turn: _Turn) -> None:
        """A call's task waits for its turn; from then on the call runs to its end. If
        nothing awaits the call yet, it first lets the tasks made meanwhile run a step: one
        made to await it and cancelled at once then withdraws it (see _ResultOf)."""
        call = asyncio.current_task()
        assert isinstance(call, _Call)
        call.began = True
        if call.result_of is not None and not call.result_of.started:
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self._give_up(turn)
                raise
        await self._wait(turn)
        call.running = True

    async def _run(self, fn: Callable[[], Awaitable[T]], turn: _Turn) -> T:
        await self._begin(turn)
        try:
            if self.settle is not None:
                await self.settle()
            return await fn()
        finally:
            self._release()

    async def _run_staged(self, fn: Callable[[], Awaitable[Awaitable[T]]], turn: _Turn) -> T:
        await self._begin(turn)
        try:
            rest = await fn()
        finally:
            self._release()
        return await rest

    async def __aenter__(self) -> None:
        await self._wait(self._reserve(asyncio.get_running_loop()))

    async def __aexit__(self, *exc: object) -> None:
        self._release()

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

    running = False  # has its turn: runs to its end
    began = False    # its task has run (a call cancelled before that gives its place up)
    result_of: _ResultOf[Any] | None = None  # the coroutine its caller got

    def cancel(self, msg: Any = None) -> bool:
        if self.running:
            return False
        return super().cancel(msg)


def _consume(call: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a call nobody awaits any more (no "never retrieved" log)."""
    if not call.cancelled():
        call.exception()


def _withdraw(call: asyncio.Task[Any]) -> None:
    """Nothing awaits `call` any more: withdrawn if it still waits for its turn (its cancel
    is refused once it runs), its outcome consumed."""
    call.cancel()
    call.add_done_callback(_consume)


async def _awaited(call: asyncio.Task[T]) -> T:
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        _withdraw(call)
        raise


class _ResultOf(Coroutine[Any, Any, T]):
    """The coroutine a queued call's caller gets: awaits the call's result (shielded: a
    cancelled awaiter gets ``CancelledError`` at once, and the call is withdrawn if it still
    waits for its turn). A plain coroutine would miss one case: a task wrapping it that is
    cancelled before its first step (``asyncio.create_task(train.step(x)).cancel()``, a
    TaskGroup cancelled early) never runs its body, so its ``except CancelledError`` never
    withdrew the call, which then ran anyway."""

    __slots__ = ("_call", "_inner", "started")

    def __init__(self, call: asyncio.Task[T]):
        self._call, self._inner = call, _awaited(call)
        self.started = False  # its first step has run (or it is awaited directly)

    def send(self, value: Any) -> Any:
        self.started = True
        return self._inner.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        exc = typ if isinstance(typ, BaseException) else typ() if val is None else val
        if tb is not None:
            exc = exc.with_traceback(tb)
        if not self.started:
            self.started = True
            if isinstance(exc, asyncio.CancelledError):
                _withdraw(self._call)
        return self._inner.throw(exc)

    def close(self) -> None:
        self._inner.close()

    def __await__(self) -> Generator[Any, None, T]:
        self.started = True
        return self._inner.__await__()
