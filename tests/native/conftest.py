"""Fixtures for tests that run on a native WebGPU device (wgpu-py).

Async convention: tests are plain functions and run coroutines with ``asyncio.run(...)``
(one short event loop per call; the device outlives them). No pytest-asyncio fixtures.

``gpu_device`` is one session-wide :class:`~tensorgrad.gpu.native.NativeDevice`. Which one:

- ``TENSORGRAD_WGPU``: ``wgpu`` (default, wgpu-native) or ``wgpudawn``.
- Vulkan driver: whatever ``VK_ICD_FILENAMES`` / ``VK_DRIVER_FILES`` / ``VK_ADD_DRIVER_FILES``
  say; if none is set, ``TENSORGRAD_TEST_VULKAN`` (``lavapipe``, ``swiftshader`` or
  ``default``), else the faster CPU driver measured on the project's 2-core machines
  (:data:`DEFAULT_CPU_DRIVER`, see bench/bench_chunking.py --kernels). On a machine with a
  real GPU, set ``TENSORGRAD_TEST_VULKAN=default`` or a driver variable.

If no device can be made the fixture fails (an error in every test that uses it, with the
reason), never skips: a missing GPU stack must not pass CI silently.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from tensorgrad.gpu.native import NativeDevice, request_native_device, use_vulkan_driver

DEFAULT_CPU_DRIVER = "lavapipe"


def _choose_driver() -> str:
    wanted = os.environ.get("TENSORGRAD_TEST_VULKAN", DEFAULT_CPU_DRIVER)
    if os.environ.get("TENSORGRAD_WGPU") == "wgpudawn" and wanted == "lavapipe":
        wanted = "swiftshader"  # Dawn rejects lavapipe
    if wanted == "default":
        return "loader default"
    path = use_vulkan_driver(wanted)
    return f"{wanted} ({path})" if path else f"{wanted} not applied (driver variable set?)"


@pytest.fixture(scope="session")
def gpu_device() -> Iterator[NativeDevice]:
    """The session's native WebGPU device; fails loudly when none can be made."""
    choice = _choose_driver()
    try:
        device = asyncio.run(request_native_device())
    except Exception as err:  # noqa: BLE001 - any failure is reported as the reason
        pytest.fail(f"no native WebGPU device (driver choice: {choice}): "
                    f"{type(err).__name__}: {err}", pytrace=False)
    print(f"\nnative WebGPU device: {device.description} [{device.driver_note}]")
    yield device
    device.destroy()
