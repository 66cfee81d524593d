#!/usr/bin/env python3
"""tensorgrad in the browser: start-up, compile and training speed of both demos.

    python bench/bench_browser.py [--mlp-steps 100] [--transformer-steps 5] [--only NAME]
                                  [--chromium-arg=--use-angle=vulkan ...]

Builds dist/web/, serves it, opens headless Chromium (the system's; WebGPU on SwiftShader where
there is no GPU) and prints:

- time to ready: the worker's Pyodide load, micropip, wheel install and import, and the wall
  time the page waited for `start()`;
- per demo (demos/*/model.py, loaded into the worker): compile ms inside Pyodide (trace,
  autograd, optimizer, plan, WGSL, pipelines), kernel count, steps/s of the script-mode loop
  (Python in the worker: batches made in Python, `await train.step(...)`) after 2 warm-up steps,
  and the browser adapter's FFI calls (Python↔JS crossings) per step;
- for mlp_sin also steps/s through the page client (`train.step` with Float32Arrays
  transferred from the page), the path a JS application takes.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import build  # the repository's build.py

START = """async () => {
  const tg = await import("/tensorgrad.js");
  const t0 = performance.now();
  window.session = await tg.start();
  return { wallMs: performance.now() - t0, timings: session.timings };
}"""

# Python run in the worker: load a demo's model.py, compile, time steps. {demo}, {steps},
# {model}, {loss}, {predict} are filled in; the value is a JSON string.
SCRIPT_BENCH = """
import json, random, sys, time, types
import tensorgrad as tg
from pyodide.http import pyfetch
from tensorgrad.api import default_device

_src = await (await pyfetch({url!r})).string()
_m = types.ModuleType({module!r})
sys.modules[{module!r}] = _m
exec(compile(_src, {url!r}, "exec"), _m.__dict__)
_dev = await default_device()
_t0 = time.perf_counter()
_train = await tg.compile(model=_m.{model}(), loss=_m.loss_fn, inputs=_m.INPUTS,
                          optimizer=_m.optimizer(), seed=1)
_compile_ms = 1000 * (time.perf_counter() - _t0)
_rng = random.Random(0)
for _ in range(2):
    _r = await _train.step(**_m.batch(_rng))
    assert _r.kind == "completed", _r
_batches = [_m.batch(_rng) for _ in range({steps})]
_calls = _dev.ffi_calls
_t0 = time.perf_counter()
for _b in _batches:
    _r = await _train.step(**_b)
    assert _r.kind == "completed", _r
_step_s = (time.perf_counter() - _t0) / {steps}
_ffi = (_dev.ffi_calls - _calls) / {steps}
_t0 = time.perf_counter()
_b = _m.batch(_rng)
_batch_ms = 1000 * (time.perf_counter() - _t0)
_out = dict(compile_ms=_compile_ms, kernels=_train.kernel_count, step_ms=1000 * _step_s,
            steps_per_s=1 / _step_s, ffi_per_step=_ffi, batch_ms=_batch_ms, loss=_r.loss,
            device=_dev.description)
_train.destroy()
json.dumps(_out)
"""

PAGE_CLIENT_MLP = """async (steps) => {
  const train = await session.compile({ model: "_mlp.MLP()", loss: "_mlp.loss_fn",
    inputs: { x: [256, 1], y: [256, 1] }, optimizer: "_mlp.optimizer()", seed: 1 });
  const batch = () => {
    const x = new Float32Array(256).map(() => (2 * Math.random() - 1) * Math.PI);
    return { x, y: x.map(Math.sin) };
  };
  for (let i = 0; i < 2; i++) await train.step(batch());
  const batches = Array.from({ length: steps }, batch);
  const t0 = performance.now();
  for (const b of batches) {
    const r = await train.step(b);
    if (r.kind !== "completed") throw new Error(r.error?.message ?? r.kind);
  }
  const ms = (performance.now() - t0) / steps;
  await train.destroy();
  return { stepMs: ms, stepsPerS: 1000 / ms };
}"""

DEMOS = {
    "mlp_sin": {"model": "MLP"},
    "addition_transformer": {"model": "AdditionTransformer"},
}


def exec_py(page, source: str) -> str | None:
    reply = page.evaluate("""async (src) => {
      try { return { ok: true, result: await session.exec(src) }; }
      catch (e) { return { ok: false, error: e.traceback || e.message }; }
    }""", source)
    if not reply["ok"]:
        raise RuntimeError(f"in the worker:\n{reply['error']}")
    return reply["result"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mlp-steps", type=int, default=100)
    parser.add_argument("--transformer-steps", type=int, default=5)
    parser.add_argument("--only", choices=sorted(DEMOS), action="append")
    parser.add_argument("--chromium-arg", action="append", default=[],
                        help="extra Chromium flag (repeatable)")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    steps = {"mlp_sin": args.mlp_steps, "addition_transformer": args.transformer_steps}

    from playwright.sync_api import sync_playwright

    build.install_browser_deps()
    build.build_web()
    server = build.serve_web(quiet=True)
    url = build.server_url(server)
    figures: dict = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(build.CHROMIUM),
                                     args=[*build.CHROMIUM_ARGS, *args.chromium_arg])
        page = browser.new_page()
        page.on("pageerror", lambda e: print(f"[pageerror] {e}", flush=True))
        page.goto(url + "index.html")
        ready = page.evaluate(START)
        t = ready["timings"]
        figures["ready"] = ready
        print(f"Chromium {browser.version}, {url}")
        print(f"time to ready: {ready['wallMs']:.0f} ms (worker: Pyodide {t['pyodideMs']} ms, "
              f"micropip {t['micropipMs']} ms, wheel {t['wheelMs']} ms, import "
              f"{t['importMs']} ms, total {t['totalMs']} ms)", flush=True)
        for name in args.only or DEMOS:
            spec = DEMOS[name]
            source = SCRIPT_BENCH.format(url=f"{url}demos/{name}/model.py",
                                         module=f"bench_{name}_model", model=spec["model"],
                                         steps=steps[name])
            t0 = time.perf_counter()
            out = json.loads(ast.literal_eval(exec_py(page, source)))
            out["wall_s"] = time.perf_counter() - t0
            figures[name] = out
            if name == "mlp_sin":
                exec_py(page, f"import sys, types\nfrom pyodide.http import pyfetch\n"
                        f"_mlp = types.ModuleType('bench_mlp_page')\n"
                        f"exec(await (await pyfetch('{url}demos/mlp_sin/model.py')).string(),"
                        f" _mlp.__dict__)")
                client = page.evaluate(PAGE_CLIENT_MLP, steps[name])
                out["page_client_steps_per_s"] = client["stepsPerS"]
            print(f"{name}: compile {out['compile_ms']:.0f} ms in Pyodide, {out['kernels']} "
                  f"kernels, {out['steps_per_s']:.2f} steps/s ({out['step_ms']:.1f} ms/step, "
                  f"+ {out['batch_ms']:.1f} ms to make a batch in Python) over {steps[name]} steps, "
                  f"{out['ffi_per_step']:.1f} FFI calls/step"
                  + (f"; page client {out['page_client_steps_per_s']:.2f} steps/s"
                     if "page_client_steps_per_s" in out else ""), flush=True)
        print(f"device: {figures[next(iter(args.only or DEMOS))]['device']}")
        browser.close()
    server.shutdown()
    if args.json:
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
