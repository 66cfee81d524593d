"""Frees that wait for a device's work in progress (:meth:`GPUDevice.in_use
<tensorgrad.gpu.interface.GPUDevice.in_use>`).

wgpu-native aborts the whole process on a submission that uses a destroyed buffer, and a
program dropped before a submission took its chunks runs nothing (its reads give zeros). So
while a submission, read or write is under way (from any thread, or across the awaits of a
step that waits between its chunks), a destroy is kept and done when the last of them ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class DeferredFrees:
    """How many users the device's resources have now, and the frees kept for after them."""

    def __init__(self) -> None:
        self._users = 0
        self._kept: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """Hold the resources while inside."""
        self.hold()
        try:
            yield
        finally:
            self.let_go()

    def hold(self) -> None:
        """One more user (let go with :meth:`let_go`, also across awaits)."""
        with self._lock:
            self._users += 1

    def let_go(self) -> None:
        """One user fewer; the last one runs the frees kept meanwhile."""
        with self._lock:
            self._users -= 1
            kept, self._kept = (self._kept, []) if not self._users else ([], self._kept)
        for free in kept:
            free()

    def later(self, free: Callable[[], None]) -> bool:
        """Keep `free` for when the last user is done: True; False when there is none (the
        caller frees now)."""
        with self._lock:
            if self._users:
                self._kept.append(free)
                return True
        return False
