"""The browser adapter's checks (adapter_checks.py) run on the native adapter too, so both
adapters are held to one definition of the GPUDevice interface."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from . import adapter_checks

Runner = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(scope="module")
def run_native() -> Iterator[Runner]:
    """Run coroutines on one thread of their own: Playwright's sync API may hold this
    thread's event loop."""
    with ThreadPoolExecutor(1, thread_name_prefix="native-gpu") as pool:
        yield lambda coro: pool.submit(asyncio.run, coro).result()


@pytest.fixture(scope="module")
def native_device(run_native: Runner) -> Any:
    from tensorgrad.gpu.native import request_native_device

    return run_native(request_native_device())


@pytest.mark.parametrize("name", sorted(adapter_checks.CHECKS))
def test_native_adapter_passes_the_browser_checks(run_native: Runner, native_device: Any,
                                                  name: str) -> None:
    run_native(adapter_checks.CHECKS[name](native_device))
