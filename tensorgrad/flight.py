"""`single_flight`: at most one call of an async function in flight, the newest one queued.

Made for forward runs driven by a UI (a canvas redrawn on every mouse move): while one call
runs, a newer call replaces the queued one, which returns :class:`~tensorgrad.Aborted`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
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
