"""Queue work-done notifications for wgpu-native, polled without blocking the event loop.

wgpu-py 0.32's own ``on_submitted_work_done`` does not fit the bundled wgpu-native header
(pygfx/wgpu-py#834), and its poll thread waits for *all* submitted work; this one is typed
from the header and polled from the caller's thread, so chunk i + 1 can be queued while the
GPU runs chunk i. It uses wgpu-py's private cffi handles: the native adapter probes it and
falls back to a public mechanism when they move.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

__all__ = ["NativeWorkDone"]


class NativeWorkDone:
    """Queue work-done notifications for wgpu-native, polled without blocking.

    Uses wgpu-py's private cffi handles (``wgpu.backends.wgpu_native._api``); the callback is
    typed from the bundled header, so it also fits the 0.32.0 header that wgpu-py's own
    on_submitted_work_done does not (pygfx/wgpu-py#834)."""

    def __init__(self, device: Any):
        from wgpu.backends.wgpu_native import _api

        self._ffi, self._lib, self._libf = _api.ffi, _api.lib, _api.libf
        self._device = device
        self._status: dict[int, int] = {}
        self._tickets = itertools.count(1)  # next() is atomic: handles may run in threads
        ffi = self._ffi

        def on_done(status: Any, *_rest: Any) -> None:
            self._status[int(ffi.cast("uintptr_t", _rest[-2]))] = int(status)

        self._callback = ffi.callback(ffi.typeof("WGPUQueueWorkDoneCallback"), on_done)

    def signal(self) -> int:
        """Ask for a notification when the work submitted so far is done; a ticket."""
        ffi = self._ffi
        ticket = next(self._tickets)
        info = ffi.new("WGPUQueueWorkDoneCallbackInfo *")
        info.mode = self._lib.WGPUCallbackMode_AllowProcessEvents
        info.callback = self._callback
        info.userdata1 = ffi.cast("void *", ticket)
        self._libf.wgpuQueueOnSubmittedWorkDone(self._device.queue._internal, info[0])
        return ticket

    def _poll(self) -> None:
        self._libf.wgpuDevicePoll(self._device._internal, False, self._ffi.NULL)

    async def wait(self, ticket: int) -> None:
        """Until `ticket`'s work is done: non-blocking polls, yielding to the event loop
        between them; short blocking sleeps (50 us doubling to 400 us) in between, since
        asyncio cannot sleep that briefly and a late wake-up idles the GPU between chunks."""
        status = self._status
        delay = 0.0
        self._poll()
        while ticket not in status:
            if delay:
                time.sleep(delay)  # noqa: ASYNC251 - sub-millisecond, see the docstring
            await asyncio.sleep(0)
            delay = min(4e-4, delay * 2) if delay else 5e-5
            self._poll()
        if status.pop(ticket) != self._lib.WGPUQueueWorkDoneStatus_Success:
            raise RuntimeError("GPU queue work failed (device lost?)")
