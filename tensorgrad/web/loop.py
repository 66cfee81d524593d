"""The worker's asyncio event loop: Pyodide's WebLoop with its ready callbacks run in batches.

Pyodide's WebLoop gives every ``call_soon`` callback a browser task of its own (a
MessageChannel message and a JS callable made for it, then a call into Python). A training
step awaited through the page client made 12 of them: the handler's task starting, the call
queue's turn, the step's futures and the loop's own bookkeeping. :class:`BatchedWebLoop`
keeps the ready callbacks in one FIFO queue and runs them in one browser task, together with
those they make ready, so a step takes a few browser tasks instead.

What stays as in asyncio and WebLoop: callbacks run in the order they were scheduled, each
once; timers (``call_later`` with a delay) are the browser's; nothing runs while Python runs
(JS promises that resolve meanwhile, and the page's messages, are seen once the batch ends).
A batch gives the browser its turn after :data:`BATCH_SECONDS` of callbacks. A callback may
suspend its stack (JSPI: ``run_sync``, Pyodide's ``time.sleep``): the callbacks after it then
run in the next browser task, so nothing waits for the suspended one.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from ..gpu import in_pyodide

__all__ = ["BATCH_SECONDS", "install", "loop_class", "worker_loop"]

BATCH_SECONDS = 0.01
"""Longest run of callbacks in one browser task before the browser gets its turn."""

_installed: Any = None  # the loop install() made a BatchedWebLoop


@functools.cache
def loop_class() -> type:
    """BatchedWebLoop (defined once Pyodide's WebLoop is importable: inside Pyodide only)."""
    from pyodide import webloop
    from pyodide.ffi import create_once_callable
    from pyodide.webloop import WebLoop

    class BatchedWebLoop(WebLoop):  # type: ignore[misc]
        """WebLoop whose ``call_soon`` callbacks run in batches, one browser task each."""

        def __init__(self) -> None:
            super().__init__()
            self._ready: deque[asyncio.Handle] = deque()
            self._batch_scheduled = False

        def call_soon(self, callback: Callable[..., Any], *args: Any,
                      context: contextvars.Context | None = None) -> asyncio.Handle:
            handle = asyncio.Handle(callback, args, self, context=context)
            self._ready.append(handle)
            if not self._batch_scheduled:
                self._schedule_batch()
            return handle

        def _schedule_batch(self) -> None:
            self._batch_scheduled = True
            # (webloop's own handle on the JS scheduler, which survives a memory snapshot)
            webloop.scheduleCallback(create_once_callable(self._run_batch, _may_syncify=True), 0)

        def _run_batch(self) -> None:
            # A callback scheduled from here on starts another batch: if one of this batch's
            # callbacks suspends its stack, that batch runs what queues up meanwhile.
            self._batch_scheduled = False
            self._install_running_loop()
            self._install_asyncgen_hooks()
            ready = self._ready
            deadline = time.perf_counter() + BATCH_SECONDS
            try:
                while ready:
                    handle = ready.popleft()
                    if not handle.cancelled():
                        _run_handle(self, handle)
                    if time.perf_counter() > deadline:
                        break
            finally:
                if ready and not self._batch_scheduled:
                    self._schedule_batch()

    return BatchedWebLoop


def _run_handle(loop: Any, handle: asyncio.Handle) -> None:
    """Run one callback as WebLoop does: SystemExit and KeyboardInterrupt go to its
    handlers."""
    try:
        handle._run()
    except SystemExit as exc:
        if loop._system_exit_handler:
            loop._system_exit_handler(exc.code)
        else:
            raise
    except KeyboardInterrupt:
        if loop._keyboard_interrupt_handler:
            loop._keyboard_interrupt_handler()
        else:
            raise


def install() -> bool:
    """Make Pyodide's event loop a :class:`BatchedWebLoop` (the worker calls it once it has
    started, before any message); whether it is one now (False outside Pyodide: CPython
    keeps its own loop). A bool, so the JS caller holds no proxy of the loop.

    The loop object stays the same, its class changes: Pyodide registered it as the policy's
    loop and as the running loop, and each WebLoop claims the running-loop slot whenever it
    runs a callback, so a second loop would share the slot with the first and tasks and
    futures could end up on two loops."""
    if not in_pyodide():
        return False
    import asyncio.events

    from pyodide.webloop import WebLoop

    loop = asyncio.events._get_running_loop() or asyncio.get_event_loop_policy().get_event_loop()
    if not isinstance(loop, WebLoop):
        return False
    cls = loop_class()
    if not isinstance(loop, cls):
        loop._ready = deque()
        loop._batch_scheduled = False
        loop.__class__ = cls
    global _installed
    _installed = loop
    return True


def worker_loop() -> asyncio.AbstractEventLoop | None:
    """The loop :func:`install` made a :class:`BatchedWebLoop` (None outside Pyodide, before
    it, or once closed)."""
    loop = _installed
    if loop is None or loop.is_closed():
        return None
    return cast(asyncio.AbstractEventLoop, loop)
