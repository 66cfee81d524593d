"""GPU adapters behind one small interface (see :mod:`tensorgrad.gpu.interface`)."""

from __future__ import annotations

import sys

from .interface import AdapterInfo, Copy, DeviceLimits, Dispatch, GPUDevice, WebGPUSupport

__all__ = [
    "AdapterInfo", "Copy", "DeviceLimits", "Dispatch", "GPUDevice", "WebGPUSupport",
    "check_webgpu", "in_pyodide", "request_device",
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


_supported: WebGPUSupport | None = None


async def check_webgpu() -> WebGPUSupport:
    """Probe for a WebGPU adapter without creating a device. A success is cached; a failure
    is not (a later check can see a recovery). Natively it asks wgpu-py; inside Pyodide it
    asks ``navigator.gpu`` (on a page's main thread prefer ``tensorgrad.web.check_webgpu()``,
    which probes in a throwaway worker so that the page never stalls)."""
    global _supported
    if _supported is not None:
        return _supported
    if in_pyodide():
        from .browser import probe_browser as probe
    else:
        from .native import probe_native as probe
    result = await probe()
    if result.ok:
        _supported = result
    return result
