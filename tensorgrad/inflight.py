"""A training's steps in flight: submitted to the GPU, their results not in yet.

:class:`Flight` holds them oldest first (steps finish in call order) for
:class:`~tensorgrad.Training`, which submits a step while the ones before it still run (see
:meth:`Training.step <tensorgrad.Training.step>`); :class:`InFlight` is one step,
:class:`NextStep` what a step is submitted with.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .precision import LossScaler
    from .runtime import Executable, Ran

__all__ = ["MAX_IN_FLIGHT", "Flight", "InFlight", "NextStep"]

MAX_IN_FLIGHT = 4
"""Steps submitted and not yet finished, at most: a step beyond waits for the oldest."""


@dataclass(frozen=True)
class NextStep:
    """What a step is submitted with: its feeds (with the per-step scalars), the state
    writes before it, its step counter and the loss scaler after it (mixed precision)."""

    feeds: dict[str, bytes]
    states: Mapping[str, bytes]
    t: int
    scaler: LossScaler | None


class InFlight:
    """A step submitted whose result is not in yet: its executable, the user's bytes, its
    feeds but the per-step scalars (the PRNG seed included), the event loop it was called in
    and a future of its end there (`done`); once submitted, its readback, step counter and
    whole feeds. A waiter in another thread asks for :meth:`settled` (under the flight
    lock), which the step's end resolves too."""

    __slots__ = ("data", "done", "exe", "feeds", "finished", "loop", "readback", "submitted",
                 "t", "waited")

    def __init__(self, exe: Executable, data: dict[str, bytes], feeds: dict[str, bytes],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.exe, self.data, self.feeds, self.loop = exe, data, feeds, loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.readback: Awaitable[Ran] | None = None
        self.t = 0
        self.submitted: dict[str, bytes] = {}
        self.finished = False  # (under the flight lock)
        self.waited: concurrent.futures.Future[None] | None = None

    def settled(self) -> concurrent.futures.Future[None]:
        """A future of its end for any thread (called under the flight lock)."""
        if self.waited is None:
            self.waited = concurrent.futures.Future()
            if self.finished:
                self.waited.set_result(None)
        return self.waited


class Flight:
    """The steps in flight of one training, oldest first, for every thread (a lock)."""

    def __init__(self) -> None:
        self._steps: deque[InFlight] = deque()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def oldest(self) -> InFlight | None:
        steps = self._steps
        return steps[0] if steps else None

    @property
    def newest(self) -> InFlight | None:
        steps = self._steps
        return steps[-1] if steps else None

    def after_oldest(self) -> list[InFlight]:
        """Every step but the oldest, oldest first."""
        with self._lock:
            return list(self._steps)[1:]

    def room_in(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a step called in `loop` can be submitted without waiting (fewer than
        MAX_IN_FLIGHT in flight, all of them in `loop`)."""
        oldest = self.oldest
        return oldest is None or (oldest.loop is loop and len(self._steps) < MAX_IN_FLIGHT)

    def enter(self, step: InFlight) -> InFlight | None:
        """Put submitted `step` in the flight; the step before it there, if any."""
        with self._lock:
            before = self._steps[-1] if self._steps else None
            self._steps.append(step)
        return before

    def pop(self) -> None:
        """The oldest step is finished (the host's counts include it): out of the flight."""
        with self._lock:
            self._steps.popleft()

    def end(self, step: InFlight) -> None:
        """`step` is finished: what waits for it goes on."""
        step.done.set_result(None)
        with self._lock:
            settled, step.finished = step.waited, True
        if settled is not None:
            settled.set_result(None)

    async def make_room(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for the oldest step while MAX_IN_FLIGHT are in flight, or for every one when
        they run in another event loop (steps in flight share one loop)."""
        while True:
            with self._lock:
                steps = self._steps
                if not steps:
                    return
                if steps[0].loop is not loop:
                    wait = steps[-1]
                elif len(steps) >= MAX_IN_FLIGHT:
                    wait = steps[0]
                else:
                    return
                settled = None if wait.loop is loop else wait.settled()
            if settled is None:
                await wait.done
            else:
                await asyncio.wrap_future(settled)

    async def settle(self) -> None:
        """Wait until every step in flight is finished."""
        if not self._steps:
            return
        with self._lock:
            if not self._steps:
                return
            last = self._steps[-1]
            settled = None if last.loop is asyncio.get_running_loop() else last.settled()
        if settled is None:
            await last.done
        else:
            await asyncio.wrap_future(settled)
