#!/usr/bin/env python3
"""What each way of running tensorgrad in a browser costs, in headless Chromium.

    python bench/bench_notebooks.py [--no-build] [--steps N] [--json out.json]

1. Time to the first trained step, from navigation (a fresh Chromium each, an empty HTTP
   cache), of the same MLP (1-64-64-1, batch 256) in each environment:

   jupyterlite      JupyterLite's REPL: `%pip install tensorgrad-webgpu`, compile, one step
                    (in-process in the kernel's Web Worker)
   pyscript-worker  a PyScript `<script type="py" worker>` (the documented config), in-process
   pyscript-main    PyScript on the page + `tensorgrad.web.start()` (the dedicated worker)
   page-client      web/tensorgrad.js from a plain page (the dedicated worker, its snapshot)

   with the memory of this Chromium's processes then (their summed proportional set size,
   psutil) and the wasm memory of the Pyodide that ran the step. Each environment prints `FIRST-STEP <Date.now()>` to the console.

2. Steps/s of the addition transformer (demos/addition_transformer/model.py) in-process (a
   PyScript worker runs the loop) against the dedicated worker (PyScript on the page drives
   `session.compile(...).step` in tensorgrad's worker), both in one Chromium launch, after 2
   warm-up steps, same batches (Python's random.Random(1)).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import build  # the repository's build.py

MLP = '''
import math, random
import tensorgrad as tg

class MLP(tg.Module):
    def __init__(self):
        self.l1, self.l2, self.l3 = tg.Linear(1, 64), tg.Linear(64, 64), tg.Linear(64, 1)
    def forward(self, x):
        return self.l3(tg.relu(self.l2(tg.relu(self.l1(x)))))

def loss_fn(model, x, y):
    return tg.mean(tg.square(model(x) - y))

rng = random.Random(0)
XS = [rng.uniform(-math.pi, math.pi) for _ in range(256)]
YS = [math.sin(v) for v in XS]
'''

REPORT = '''
import js
try:
    import pyodide_js
    wasm = int(pyodide_js._module.HEAPU8.length)
except Exception:
    wasm = -1
js.console.log(f"FIRST-STEP {js.Date.now()} {wasm} {result.loss}")
'''

IN_PROCESS = MLP + '''
train = await tg.compile(model=MLP(), loss=loss_fn, inputs={"x": (256, 1), "y": (256, 1)},
                         optimizer=tg.optim.Adam(lr=5e-3), seed=0)
result = await train.step(x=XS, y=YS)
''' + REPORT

DEDICATED = MLP + '''
import tensorgrad.web
session = await tensorgrad.web.start()
await session.exec(MODEL_SOURCE)
train = await session.compile(model="MLP()", loss="loss_fn", inputs={"x": [256, 1], "y": [256, 1]},
                              optimizer="tg.optim.Adam(lr=5e-3)", seed=0)
result = await train.step(x=XS, y=YS)
''' + REPORT

PAGE_CLIENT = """<!doctype html><meta charset="utf-8"><script type="module">
import { start } from "/tensorgrad.js";
const session = await start();
await session.exec(%s);
const train = await session.compile({ model: "MLP()", loss: "loss_fn",
  inputs: { x: [256, 1], y: [256, 1] }, optimizer: "tg.optim.Adam(lr=5e-3)", seed: 0 });
const x = new Float32Array(256).map((_, i) => -Math.PI + 2 * Math.PI * i / 255);
const r = await train.step({ x, y: x.map(Math.sin) });
console.log(`FIRST-STEP ${Date.now()} -1 ${r.loss}`);
</script>"""

TRANSFORMER = '''
import random, time, js
import tensorgrad as tg
import addition_model as m

STEPS = {steps}
rng = random.Random(1)
batches = [m.batch(rng) for _ in range(STEPS + 2)]
{setup}
for b in batches[:2]:
    r = await train.step(**b)
t0 = time.perf_counter()
for b in batches[2:]:
    r = await train.step(**b)
    assert r.kind == "completed", r
rate = STEPS / (time.perf_counter() - t0)
js.console.log(f"STEPS-PER-S {{rate}} {{r.loss}}")
'''
SETUP_IN_PROCESS = '''train = await tg.compile(model=m.AdditionTransformer(), loss=m.loss_fn, inputs=m.INPUTS,
                         optimizer=m.optimizer(), seed=1)'''
SETUP_DEDICATED = '''import tensorgrad.web
session = await tensorgrad.web.start()
await session.exec(open("addition_model.py").read())
train = await session.compile(model="AdditionTransformer()", loss="loss_fn",
    inputs={"tokens": [[128, 8], "i32"], "targets": [[128, 8], "i32"], "mask": [8]},
    optimizer="optimizer()", seed=1)'''


def pyscript_page(source: str, wheel: str, worker: bool, files: dict[str, str]) -> str:
    """A PyScript page running `source` on the page or in a worker (the documented configs)."""
    if worker:
        config = {"interpreter": "/pyodide/pyodide.mjs",
                  "files": {f"/{wheel}": f"./{wheel}", **files},
                  "packages": [f"emfs:./{wheel}"]}
    else:
        config = {"interpreter": "/pyodide/pyodide.mjs", "files": files,
                  "packages": [f"/{wheel}"]}
    tag = "worker " if worker else ""
    return ('<!doctype html><meta charset="utf-8">\n'
            '<script type="module" src="/pyscript/core.js"></script>\n'
            f"<script type=\"py\" {tag}config='{json.dumps(config)}'>\n{source}\n</script>\n")


def chromium_pss() -> int:
    """Proportional set size (shared pages split between their users) of every Chromium
    process this script started (the descendants of its Playwright driver), bytes."""
    import psutil

    total = 0
    for p in psutil.Process().children(recursive=True):
        try:
            if "chromium" in p.name() or "chrome" in p.name():
                total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def wait_console(page: Any, lines: list[str], prefix: str, timeout_s: float) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        found = [line for line in lines if line.startswith(prefix)]
        if found:
            return found[0]
        errors = [line for line in lines if line.startswith("[pageerror]")]
        if errors:
            raise RuntimeError("\n".join(errors + lines[-20:]))
        page.wait_for_timeout(100)
    raise TimeoutError(f"no {prefix} line in {timeout_s} s:\n" + "\n".join(lines[-20:]))


def first_step(pw: Any, url: str, name: str) -> dict[str, Any]:
    """Open `url` in a fresh Chromium; ms from navigation to FIRST-STEP, memory then."""
    browser = pw.chromium.launch(executable_path=str(build.CHROMIUM), args=build.CHROMIUM_ARGS)
    try:
        page = browser.new_page()
        lines: list[str] = []
        page.on("console", lambda m: lines.append(m.text))
        page.on("pageerror", lambda e: lines.append(f"[pageerror] {e}"))
        page.goto(url)
        origin = page.evaluate("performance.timeOrigin")
        line = wait_console(page, lines, "FIRST-STEP ", 600)
        pss = chromium_pss()
        epoch, wasm, loss = line.split()[1:4]
        return {"env": name, "first_step_s": (float(epoch) - origin) / 1000,
                "chromium_pss_mb": pss / 2**20,
                "wasm_mb": int(wasm) / 2**20 if int(wasm) > 0 else None, "loss": float(loss)}
    finally:
        browser.close()


def transformer_rates(pw: Any, base: str, steps: int) -> list[dict[str, Any]]:
    """Steps/s of the addition transformer in-process and through the dedicated worker,
    one Chromium launch."""
    browser = pw.chromium.launch(executable_path=str(build.CHROMIUM), args=build.CHROMIUM_ARGS)
    out = []
    try:
        for name in ("in-process (PyScript worker)", "dedicated worker (PyScript main)"):
            page = browser.new_page()
            lines: list[str] = []
            page.on("console", lambda m, lines=lines: lines.append(m.text))
            page.on("pageerror", lambda e, lines=lines: lines.append(f"[pageerror] {e}"))
            page.goto(base + ("bench-tf-worker.html" if "worker)" in name else
                              "bench-tf-main.html"))
            line = wait_console(page, lines, "STEPS-PER-S ", 1200)
            rate, loss = (float(v) for v in line.split()[1:3])
            out.append({"env": name, "steps_per_s": rate, "last_loss": loss, "steps": steps})
            page.close()
    finally:
        browser.close()
    return out


def write_pages(steps: int) -> None:
    web = build.WEB
    wheel = json.loads((web / "manifest.json").read_text())["wheel"]
    model = {"/demos/addition_transformer/model.py": "./addition_model.py"}
    (web / "bench-fs-worker.html").write_text(pyscript_page(IN_PROCESS, wheel, True, {}))
    (web / "bench-fs-main.html").write_text(pyscript_page(
        f"MODEL_SOURCE = {MLP!r}\n" + DEDICATED, wheel, False, {}))
    (web / "bench-fs-client.html").write_text(PAGE_CLIENT % json.dumps(MLP))
    (web / "bench-tf-worker.html").write_text(pyscript_page(
        TRANSFORMER.format(steps=steps, setup=SETUP_IN_PROCESS), wheel, True, model))
    (web / "bench-tf-main.html").write_text(pyscript_page(
        TRANSFORMER.format(steps=steps, setup=SETUP_DEDICATED), wheel, False, model))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-build", action="store_true", help="use dist/web as it is")
    parser.add_argument("--steps", type=int, default=10, help="timed transformer steps")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--only", choices=["first-step", "transformer"])
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    if not args.no_build:
        build.build_web()
        build.build_lite()
    write_pages(args.steps)
    server = build.serve_web(0, quiet=True)
    base = build.server_url(server)
    repl = ["%pip install tensorgrad-webgpu", IN_PROCESS.strip()]
    lite = (f"{base}lite/repl/index.html?kernel=python&"
            + "&".join("code=" + urllib.parse.quote(c) for c in repl))
    envs = [("jupyterlite", lite), ("pyscript-worker", base + "bench-fs-worker.html"),
            ("pyscript-main", base + "bench-fs-main.html"),
            ("page-client", base + "bench-fs-client.html")]
    figures: dict[str, Any] = {"first_step": [], "transformer": []}
    with sync_playwright() as pw:
        if args.only in (None, "first-step"):
            for name, url in envs:
                got = first_step(pw, url, name)
                figures["first_step"].append(got)
                wasm = f"{got['wasm_mb']:.0f} MB" if got["wasm_mb"] else "n/a"
                print(f"{name:16s} first step {got['first_step_s']:6.1f} s   Chromium PSS "
                      f"{got['chromium_pss_mb']:6.0f} MB   wasm heap {wasm}", flush=True)
        if args.only in (None, "transformer"):
            for got in transformer_rates(pw, base, args.steps):
                figures["transformer"].append(got)
                print(f"transformer {got['env']:34s} {got['steps_per_s']:.2f} steps/s "
                      f"(loss {got['last_loss']:.3f})", flush=True)
    server.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
