"""GPU adapters behind one small interface (see :mod:`tensorgrad.gpu.interface`)."""

from __future__ import annotations

import sys

from .interface import Copy, DeviceLimits, Dispatch, GPUDevice

__all__ = [
    "Copy", "DeviceLimits", "Dispatch", "GPUDevice",
    "in_pyodide", "request_device",
]


def in_pyodide() -> bool:
    """True when running inside Pyodide (browser main thread or worker)."""
    return sys.platform == "emscripten"


async def request_device() -> GPUDevice:
    """The default device: `navigator.gpu` inside Pyodide, a native wgpu-py device elsewhere."""
    if in_pyodide():
        from .browser import request_browser_device

        return await request_browser_device()
    from .native import request_native_device

    return await request_native_device()
