#!/usr/bin/env python3
"""Soak: does memory stay flat over many compiles? Natively (lavapipe by default) and in the
browser.

    python bench/soak.py [--models 500] [--batches 500] [--every 50]
                         [--cycles 0] [--browser-cycles 0]

- models: `--models` distinct models (an MLP of a new width each: kernels of their own),
  each compiled, stepped 3 times and destroyed;
- batches: one forward with a `None` batch dim (default max_cached_shapes) run at batch
  sizes 1..`--batches`, each size compiling its own graph, older ones evicted.

Every `--every` iterations it prints resident memory (MiB) and the device's live GPU objects
(buffers, pipelines, programs, pooled readback buffers), then a verdict: flat when, from the
second row (the warm-up) to the last, memory grew by less than FLAT_MIB, the live buffers,
pipelines and programs did not change, and the readback pool stayed within its bound
(STAGING_KEPT; it takes a size class as reads grow).

`--cycles` / `--browser-cycles` run the same-model compile / attach / step / run / destroy
cycles of tests/soak.py natively / in headless Chromium (GPU buffers created and left live,
pipelines compiled, memory after the warm-up and at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tensorgrad.gpu.native import STAGING_KEPT, request_native_device, use_vulkan_driver
from tests.soak import batch_sizes, distinct_models, soak

MIB = 2**20
FLAT_MIB = 16  # memory growth after the warm-up still called flat


def show(where: str, r: dict) -> None:
    print(f"{where}: {r['cycles']} cycles in {r['seconds']:.1f} s; GPU buffers created "
          f"{r['buffers_created']}, left live {r['buffers_live_delta']}; pipelines created "
          f"{r['pipelines_created']}, programs {r['programs_created']}; memory "
          f"{r['memory_after_warmup'] / MIB:.1f} MiB after the warm-up, "
          f"{r['memory_end'] / MIB:.1f} MiB at the end (growth {r['memory_growth'] / MIB:+.2f}"
          " MiB)", flush=True)


def show_row(what: str, r: dict) -> None:
    live = ", ".join(f"{k} {v}" for k, v in r["live"].items())
    print(f"  {what} {r['iteration']:5d}: RSS {r['memory'] / MIB:8.1f} MiB; live {live}",
          flush=True)


def verdict(what: str, rows: list[dict], seconds: float) -> bool:
    """Whether the rows of one phase stay flat after the warm-up (printed)."""
    warm, last = rows[min(1, len(rows) - 1)], rows[-1]
    growth = (last["memory"] - warm["memory"]) / MIB
    kept = {k: v for k, v in last["live"].items() if k != "staging"}
    flat = (growth < FLAT_MIB and kept == {k: warm["live"][k] for k in kept}
            and last["live"].get("staging", 0) <= STAGING_KEPT + 1)
    print(f"  {what}: {'FLAT' if flat else 'GROWS'} after the warm-up (iteration "
          f"{warm['iteration']} -> {last['iteration']}: RSS {growth:+.1f} MiB, live objects "
          f"{warm['live']} -> {last['live']}); {seconds:.0f} s", flush=True)
    return flat


def browser(cycles: int) -> dict:
    from playwright.sync_api import sync_playwright

    import build

    build.build_web()
    server = build.serve_web(0, quiet=True)
    source = (ROOT / "tests" / "soak.py").read_text()
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(build.CHROMIUM),
                                      args=build.CHROMIUM_ARGS)
        page = chromium.new_page()
        page.goto(build.server_url(server) + "index.html")
        text = page.evaluate("""async ([source, cycles]) => {
          const tg = await import("/tensorgrad.js");
          const session = await tg.start();
          await session.exec(source);
          return session.exec(`import json\\njson.dumps(await soak(await tg.default_device(), ${cycles}))`);
        }""", [source, cycles])
        chromium.close()
    server.shutdown()
    return json.loads(text[1:-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=500)
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=0)
    parser.add_argument("--browser-cycles", type=int, default=0)
    args = parser.parse_args()
    use_vulkan_driver(os.environ.get("TENSORGRAD_TEST_VULKAN", "lavapipe"))
    device = asyncio.run(request_native_device())
    print(f"native device: {device.description}", flush=True)
    flat = True
    for what, n, phase in (("models", args.models, distinct_models),
                           ("batches", args.batches, batch_sizes)):
        if n > 0:
            t0 = time.perf_counter()
            rows = asyncio.run(phase(device, n, every=args.every,
                                     on_row=lambda r, what=what: show_row(what, r)))
            flat &= verdict(what, rows, time.perf_counter() - t0)
    if args.cycles > 0:
        show("native cycles", asyncio.run(soak(device, args.cycles)))
    if args.browser_cycles > 0:
        show("browser cycles (headless Chromium, SwiftShader)", browser(args.browser_cycles))
    print(f"verdict: {'flat' if flat else 'memory grows'}")
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
