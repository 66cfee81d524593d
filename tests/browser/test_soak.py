"""Compile / step / destroy cycles in the worker, on navigator.gpu: every GPU buffer made is
freed, no pipeline is compiled twice, the worker's memory does not grow
(bench/soak.py --browser runs 200 cycles)."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import Page

SOAK_SOURCE = (Path(__file__).resolve().parents[1] / "soak.py").read_text()
MEMORY_GROWTH_BOUND = 32 * 2**20


def test_cycles_in_the_worker_free_everything_they_make(tg_page: Page) -> None:
    tg_page.exec(SOAK_SOURCE)
    report = json.loads(tg_page.exec(
        "import json\njson.dumps(await soak(await tg.default_device(), 40))")[1:-1])
    print(f"\nbrowser soak: {report}")
    assert report["buffers_live_delta"] == 0 and report["buffers_created"] >= 40 * 10
    assert report["memory_growth"] < MEMORY_GROWTH_BOUND, report
