"""Real training end to end in the browser: page client → worker → tg.compile → the browser GPU
adapter, with the step inputs transferred. The MLP sin demo's model reaches a low loss; the
addition transformer's first losses equal the native backend's; every kernel of the op-family
case tables matches the reference interpreter when run in the browser."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import random
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.models import demo

from .conftest import Page

MODEL = """
import tensorgrad as tg
import tensorgrad.optim

class MLP(tg.Module):
    def __init__(self):
        self.l1 = tg.Linear(4, 16)
        self.l2 = tg.Linear(16, 1)

    def __call__(self, x):
        return self.l2(tg.relu(self.l1(x)))

def loss_fn(model, x, y):
    d = model(x) - y
    return tg.mean(d * d)

hasattr(tg, "compile")
"""

TRAIN = """async () => {
  const t0 = performance.now();
  const train = await session.compile({ model: "MLP()", loss: "loss_fn",
    inputs: { x: [8, 4], y: [8, 1] }, optimizer: "tg.optim.Adam(lr=1e-2)", seed: 1 });
  const compileMs = performance.now() - t0;
  const data = () => {
    const x = new Float32Array(32).map((_, i) => ((i * 7) % 11) / 11);
    const y = new Float32Array(8).map((_, r) => x[4 * r] + x[4 * r + 1] + x[4 * r + 2] + x[4 * r + 3]);
    return { x, y };
  };
  const losses = [];
  let detached = true;
  const t1 = performance.now();
  for (let i = 0; i < 60; i++) {
    const inputs = data();
    const r = await train.step(inputs);
    if (r.kind !== "completed") return { failed: r.kind, error: r.error?.message };
    losses.push(r.loss);
    detached &&= inputs.x.byteLength === 0 && inputs.y.byteLength === 0;
  }
  const stepMs = (performance.now() - t1) / 60;
  const short = await train.step({ x: new Float32Array(3), y: new Float32Array(8) });
  const params = await train.downloadParams();
  await train.destroy();
  return { compileMs, stepMs, kernels: train.kernelCount, names: train.paramNames,
           first: losses[0], last: losses.at(-1), detached, short: short.kind,
           shortError: short.error?.message,
           paramTypes: Object.values(params).map((p) => p.constructor.name) };
}"""


def test_mlp_trains_in_the_browser(tg: Page) -> None:
    assert tg.exec(MODEL) == "True", "tensorgrad.compile must be exported"
    out = tg.js(TRAIN)
    print(f"\nbrowser training: compile {out.get('compileMs', 0):.0f} ms, "
          f"{out.get('stepMs', 0):.2f} ms/step, {out.get('kernels')} kernels, "
          f"loss {out.get('first')} -> {out.get('last')}")
    assert "failed" not in out, out
    assert out["detached"], "step inputs were copied, not transferred"
    assert out["names"] == ["l1.W", "l1.b", "l2.W", "l2.b"] and out["kernels"] > 0
    assert out["last"] < out["first"] / 10, out
    assert set(out["paramTypes"]) == {"Float32Array"}
    assert out["short"] == "failed" and "'x'" in out["shortError"], out  # the compiler's check


# ---------------------------------------------------------------------------------------------
# Steps in flight through the page client: a step gives its turn up once submitted.

# In the worker: count the device's step submissions (through submit, and submit_now: the
# worker's express steps); the readback of the first step whose x (the only 128-byte write)
# holds a NaN waits until 3 more steps were submitted, so they are in flight, speculatively,
# when its skip is learnt, however fast the GPU. {express}: whether the device takes express
# steps (submitted at once, outside the event loop).
HOLD_NAN_STEP = """
import asyncio, math
import tensorgrad.web.worker as loop
express_before = loop.SESSION.express_steps
train = loop.SESSION.graphs[{graph}].obj
exe = train._exe  # its tiered start finished first: every step then runs the same kernels
if exe.upgrade is not None:
    exe._start_upgrade()
while exe.upgrading is not None:
    if exe.upgrading[1].ready():
        exe._swap_in_upgrade()
    else:
        await asyncio.sleep(0.01)
dev = train.device
dev.submits_now = {express}
submit, submit_now = dev.submit, dev.submit_now
submits, held = [0], []

def holds_nan(writes):
    return not held and any(len(bytes(d)) == 128 and
                            any(map(math.isnan, memoryview(bytes(d)).cast("f")))
                            for _, d in writes)

three_more = asyncio.Event()  # (no polling: a timer would keep the loop busy)

def count(taken=1):
    submits[0] += taken
    if held and submits[0] >= held[0][1] + 3:
        three_more.set()

async def until_three_more():
    await asyncio.wait_for(three_more.wait(), 30)

async def counted(program, writes, reads):
    count()
    me = submits[0]
    readback = await submit(program, writes, reads)
    if not holds_nan(writes):
        return readback
    held.append(("submit", me))

    async def later():
        await until_three_more()
        return await readback
    return later()

def counted_now(program, writes, reads, done):
    if not holds_nan(writes):
        taken = submit_now(program, writes, reads, done)
        count(taken)
        return taken
    me = submits[0] + 1

    def arrived(got):
        async def later():
            await until_three_more()
            done(got)
        asyncio.get_event_loop().create_task(later())

    taken = submit_now(program, writes, reads, arrived)
    if taken:
        submits[0], _ = me, held.append(("submit_now", me))
    return taken

dev.submit, dev.submit_now = counted, counted_now
"""

IN_FLIGHT = """async ({ n, bad, hold }) => {
  const spec = { model: "MLP()", loss: "loss_fn", inputs: { x: [8, 4], y: [8, 1] }, seed: 2,
    optimizer: "tg.optim.Adam(lr=tg.lr.warmup(0.05, 3, tg.lr.cosine_annealing(0.05, 0.001, 10)))" };
  const batch = (i) => {
    const x = new Float32Array(32).map((_, k) => Math.sin(0.7 * i + 0.3 * k));
    if (i === bad) x[5] = NaN;
    const y = new Float32Array(8).map((_, r) => x[4 * r] - 0.5 * x[4 * r + 3]);
    return { x, y };
  };
  const outcome = (r) => r.kind === "completed" ? r.loss : `${r.kind}: ${r.error?.message}`;
  const plain = (p) => Object.fromEntries(Object.entries(p).map(([k, v]) => [k, Array.from(v)]));
  // Each graph's first step is awaited alone (its program and kernels are then checked,
  // so the steps after it can all be submitted at once: see the hold's express_steps).
  const awaited = await session.compile(spec);
  await awaited.step(batch(-1));
  const one = [];
  for (let i = 0; i < n; i++) one.push(outcome(await awaited.step(batch(i))));
  const paramsAwaited = plain(await awaited.downloadParams());
  await awaited.destroy();
  const together = await session.compile(spec);
  await together.step(batch(-1));
  await session.exec(hold.replace("{graph}", String(together.graphId)));
  const inFlight = [], four = [];
  for (let i = 0; i < n; i++) {
    inFlight.push(together.step(batch(i)));
    if (inFlight.length === 4) four.push(outcome(await inFlight.shift()));
  }
  for (const r of await Promise.all(inFlight)) four.push(outcome(r));
  const paramsFour = plain(await together.downloadParams());
  const counts = await session.exec("dev.submit, dev.submit_now = submit, submit_now\\n" +
    "dev.submits_now = True\\n(submits[0], held, loop.SESSION.express_steps - express_before)");
  await together.destroy();
  return { one, four, paramsAwaited, paramsFour, counts };
}"""


@pytest.mark.parametrize("express", [True, False], ids=["express", "handle"])
def test_steps_in_flight_through_the_page_client_match_awaited_steps(tg: Page, express: bool
                                                                     ) -> None:
    """Four steps in flight from the page, Adam with a warmup and cosine schedule, a NaN batch
    among them: its step fails naming its own step and input, the steps sent after it (skipped
    on the GPU, their step counter assumed one too far) are submitted again, and every loss
    and param equals those of steps awaited one by one, bit for bit; with the worker's
    express steps (submitted without the event loop) as without."""
    assert tg.exec(MODEL) == "True"
    n, bad = 14, 5
    hold = HOLD_NAN_STEP.replace("{express}", str(express))
    out = tg.js(IN_FLIGHT, {"n": n, "bad": bad, "hold": hold})
    assert out["one"][bad].startswith("failed: loss is nan at step 7"), out["one"]
    assert "input 'x' holds nan at flat index 5" in out["one"][bad], out["one"]
    assert all(isinstance(v, float) for k, v in enumerate(out["one"]) if k != bad), out["one"]
    assert out["four"] == out["one"]
    assert out["paramsFour"] == out["paramsAwaited"]
    submits, held, express_steps = ast.literal_eval(out["counts"])
    assert submits > n  # the steps after the NaN batch were submitted again
    assert held, "the NaN step's readback was not held back"
    if express:  # the steps up to the NaN step's three after it, at least
        assert express_steps >= bad + 4 and held[0][0] == "submit_now", out["counts"]
    else:
        assert express_steps == 0, out["counts"]


# ---------------------------------------------------------------------------------------------
# The MLP sin demo's model through the page client: compile, then step() with Float32Arrays.

ROOT = Path(__file__).resolve().parents[2]

# Load a demo's model.py as a module of its own (the shared namespace keeps other tests' names).
LOAD_DEMO_MODEL = """
import sys, types
from pyodide.http import pyfetch
_src = await (await pyfetch({url!r})).string()
{name} = types.ModuleType({module!r})
sys.modules[{module!r}] = {name}
exec(compile(_src, {url!r}, "exec"), {name}.__dict__)
{name}.__name__
"""


def load_demo_model(tg: Page, web_url: str, demo: str, name: str) -> None:
    url = f"{web_url}demos/{demo}/model.py"
    tg.exec(LOAD_DEMO_MODEL.format(url=url, name=name, module=f"{demo}_model"))


MLP_SIN = """async ({ maxSteps, target }) => {
  const t0 = performance.now();
  const train = await session.compile({ model: "mlp_sin.MLP()", loss: "mlp_sin.loss_fn",
    inputs: { x: [256, 1], y: [256, 1] }, optimizer: "mlp_sin.optimizer()", seed: 1 });
  const compileMs = performance.now() - t0;
  let s = 12345;  // mulberry32: deterministic batches
  const rand = () => {
    s = (s + 0x6D2B79F5) | 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const losses = [];
  let detached = true, reached = null;
  const t1 = performance.now();
  for (let i = 1; i <= maxSteps && reached === null; i++) {
    const x = new Float32Array(256).map(() => (2 * rand() - 1) * Math.PI);
    const y = x.map(Math.sin);
    const inputs = { x, y };
    const r = await train.step(inputs);
    if (r.kind !== "completed") return { failed: r.kind, error: r.error?.message, step: i };
    detached &&= x.byteLength === 0 && y.byteLength === 0;
    losses.push(r.loss);
    if (r.loss < target) reached = i;
  }
  const ms = performance.now() - t1;
  await train.destroy();
  return { compileMs, reached, steps: losses.length, stepsPerS: 1000 * losses.length / ms,
           first: losses[0], last: losses.at(-1), detached, kernels: train.kernelCount };
}"""


def test_mlp_sin_reaches_low_loss_in_the_browser(tg: Page, web_url: str) -> None:
    load_demo_model(tg, web_url, "mlp_sin", "mlp_sin")
    out = tg.js(MLP_SIN, {"maxSteps": 1000, "target": 0.01})
    print(f"\nmlp_sin in the browser: compile {out.get('compileMs', 0):.0f} ms, "
          f"{out.get('kernels')} kernels, loss {out.get('first')} -> {out.get('last')} "
          f"(< 0.01 at step {out.get('reached')}), {out.get('stepsPerS', 0):.1f} steps/s")
    assert "failed" not in out, out
    assert out["reached"] is not None and out["reached"] <= 1000, out
    assert out["detached"], "step inputs were copied, not transferred"


# ---------------------------------------------------------------------------------------------
# The addition transformer: the browser's first losses equal the native backend's.

TRANSFORMER_STEPS = 10  # about 4 s a step in the browser on SwiftShader, 3 s natively (lavapipe)
TRANSFORMER_SEED = 7

TRANSFORMER = """async ({ batches, seed }) => {
  const t0 = performance.now();
  const train = await session.compile({ model: "addition.AdditionTransformer()",
    loss: "addition.loss_fn", inputs: { tokens: [[128, 8], "i32"], targets: [[128, 8], "i32"],
    mask: [8] }, optimizer: "addition.optimizer()", seed });
  const compileMs = performance.now() - t0;
  const losses = [];
  const t1 = performance.now();
  for (const b of batches) {
    const r = await train.step({ tokens: Int32Array.from(b.tokens),
      targets: Int32Array.from(b.targets), mask: Float32Array.from(b.mask) });
    if (r.kind !== "completed") return { failed: r.kind, error: r.error?.message, losses };
    losses.push(r.loss);
  }
  const stepMs = (performance.now() - t1) / batches.length;
  await train.destroy();
  return { compileMs, stepMs, losses, kernels: train.kernelCount };
}"""


@pytest.fixture(scope="module")
def run_native() -> Iterator[Callable[[Coroutine[Any, Any, Any]], Any]]:
    """Run coroutines on a thread of their own (Playwright's sync API holds this thread's
    event loop)."""
    with ThreadPoolExecutor(1, thread_name_prefix="native-gpu") as pool:
        yield lambda coro: pool.submit(asyncio.run, coro).result()


async def _native_losses(m: Any, batches: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    import tensorgrad as tg
    from tensorgrad.gpu.native import request_native_device

    device = await request_native_device()
    try:
        t0 = time.perf_counter()
        train = await tg.compile(model=m.AdditionTransformer(), loss=m.loss_fn, inputs=m.INPUTS,
                                 optimizer=m.optimizer(), device=device, seed=seed)
        compile_s = time.perf_counter() - t0
        losses = []
        for b in batches:
            r = await train.step(**b)
            assert r.kind == "completed", r
            losses.append(r.loss)
        train.destroy()
        return {"losses": losses, "compile_s": compile_s, "device": device.description}
    finally:
        device.destroy()


def test_transformer_losses_match_native(tg: Page, web_url: str, run_native: Any) -> None:
    m = demo("addition_transformer")
    rng = random.Random(TRANSFORMER_SEED)
    batches = [m.batch(rng) for _ in range(TRANSFORMER_STEPS)]
    t0 = time.perf_counter()
    native = run_native(_native_losses(m, batches, TRANSFORMER_SEED))
    native_s = time.perf_counter() - t0
    load_demo_model(tg, web_url, "addition_transformer", "addition")
    plain = [{k: list(v) for k, v in b.items()} for b in batches]
    out = tg.js(TRANSFORMER, {"batches": plain, "seed": TRANSFORMER_SEED})
    print(f"\ntransformer, {TRANSFORMER_STEPS} steps: native {native_s:.1f} s "
          f"({native['device']}); browser compile {out.get('compileMs', 0):.0f} ms, "
          f"{out.get('stepMs', 0):.0f} ms/step, {out.get('kernels')} kernels")
    for i, (a, b) in enumerate(zip(native["losses"], out.get("losses", []))):
        print(f"  step {i + 1}: native {a:.6f}  browser {b:.6f}  rel {abs(a - b) / abs(a):.2e}")
    assert "failed" not in out, out
    assert len(out["losses"]) == TRANSFORMER_STEPS
    for i, (a, b) in enumerate(zip(native["losses"], out["losses"])):
        assert abs(a - b) <= 1e-3 * abs(a), f"step {i + 1}: native {a} vs browser {b}"
    assert native["losses"][-1] < native["losses"][0]  # it trains


# ---------------------------------------------------------------------------------------------
# The kernel-vs-reference table of the native tests (tests/native/test_kernels_*.py), in the
# browser: each op family's CASES are built here (forward + backward graphs), the reference
# interpreter (NumPy, not in Pyodide) gives every node's value here, and the worker emits and
# runs every non-leaf node's kernel on the browser adapter from the reference inputs, in one
# request per family. The outputs come back and are compared here like check_graph_kernels.

# A function in the worker's namespace: kernel_check(blob: base64 pickle of [{graph, values:
# {id: bytes}, nodes}]) → {outputs: [{id: base64 bytes}], errors: [{id: message}], compiled,
# dispatches, ms}, called through an exec message.
KERNEL_CHECK = r'''
import base64, pickle, time
from tensorgrad.api import default_device
from tensorgrad.ops import OPS
from tensorgrad.codegen.kernel import Target, dispatch_size, emit_node
from tensorgrad.gpu.interface import Dispatch

async def kernel_check(blob):
    t0 = time.perf_counter()
    jobs = pickle.loads(base64.b64decode(blob))
    dev = await default_device()
    target = Target(limits=dev.limits)
    pipelines = {}  # WGSL text -> compiled kernel (many nodes share a shader)
    outputs, errors, dispatches = [], [], 0
    for job in jobs:
        graph, buffers, steps, reads, ids = job["graph"], {}, [], [], []
        errs = {}
        for nid, data in job["values"].items():
            buffers[nid] = dev.create_buffer(max(4, len(data)), f"in%{nid}")
            dev.write_buffer(buffers[nid], data)
        for nid in job["nodes"]:
            node = graph[nid]
            try:
                kernel = emit_node(graph, node, target, OPS)
                if kernel.threads == 0:
                    raise AssertionError(f"{node.describe()} emitted no dispatch")
                pipeline = pipelines.get(kernel.wgsl)
                if pipeline is None:
                    pipeline = pipelines[kernel.wgsl] = dev.create_kernel(kernel.wgsl, node.op)
            except Exception as exc:
                errs[nid] = f"{type(exc).__name__}: {exc}"
                continue
            out = dev.create_buffer(max(4, node.nbytes), f"out%{nid}")
            buffers[("out", nid)] = out
            steps.append(Dispatch(pipeline, tuple(buffers[i] for i in node.inputs) + (out,),
                                  dispatch_size(kernel.threads, kernel.workgroup_size), node.op))
            reads.append((out, max(4, node.nbytes)))
            ids.append(nid)
        got = {}
        if steps:
            program = dev.create_program(steps, 32)
            try:
                data = await dev.execute(program, [], reads)
                got = {nid: base64.b64encode(bytes(d)).decode() for nid, d in zip(ids, data)}
            except Exception as exc:
                errs.update({nid: f"{type(exc).__name__}: {exc}" for nid in ids})
        dispatches += len(steps)
        for buf in buffers.values():
            dev.destroy_buffer(buf)
        outputs.append({str(k): v for k, v in got.items()})
        errors.append({str(k): v for k, v in errs.items()})
    return {"outputs": outputs, "errors": errors, "compiled": len(pipelines),
            "dispatches": dispatches, "ms": 1000 * (time.perf_counter() - t0)}
'''

KERNEL_FAMILIES = sorted(p.stem.removeprefix("test_ops_")
                         for p in (ROOT / "tests" / "unit").glob("test_ops_*.py"))


@pytest.fixture(scope="module")
def kernel_check(tg_page: Page) -> Page:
    tg_page.exec(KERNEL_CHECK)
    return tg_page


@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_op_family_kernels_match_reference_in_the_browser(kernel_check: Page, family: str
                                                          ) -> None:
    import base64
    import pickle

    import numpy as np

    from tensorgrad.ir import LEAF_OPS
    from tensorgrad.ops import OPS
    from tensorgrad.reference import evaluate
    from tests.harness import build
    from tests.kernel_check import from_gpu, to_gpu

    cases = importlib.import_module(f"tests.unit.test_ops_{family}").CASES
    jobs, expected = [], []
    for case in cases:
        b = build(case)
        values = evaluate(b.graph, b.values)
        nodes = [n.id for n in b.graph.nodes if n.op not in LEAF_OPS and not OPS[n.op].pack]
        needed = {i for nid in nodes for i in b.graph[nid].inputs}
        jobs.append({"graph": b.graph, "nodes": nodes,
                     "values": {i: to_gpu(values[i], b.graph[i]) for i in sorted(needed)}})
        expected.append((case, b.graph, values))
    blob = base64.b64encode(pickle.dumps(jobs, protocol=4)).decode()
    t0 = time.perf_counter()
    out = ast.literal_eval(kernel_check.exec(f"await kernel_check({blob!r})"))
    print(f"\n{family}: {len(cases)} cases, {out['dispatches']} kernels run, {out['compiled']} "
          f"shaders compiled, {out['ms']:.0f} ms in the worker, "
          f"{time.perf_counter() - t0:.1f} s round trip")
    failures = []
    checked = 0
    for (case, graph, values), got, errs in zip(expected, out["outputs"], out["errors"]):
        failures += [f"{case.id} {graph[int(k)].describe()}: {msg}" for k, msg in errs.items()]
        for key, data in got.items():
            node = graph[int(key)]
            actual, want = from_gpu(base64.b64decode(data), node), values[node.id]
            try:
                if node.dtype == "f32":
                    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
                    np.testing.assert_allclose(actual, want, rtol=2e-4, atol=2e-5 * scale)
                else:
                    np.testing.assert_array_equal(actual, want)
                checked += 1
            except AssertionError as exc:
                failures.append(f"{case.id} {node.describe()}: {str(exc).strip()[:400]}")
    assert not failures, f"{len(failures)} kernel(s) differ from the reference:\n" + \
        "\n".join(failures[:20])
    assert checked > 0


# ---------------------------------------------------------------------------------------------
# A tiered start (on by default here: SwiftShader's compiles are dear): the MLP starts on its
# quick kernels and swaps in the optimized ones, with the losses and params of an untiered
# compile of the same model on the same batches.

TIERED = """
import random, time
import tensorgrad as tg

async def _tiered_run(tiered, steps):
    t0 = time.perf_counter()
    train = await tg.compile(model=mlp_sin.MLP(), loss=mlp_sin.loss_fn, inputs=mlp_sin.INPUTS,
                             optimizer=mlp_sin.optimizer(), seed=3, tiered=tiered)
    rng = random.Random(5)
    losses, quick = [], [train._exe.quick]
    for step in range(steps):
        r = await train.step(**mlp_sin.batch(rng))
        assert r.kind == "completed", r
        losses.append(r.loss)
        quick.append(train._exe.quick)
        if tiered is None and (not quick[-1] and step >= 3 or time.perf_counter() - t0 > 120):
            break  # swapped and a step run since (or given up after 2 minutes)
    params = await train.download_params()
    train.destroy()
    return losses, {n: bytes(memoryview(v)) for n, v in params.items()}, quick

_auto = await _tiered_run(None, 5000)
_plain = await _tiered_run(False, len(_auto[0]))
(_auto[0] == _plain[0], _auto[1] == _plain[1], _auto[2][0], _auto[2][-1], _plain[2][0],
 len(_auto[0]))
"""


def test_tiered_start_in_the_browser_matches_the_untiered_losses(tg: Page, web_url: str) -> None:
    """Tiered by default on SwiftShader, the MLP runs until the optimized kernels are swapped
    in (4 steps at least; they compile in the background, a few seconds under load); untiered, the same steps: the losses and the params after them
    are the same."""
    load_demo_model(tg, web_url, "mlp_sin", "mlp_sin")
    same_losses, same_params, first_quick, last_quick, plain_quick, steps = \
        ast.literal_eval(tg.exec(TIERED))
    assert first_quick is True and last_quick is False, (first_quick, last_quick, steps)
    assert plain_quick is False
    assert same_losses, f"the tiered losses differ from the untiered ones over {steps} steps"
    assert same_params
