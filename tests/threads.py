"""Run a function in several real threads, failing (not hanging) when one does not finish:
tests/unit/test_flight.py and tests/native/test_threads.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def in_threads(target: Callable[[int], Any], n: int, timeout: float = 60.0) -> list[Any]:
    """[target(0), ..., target(n - 1)], each called in a daemon thread of its own, all started
    together. AssertionError naming the threads still running after `timeout` seconds (a
    hang: being daemons, they do not keep the process alive) or the first exception raised."""
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(k: int) -> None:
        try:
            results[k] = target(k)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(k,), daemon=True, name=f"worker-{k}")
               for k in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads {stuck} still running after {timeout} s (a hang)"
    if errors:
        raise errors[0]
    return results
