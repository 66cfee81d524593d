#!/usr/bin/env python3
"""tensorgrad against jax-js in one headless Chromium launch (WebGPU; SwiftShader here).

    python bench/bench_peers.py [--launches 3] [--only mlp|transformer] [--mlp-steps 100]
                                [--transformer-steps 8] [--rounds 3] [--no-build] [--json]
    python bench/bench_peers.py --smoke       # one launch, few steps: does everything run?

Workloads: the MLP 1-64-64-1 (batch 256, Adam, MSE on sin; demos/mlp_sin/model.py) and the
addition transformer (demos/addition_transformer/model.py; its jax-js twin is
bench/peers/jax_twins.mjs). Their initial params (tensorgrad's init with the bench's seed)
and batches (the demo's own batch()) are made once here and served to every page
(/peers-data/), so both libraries train from the same values on the same data; the first
steps' losses must agree (--tolerance, relative) or the bench fails.

Contenders, each a fresh page in a fresh browser context (an empty HTTP cache: a first visit):
tensorgrad's page client (web/tensorgrad.js; bench/peers/tensorgrad.html), tensorgrad in
script mode (the loop in Python in the worker; ?mode=script) and jax-js (npm @jax-js/jax,
pinned in package.json's devDependencies, served from node_modules; bench/peers/jaxjs.html).
Figures, the median over the launches (each launch runs every page once, in turn, each launch
starting with the next contender, so that a machine whose speed drifts favours none):

  ready      from the page script's import of the library to the library usable (tensorgrad:
             start() resolved, its worker ready; jax-js: import + init("webgpu"))
  compile+1  from asking for the compiled step to the first step's loss in hand
  first at   page wall time to the first trained step, from navigation start
  steps/s    steady speed, every loss read: each step awaited before the next is sent, and
             (page client, jax-js) one step sent ahead of reading the last one's loss (2 in
             flight), and pipelined: three steps sent ahead (4 in flight)

The bench needs no network: the bundle (dist/web/, built unless --no-build), node_modules and
the fixture are served from 127.0.0.1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import build  # the repository's build.py

PEERS = ROOT / "bench" / "peers"
JAX_JS = ROOT / "node_modules" / "@jax-js" / "jax"
DEMOS = {"mlp": ("mlp_sin", "MLP"), "transformer": ("addition_transformer",
                                                    "AdditionTransformer")}
SEED = 1
CONTENDERS = (("tensorgrad", "page"), ("tensorgrad", "script"), ("jax-js", "page"))


def demo_module(kind: str) -> ModuleType:
    """The demo's model.py, imported from its file."""
    folder, _ = DEMOS[kind]
    path = ROOT / "demos" / folder / "model.py"
    spec = importlib.util.spec_from_file_location(f"bench_peers_{folder}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _input_specs(inputs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, decl in inputs.items():
        shape, dtype = (decl if isinstance(decl[-1], str) else (decl, "f32"))
        out[name] = {"shape": list(shape), "dtype": dtype}
    return out


def make_fixture(kind: str, batches: int, seed: int = SEED) -> tuple[dict[str, Any], bytes]:
    """(meta, blob): the initial params (tensorgrad's init, `seed`) and `batches` batches (the
    demo's batch() with random.Random(seed)), as fixture.mjs reads them."""
    module = demo_module(kind)
    model = getattr(module, DEMOS[kind][1])()
    specs = model.named_params()
    values = model.init_params(seed)
    blob = bytearray()
    params = []
    for name, spec in specs.items():
        data = memoryview(values[name]).cast("B")
        params.append({"name": name, "shape": list(spec.shape), "decay": bool(spec.decay),
                       "offset": len(blob), "size": spec.size})
        blob += data
    inputs = _input_specs(module.INPUTS)
    rng = random.Random(seed)
    made = []
    for _ in range(batches):
        entry = {}
        for name, data in module.batch(rng).items():
            view = memoryview(data).cast("B")
            entry[name] = [len(blob), view.nbytes // 4]
            blob += view
        made.append(entry)
    meta = {"kind": kind, "seed": seed, "params": params, "inputs": inputs, "batches": made}
    return meta, bytes(blob)


def write_fixtures(folder: Path, steps: dict[str, int], check: int, warmup: int) -> None:
    for kind, n in steps.items():
        meta, blob = make_fixture(kind, check + warmup + 2 * n + 20)  # (cycled past that)
        (folder / f"{kind}.json").write_text(json.dumps(meta))
        (folder / f"{kind}.bin").write_bytes(blob)


def jax_js_version() -> str:
    return json.loads((JAX_JS / "package.json").read_text())["version"]


def run_page(browser: Any, url: str, timeout_s: float) -> dict[str, Any]:
    """Open `url` in a fresh context; the page's window.benchResult."""
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(url)
        page.wait_for_function("window.benchResult !== undefined", timeout=timeout_s * 1000)
        return page.evaluate("""async () => {
          try { return { ok: true, ...(await window.benchResult) }; }
          catch (e) { return { ok: false, error: String(e?.stack ?? e) }; }
        }""")
    except Exception as exc:  # noqa: BLE001 (reported with the page's own errors)
        return {"ok": False, "error": f"{exc}; page errors: {errors}"}
    finally:
        context.close()


def check_losses(kind: str, runs: list[dict[str, Any]], tolerance: float) -> list[str]:
    """Problems (empty when none): each run's first losses against the first run's."""
    problems = []
    ref = runs[0]
    for run in runs[1:]:
        for i, (a, b) in enumerate(zip(ref["losses"], run["losses"])):
            if abs(a - b) > tolerance * max(1.0, abs(a)):
                problems.append(f"{kind}: step {i + 1} loss {ref['library']} {ref['mode']} "
                                f"{a:.6f} vs {run['library']} {run['mode']} {b:.6f}")
        if len(run["losses"]) != len(ref["losses"]):
            problems.append(f"{kind}: {run['library']} {run['mode']} gave "
                            f"{len(run['losses'])} losses, {ref['library']} {len(ref['losses'])}")
    return problems


FIGURES = (("ready", "readyMs", "ms"), ("compile+1", "compileFirstMs", "ms"),
           ("first at", "firstStepAt", "ms"), ("steps/s await", "awaitEach", "/s"),
           ("steps/s ahead", "ahead", "/s"), ("steps/s 4 in flight", "pipelined", "/s"))
STEADY = ("awaitEach", "ahead", "pipelined")


def figure(run: dict[str, Any], key: str) -> float | None:
    value = run.get("stepsPerS", {}).get(key) if key in STEADY else run.get(key)
    return value if isinstance(value, (int, float)) else None


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """{kind: {"library mode": {figure: median}}}."""
    out: dict[str, dict[str, Any]] = {}
    for key, runs in results.items():
        kind, who = key.split("|", 1)
        out.setdefault(kind, {})[who] = {
            name: median([v for r in runs if (v := figure(r, field)) is not None])
            for name, field, _ in FIGURES}
    return out


def print_table(summary: dict[str, dict[str, Any]], launches: int) -> None:
    """Per workload the medians of every contender, and the ratios of tensorgrad's page
    client to jax-js (and to the baseline's page client, with --baseline)."""
    for kind, rows in summary.items():
        print(f"\n{kind} (median of {launches} launches)")
        whos = list(rows)
        pairs = [(b, f"tg page / {b.split()[0]}") for b in ("jax-js page", "before page")
                 if b in rows and "tensorgrad page" in rows]
        print(f"  {'':16}" + "".join(f"{w:>20}" for w in whos)
              + "".join(f"{title:>20}" for _, title in pairs))
        for name, _, unit in FIGURES:
            cells = [rows[w][name] for w in whos]
            text = "".join(f"{'—' if c is None else f'{c:,.1f} {unit}':>20}" for c in cells)
            ours = rows.get("tensorgrad page", {}).get(name)
            for other, _ in pairs:
                theirs = rows[other].get(name)
                text += f"{f'{ours / theirs:.2f}x' if ours and theirs else '—':>20}"
            print(f"  {name:16}{text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--only", choices=sorted(DEMOS), action="append")
    parser.add_argument("--mlp-steps", type=int, default=100)
    parser.add_argument("--transformer-steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1, help="steady speed measured this "
                        "many times each way, the ways taking turns; the median (default 1)")
    parser.add_argument("--check", type=int, default=5, help="first steps whose losses must "
                        "agree between the libraries (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up steps (at least)")
    parser.add_argument("--warmup-seconds", type=float, default=5, help="warm-up steps go "
                        "on until this long after the first step (a tiered start swaps its "
                        "optimized kernels in meanwhile; default 5)")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--contender", action="append", choices=[
        f"{lib}:{mode}" for lib, mode in (*CONTENDERS, ("before", "page"), ("before", "script"))],
        help="run only these (repeatable)")
    parser.add_argument("--no-build", action="store_true", help="serve dist/web/ as it is")
    parser.add_argument("--web", type=Path, help="serve this built bundle instead of dist/web/")
    parser.add_argument("--baseline", type=Path, help="another built bundle (e.g. an older "
                        "commit's dist/web/), run as the contenders 'before:page' and "
                        "'before:script' in the same launches")
    parser.add_argument("--smoke", action="store_true",
                        help="one launch, 3 steps each: check that every page runs")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per page")
    parser.add_argument("--json", action="store_true", help="also print every run as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.launches, args.mlp_steps, args.transformer_steps = 1, 3, 2
        args.check, args.warmup, args.warmup_seconds = 2, 1, 0
    kinds = args.only or list(DEMOS)
    steps = {"mlp": args.mlp_steps, "transformer": args.transformer_steps}
    steps = {k: steps[k] for k in kinds}
    known = [*CONTENDERS, *((("before", "page"), ("before", "script")) if args.baseline
                            else ())]
    contenders = [c for c in known if not args.contender or f"{c[0]}:{c[1]}" in args.contender]
    if not JAX_JS.is_dir():
        raise SystemExit(f"jax-js is missing ({JAX_JS}): npm ci installs the devDependencies")

    from playwright.sync_api import sync_playwright

    build.install_browser_deps()
    if not (args.no_build or args.web):
        build.build_web()
    results: dict[str, list[dict[str, Any]]] = {}
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tg-peers-") as tmp:
        write_fixtures(Path(tmp), steps, args.check, args.warmup)
        mounts = {"/bench-peers/": PEERS, "/jax-js/": JAX_JS / "dist", "/peers-data/": Path(tmp)}
        if args.baseline:
            mounts["/before/"] = args.baseline
        server = build.serve_web(directory=args.web or build.WEB, quiet=True, mounts=mounts)
        url = build.server_url(server)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(build.CHROMIUM),
                                         args=build.CHROMIUM_ARGS)
            print(f"Chromium {browser.version}, jax-js {jax_js_version()}, {url}; load "
                  f"average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            for launch in range(args.launches):
                # each launch starts with the next contender: a machine that speeds up or
                # slows down during a launch then favours none of them
                turn = launch % len(contenders)
                for kind in kinds:
                    for lib, mode in contenders[turn:] + contenders[:turn]:
                        page = "jaxjs.html" if lib == "jax-js" else "tensorgrad.html"
                        query = (f"?kind={kind}&mode={mode}&check={args.check}&warmup="
                                 f"{args.warmup}&steps={steps[kind]}&warmupSeconds="
                                 f"{args.warmup_seconds}&rounds={args.rounds}"
                                 + ("&root=/before/" if lib == "before" else ""))
                        t0 = time.perf_counter()
                        run = run_page(browser, f"{url}bench-peers/{page}{query}", args.timeout)
                        if not run.get("ok"):
                            problems.append(f"{kind} {lib} {mode}: {run.get('error')}")
                            print(f"  [{launch + 1}] {kind} {lib} {mode}: FAILED "
                                  f"{run.get('error')}", flush=True)
                            continue
                        run["library"] = lib
                        results.setdefault(f"{kind}|{lib} {mode}", []).append(run)
                        rates = ", ".join(f"{k} {v:.2f}" for k, v in run["stepsPerS"].items())
                        print(f"  [{launch + 1}] {kind} {lib} {mode}: ready {run['readyMs']:.0f}"
                              f" ms, compile+1 {run['compileFirstMs']:.0f} ms, first at "
                              f"{run['firstStepAt']:.0f} ms, steps/s {rates} ({time.perf_counter() - t0:.1f} s)",
                              flush=True)
                for kind in kinds:
                    launch_runs = [r[launch] for key, r in results.items()
                                   if key.startswith(kind + "|") and len(r) > launch]
                    if len(launch_runs) > 1:
                        problems += check_losses(kind, launch_runs, args.tolerance)
            browser.close()
        server.shutdown()
    print_table(summarize(results), args.launches)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        print(json.dumps(results, indent=2))
    if problems:
        print("\nPROBLEMS:\n  " + "\n  ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
