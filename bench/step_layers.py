#!/usr/bin/env python3
"""Where a training step's time goes in the browser: one demo's step timed at each layer of
the stack, in one headless Chromium launch (WebGPU on SwiftShader here).

    python bench/step_layers.py [--demo mlp_sin] [--steps 300] [--rounds 2] [--no-build]

The demo's model is compiled once in the worker; its compiled program is then run through
each layer, every step awaited unless said otherwise (ms a step, best of --rounds):

  js execute         the program run from one JS loop (browser.mjs `execute`): the GPU work,
                     its submission and the readback's map; no Python
  js 4 in flight     the same through `submit`, four steps in flight
  adapter            BrowserDevice.execute called from Python (the FFI, the arguments' blob)
  executable         Executable.submit and its readback (the input checks, the unpacking)
  training           Training.step in the worker (script mode: the host scalars, the step
                     guard, the results)
  page await         Training.step through the page client (web/tensorgrad.js): a message
                     to the worker and its answer a step
  page 4 in flight   the same with four steps in flight

A layer's figure minus the one above it is what that layer adds. On this 2-core machine the
CPU time of any layer also takes time from SwiftShader, which runs the kernels on the same
cores. The same inputs are written every step in the js/adapter/executable rows.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import build  # the repository's build.py
from bench.bench_browser import exec_py  # session.exec: the value's repr, or raise

DEMOS = {"mlp_sin": "MLP", "addition_transformer": "AdditionTransformer"}

START = """async () => {
  const tg = await import("/tensorgrad.js");
  window.session = await tg.start();
}"""

# Run in the worker; {url}, {demo}, {model}, {steps}, {rounds} are filled in. The value is
# a JSON string: {layer: ms a step}.
LAYERS = """
import json, random, sys, time, types
import js
import tensorgrad as tg
from pyodide.http import pyfetch
from tensorgrad.api import default_device
from tensorgrad.gpu import browser

_m = types.ModuleType("step_layers_model")
exec(await (await pyfetch("{url}demos/{demo}/model.py")).string(), _m.__dict__)
sys.modules["step_layers_model"] = _m
dev = await default_device()
train = await tg.compile(model=_m.{model}(), loss=_m.loss_fn, inputs=_m.INPUTS,
                         optimizer=_m.optimizer(), seed=1)
rng = random.Random(0)
batches = [_m.batch(rng) for _ in range({steps})]
while train._live_exe().quick:  # the tiered start's optimized kernels swapped in
    await train.step(**batches[0])
for b in batches[:20]:
    await train.step(**b)
exe = train._live_exe()
seen = {{}}
submit = exe.submit

async def capture(feeds, *args, **kwargs):
    seen["feeds"] = dict(feeds)
    return await submit(feeds, *args, **kwargs)

exe.submit = capture
await train.step(**batches[0])
del exe.submit
feeds = seen["feeds"]
writes = [(exe.buffer_of(node.id), feeds[name]) for name, node in exe.inputs.items()]
reads = exe._reads(True)[0]
helper = await browser._js_helper()
args = await dev._step_args(writes, reads)
js_loop = js.Function.new("h", "s", "p", "a", "n", "depth", '''return (async () => {{
  const t0 = performance.now(), queue = [];
  for (let i = 0; i < n; i++) {{
    if (depth === 1) {{ await h.execute(s, p, a); continue; }}
    const job = h.submit(s, p, a);
    if (job.ready) await job.ready;
    queue.push(job.readback);
    if (queue.length >= depth) await queue.shift();
  }}
  await Promise.all(queue);
  return (performance.now() - t0) / n; }})();''')


async def timed(run):
    t0 = time.perf_counter()
    for b in batches:
        await run(b)
    return 1000 * (time.perf_counter() - t0) / len(batches)


async def adapter(b):
    await dev.execute(exe.program, writes, reads)


async def executable(b):
    await (await exe.submit(feeds))


async def training(b):
    await train.step(**b)

best = {{}}
for _ in range({rounds}):
    got = {{"js execute": await js_loop(helper, dev._state, exe.program.plan, args, {steps}, 1),
           "js 4 in flight": await js_loop(helper, dev._state, exe.program.plan, args,
                                           {steps}, 4),
           "adapter": await timed(adapter), "executable": await timed(executable),
           "training": await timed(training)}}
    best = {{k: min(v, best.get(k, v)) for k, v in got.items()}}
best["kernels"] = train.kernel_count
train.destroy()
json.dumps(best)
"""

# The page client: the demo's model compiled again from the page; (steps, rounds, inputs).
PAGE = """async ([steps, rounds, inputs]) => {
  const train = await session.compile({ model: "_layers.MODEL()", loss: "_layers.loss_fn",
    inputs, optimizer: "_layers.optimizer()", seed: 1 });
  // (exec answers the repr of the JSON string: no quotes or backslashes inside)
  const batches = JSON.parse((await session.exec("_layers.batches_json()")).slice(1, -1));
  const make = (i) => Object.fromEntries(Object.entries(batches[i % batches.length]).map(
    ([k, [dtype, v]]) => [k, dtype === "i32" ? Int32Array.from(v) : Float32Array.from(v)]));
  const step = async (i) => {
    const r = await train.step(make(i));
    if (r.kind !== "completed") throw new Error(r.error?.message ?? r.kind);
  };
  for (let i = 0; i < 40; i++) await step(i);
  const best = { "page await": Infinity, "page 4 in flight": Infinity };
  for (let round = 0; round < rounds; round++) {
    let t0 = performance.now();
    for (let i = 0; i < steps; i++) await step(i);
    best["page await"] = Math.min(best["page await"], (performance.now() - t0) / steps);
    t0 = performance.now();
    const queue = [];
    for (let i = 0; i < steps; i++) {
      queue.push(step(i));
      if (queue.length >= 4) await queue.shift();
    }
    await Promise.all(queue);
    best["page 4 in flight"] = Math.min(best["page 4 in flight"],
                                        (performance.now() - t0) / steps);
  }
  await train.destroy();
  return best;
}"""

# The page's batches, made by the demo's own batch() in the worker (as lists, per input).
PAGE_SETUP = """
import json, random, types
from pyodide.http import pyfetch
_layers = types.ModuleType("step_layers_page")
exec(await (await pyfetch("{url}demos/{demo}/model.py")).string(), _layers.__dict__)
_layers.MODEL = _layers.{model}


def _batches_json(n=64):
    rng = random.Random(1)
    out = []
    for _ in range(n):
        b = _layers.batch(rng)
        out.append({{k: ["i32" if v.typecode in "il" else "f32", list(v)]
                    for k, v in b.items()}})
    return json.dumps(out)


_layers.batches_json = _batches_json
json.dumps({{k: list(v) for k, v in _layers.INPUTS.items()}})
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", choices=sorted(DEMOS), default="mlp_sin")
    parser.add_argument("--steps", type=int, default=300, help="steps a layer and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (the best is shown)")
    parser.add_argument("--no-build", action="store_true", help="serve dist/web as it is")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    build.install_browser_deps()
    if not args.no_build:
        build.build_web()
    server = build.serve_web(quiet=True)
    url = build.server_url(server)
    fill = {"url": url, "demo": args.demo, "model": DEMOS[args.demo], "steps": args.steps,
            "rounds": args.rounds}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(build.CHROMIUM),
                                     args=build.CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(url + "index.html")
        page.evaluate(START)
        figures = json.loads(ast.literal_eval(exec_py(page, LAYERS.format(**fill))))
        inputs = json.loads(ast.literal_eval(exec_py(page, PAGE_SETUP.format(**fill))))
        figures.update(page.evaluate(PAGE, [args.steps, args.rounds, inputs]))
        print(f"Chromium {browser.version}, {args.demo} ({figures.pop('kernels')} kernels), "
              f"{args.steps} steps a layer, best of {args.rounds}")
        browser.close()
    server.shutdown()
    previous = None
    for layer, ms in figures.items():
        added = "" if previous is None or "in flight" in layer else f"  ({ms - previous:+.2f})"
        print(f"  {layer:<18} {ms:6.2f} ms  {1000 / ms:7.1f} steps/s{added}")
        if "in flight" not in layer:
            previous = ms
    return 0


if __name__ == "__main__":
    sys.exit(main())
