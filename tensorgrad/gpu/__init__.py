"""GPU adapters behind one small interface (see :mod:`tensorgrad.gpu.interface`)."""

from __future__ import annotations

import sys

from .interface import AdapterInfo, Copy, DeviceLimits, Dispatch, GPUDevice, WebGPUSupport

__all__ = [
    "AdapterInfo", "Copy", "DeviceLimits", "Dispatch", "GPUDevice", "WebGPUSupport",
    "check_webgpu", "in_pyodide", "request_device", "runtime_mode",
]


def in_pyodide() -> bool:
    """True when running inside Pyodide (browser main thread or worker)."""
    return sys.platform == "emscripten"


def runtime_mode() -> str:
    """Where tensorgrad's GPU work would run in this process: "native" (CPython, wgpu-py),
    "worker" (Pyodide in a Web Worker, or in a JS runtime without a page: in-process on its
    ``navigator.gpu``) or "main-thread" (Pyodide on a web page's main thread, where tensorgrad
    runs only in its dedicated worker, ``tensorgrad.web.start()``)."""
    if not in_pyodide():
        return "native"
    from .browser import browser_mode

    return browser_mode()


async def request_device() -> GPUDevice:
    """The default device: `navigator.gpu` inside Pyodide in a Web Worker, a native wgpu-py
    device elsewhere. Raises :class:`~tensorgrad.errors.MainThreadError` on a web page's main
    thread (see :func:`runtime_mode`)."""
    if in_pyodide():
        from .browser import request_browser_device

        return await request_browser_device()
    from .native import request_native_device

    return await request_native_device()


_supported: WebGPUSupport | None = None


async def check_webgpu() -> WebGPUSupport:
    """Probe for a WebGPU adapter without creating a device: whether tensorgrad can run here,
    where (`mode`: native, in-process in a Web Worker, or a page's main thread), on which
    `adapter`, and in a browser whether JSPI is there (`jspi`). A success is cached; a failure
    is not (a later check can see a recovery). Natively it asks wgpu-py; inside Pyodide it
    asks ``navigator.gpu``. On a page's main thread it says no (reason "main-thread": use
    ``tensorgrad.web.start()``, whose own probe is ``tensorgrad.web.check_webgpu()``)."""
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
