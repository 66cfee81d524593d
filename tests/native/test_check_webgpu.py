"""tg.check_webgpu() natively: it names the mode (native, in this process) and the adapter."""

from __future__ import annotations

import asyncio

import tensorgrad as tg


def test_check_webgpu_reports_the_native_mode_and_adapter() -> None:
    support = asyncio.run(tg.check_webgpu())
    assert support.ok and support.mode == "native", support
    assert support.adapter and support.adapter in support.message, support
    assert support.jspi is None and "native, in this process" in support.message, support
