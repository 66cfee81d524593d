"""Compile / step / destroy cycles natively: every GPU buffer made is freed, no pipeline is
compiled twice, memory does not grow (bench/soak.py runs 1,000 cycles)."""

from __future__ import annotations

import asyncio

from tests.soak import soak

MEMORY_GROWTH_BOUND = 32 * 2**20  # over 150 cycles after the warm-up


def test_cycles_free_everything_they_make(gpu_device) -> None:
    report = asyncio.run(soak(gpu_device, 160))
    print(f"\nsoak: {report}")
    assert report["buffers_live_delta"] == 0 and report["buffers_created"] >= 160 * 10
    assert report["memory_growth"] < MEMORY_GROWTH_BOUND, report
