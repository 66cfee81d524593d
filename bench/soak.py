#!/usr/bin/env python3
"""Soak: compile / attach / step / run / destroy cycles, natively and in the browser.

    python bench/soak.py [--cycles 1000] [--browser-cycles 200] [--no-browser]

Prints, for each, the GPU buffers created and the live ones left (0 when nothing leaks),
pipelines and programs created, seconds, and memory after the warm-up and at the end
(resident memory natively; WebAssembly heap + JS heap in the worker).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import build
from tensorgrad.gpu.native import request_native_device
from tests.soak import soak


def show(where: str, r: dict) -> None:
    mib = 2**20
    print(f"{where}: {r['cycles']} cycles in {r['seconds']:.1f} s; GPU buffers created "
          f"{r['buffers_created']}, left live {r['buffers_live_delta']}; pipelines created "
          f"{r['pipelines_created']}, programs {r['programs_created']}; memory "
          f"{r['memory_after_warmup'] / mib:.1f} MiB after the warm-up, "
          f"{r['memory_end'] / mib:.1f} MiB at the end (growth {r['memory_growth'] / mib:+.2f}"
          " MiB)", flush=True)


def browser(cycles: int) -> dict:
    from playwright.sync_api import sync_playwright

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
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--browser-cycles", type=int, default=200)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    device = asyncio.run(request_native_device())
    print(f"native device: {device.description}")
    show("native", asyncio.run(soak(device, args.cycles)))
    if not args.no_browser:
        show("browser (headless Chromium, SwiftShader)", browser(args.browser_cycles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
