#!/usr/bin/env python3
"""Time to ready in headless Chromium: from the page calling `start()` (which creates the
worker) to the worker's "ready" message, over N cold page loads.

    python bench/bench_ready.py [-n 5] [--warm-cache] [--no-snapshot] [--no-build | --web DIR]
                                [--json]

Each load opens a fresh browser context (an empty HTTP cache: Pyodide's wasm, the stdlib and
the wheel are fetched and compiled again) unless --warm-cache, which reuses one context (the
second visit of a user). Prints every load, then the median and max of the page's wall time
and of each part the worker reports in its "ready" timings:

    pyodideMs   loadPyodide() done (the wasm, python_stdlib.zip, the snapshot restored or the
                interpreter started; the wheel written into site-packages), since the worker
                started
    snapshotMs  the snapshot fetched and gunzipped (while the wasm compiles), since the start
    fetchMs     the wheel fetched and decompressed (while Pyodide loads), since the start
    wheelMs     installing the wheel: fsInit's wait and writes (inside pyodideMs), or micropip's
    micropipMs  loading micropip (0 unless a wheel needs it: the fallback install path)
    importMs    importing tensorgrad.web.worker and the protocol table (~0 after a restore)
    totalMs     the worker's own clock, from its first line to "ready"

and how it started: the install path ("unpack": straight into site-packages; "micropip"), and
whether the bundle's Pyodide snapshot was restored (else why not). A bundle built before these
existed (--web) reports pyodide/wheel/micropip/import only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import build  # the repository's build.py

START = """async (options) => {
  const tg = await import("/tensorgrad.js");
  const t0 = performance.now();
  const session = await tg.start(options);
  const wallMs = performance.now() - t0;
  const { timings, install } = session;
  session.terminate();
  return { wallMs, timings, install };
}"""

PARTS = ("pyodideMs", "snapshotMs", "fetchMs", "wheelMs", "micropipMs", "importMs", "totalMs")


def describe(install: dict | None) -> str:
    """'unpack, snapshot' / 'micropip, no snapshot (why)' from the ready message's install."""
    install = install or {}
    snap = install.get("snapshot") or {}
    how = "snapshot" if snap.get("used") else f"no snapshot ({snap.get('reason', '?')})"
    return f"{install.get('path', 'micropip')}, {how}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=5, help="page loads (default 5)")
    parser.add_argument("--warm-cache", action="store_true",
                        help="reuse one browser context (HTTP cache kept between loads)")
    parser.add_argument("--no-build", action="store_true", help="serve dist/web/ as it is")
    parser.add_argument("--web", type=Path, help="serve this built bundle instead of dist/web/ "
                        "(another checkout's, to compare; implies --no-build)")
    parser.add_argument("--no-snapshot", action="store_true",
                        help="start({snapshot: false}): Python starts, no snapshot restored")
    parser.add_argument("--chromium-arg", action="append", default=[],
                        help="extra Chromium flag (repeatable)")
    parser.add_argument("--json", action="store_true", help="also print the loads as JSON")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    build.install_browser_deps()
    if not (args.no_build or args.web):
        build.build_web()
    server = build.serve_web(directory=args.web or build.WEB, quiet=True)
    url = build.server_url(server)
    loads: list[dict] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(build.CHROMIUM),
                                     args=[*build.CHROMIUM_ARGS, *args.chromium_arg])
        print(f"Chromium {browser.version}, {url}, {args.n} "
              f"{'warm-cache' if args.warm_cache else 'cold'} loads", flush=True)
        shared = browser.new_context() if args.warm_cache else None
        for i in range(args.n):
            context = shared or browser.new_context()
            page = context.new_page()
            page.on("pageerror", lambda e: print(f"[pageerror] {e}", flush=True))
            page.goto(url + "index.html")
            out = page.evaluate(START, {"snapshot": False} if args.no_snapshot else {})
            page.close()
            if shared is None:
                context.close()
            t = out["timings"]
            loads.append({"wallMs": out["wallMs"], **t, "install": out["install"]})
            parts = ", ".join(f"{k[:-2]} {t[k]:.0f}" for k in PARTS if k in t)
            print(f"  load {i + 1}: ready in {out['wallMs']:.0f} ms (worker: {parts} ms; "
                  f"install: {describe(out['install'])})", flush=True)
        browser.close()
    server.shutdown()

    print(f"{'':12}{'median':>8}{'max':>8}  (ms, {len(loads)} loads)")
    for key in ("wallMs", *PARTS):
        values = [load[key] for load in loads if isinstance(load.get(key), (int, float))]
        if values:
            print(f"{key:12}{statistics.median(values):8.0f}{max(values):8.0f}")
    if args.json:
        print(json.dumps(loads, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
