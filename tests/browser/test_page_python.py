"""Python on the page: `tensorgrad.web.start()` from a page-side Pyodide (main thread, the way
PyScript runs) loads tensorgrad.js, starts the worker and drives a real training through the
Python page client (tensorgrad/web/client.py), with the native API's result objects.

The page (tests/browser/pages/page-python.html, served at /tests/ beside dist/web/) loads
Pyodide from `/pyodide/` and installs the tensorgrad wheel named by manifest.json; each test
runs Python there."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

# The worker's side: a small MLP, a forward function for attach, a failing helper.
WORKER_MODEL = '''
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

def predict(model, x):
    return model(x)

def broken():
    raise ValueError("broken on purpose")
'''

START = """
import json, time
import tensorgrad as tg
import tensorgrad.web

progress = []
t0 = time.perf_counter()
session = await tensorgrad.web.start(on_progress=progress.append)
start_s = time.perf_counter() - t0
await session.exec(WORKER_MODEL)
json.dumps({"stages": [p["stage"] for p in progress], "start_s": start_s,
            "timings": session.timings, "type": type(session).__module__ + "." +
            type(session).__name__})
"""

TRAIN = """
import array, json, time
import tensorgrad as tg

t0 = time.perf_counter()
train = await session.compile(model="MLP()", loss="loss_fn",
                              inputs={"x": [8, 4], "y": [8, 1]},
                              optimizer="tg.optim.Adam(lr=1e-2)", seed=1)
compile_s = time.perf_counter() - t0
xs = [((i * 7) % 11) / 11 for i in range(32)]
ys = [sum(xs[4 * r:4 * r + 4]) for r in range(8)]
x, y = array.array("f", xs), array.array("f", ys)

results = []
t0 = time.perf_counter()
for i in range(20):
    results.append(await train.step(x=x, y=y))
step_ms = 1000 * (time.perf_counter() - t0) / 20
# other input kinds: a memoryview, bytes, flat lists
more = [await train.step(x=memoryview(x), y=bytes(y)), await train.step(x=xs, y=ys)]

short = await train.step(x=array.array("f", [0.0] * 3), y=y)
bad_type = await train.step(x=object(), y=y)
params = await train.download_params()
json.dumps({
    "compile_s": compile_s, "step_ms": step_ms, "kernels": train.kernel_count,
    "names": train.param_names,
    "kinds": sorted({type(r).__name__ for r in results + more}),
    "all_completed": all(isinstance(r, tg.Completed) and r.kind == "completed"
                         for r in results + more),
    "losses": [r.loss for r in results + more if isinstance(r, tg.Completed)],
    "captures": [type(r.captures).__name__ for r in results[:1]],
    "x_intact": list(x) == list(array.array("f", xs)),
    "short": {"type": type(short).__name__, "kind": short.kind,
              "name": getattr(short.error, "name", None), "message": short.message,
              "is_shape_error": isinstance(getattr(short, "error", None), tg.ShapeError),
              "traceback": getattr(short.error, "remote_traceback", "")},
    "bad_type": {"type": type(bad_type).__name__, "message": bad_type.message},
    "params": {k: [type(v).__name__, v.format, list(v.shape)] for k, v in params.items()},
})
"""

ATTACH = """
import array, json
import tensorgrad as tg
from tensorgrad.web import flat_buffer

params = await train.download_params()
forward = await train.attach(forward="predict", inputs={"x": [None, 4]})
rows = [[0.1, 0.2, 0.3, 0.4], [1.0, -1.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0]]
out = await forward.run(x=array.array("f", [v for row in rows for v in row]))

def expected(row):  # the MLP by hand from the downloaded parameters (W is [in, out])
    W1, b1, W2, b2 = (flat_buffer(params[k]).tolist() for k in ("l1.W", "l1.b", "l2.W", "l2.b"))
    h = [max(0.0, sum(row[i] * W1[i * 16 + j] for i in range(4)) + b1[j]) for j in range(16)]
    return sum(h[j] * W2[j] for j in range(16)) + b2[0]

ok = isinstance(out, tg.Completed)
got = [out.output[r, 0] for r in range(3)] if ok else None

# set_lr(0) freezes the parameters; upload_params replaces them
await train.set_lr(0.0)
await train.upload_params({**params, "l2.b": [0.5]})
step = await train.step(x=array.array("f", [0.0] * 32), y=array.array("f", [0.0] * 8))
after = await train.download_params()
await train.upload_params({"l2.b": [0.25]}, partial=True)
partial = await train.download_params()
wrong = await forward.run(x=array.array("f", [1.0] * 5))
await train.destroy()
aborted = await train.step(x=array.array("f", [0.0] * 32), y=array.array("f", [0.0] * 8))
aborted_run = await forward.run(x=array.array("f", [0.0] * 4))
json.dumps({
    "type": type(out).__name__, "forward": type(forward).__name__,
    "error": None if ok else [out.error.name, out.message],
    "output_type": type(out.output).__name__ if ok else None,
    "shape": list(out.output.shape) if ok else None,
    "got": got, "want": [expected(r) for r in rows],
    "step": type(step).__name__, "l2.b": list(after["l2.b"]),
    "l1.W_same": after["l1.W"].tolist() == params["l1.W"].tolist(),
    "partial": [list(partial["l2.b"]), partial["l1.W"].tolist() == params["l1.W"].tolist()],
    "wrong": [type(wrong).__name__, getattr(wrong, "message", "")],
    "aborted": [type(aborted).__name__, type(aborted_run).__name__],
})
"""

ERRORS = """
import json
import tensorgrad as tg
from tensorgrad.errors import RemoteError

out = {}
try:
    await session.exec("broken()")
except ValueError as exc:
    out["exec"] = [type(exc).__name__, isinstance(exc, RemoteError), exc.name, str(exc),
                   exc.remote_traceback]
try:
    await session.compile(model="NoSuchModel()", loss="loss_fn", inputs={"x": [2, 4]})
except RemoteError as exc:
    out["compile"] = [exc.name, str(exc)]
posts = []
out["script"] = await session.run_script('''
import tensorgrad.web
async def main():
    for i in range(3):
        tensorgrad.web.post({"i": i, "data": [i, i + 1]})
    return {"done": 3}
''', on_post=posts.append)
out["posts"] = posts
out["exec_value"] = await session.exec("1 + 2")
out["ping"] = (await session.ping("hi"))["pong"]
session.terminate()
out["dead"] = session.dead
try:
    await session.exec("1")
except RemoteError as exc:
    out["after_terminate"] = str(exc)
json.dumps(out)
"""


MISTYPED = """
import array, json, math
import js
import tensorgrad as tg
from pyodide.code import run_js
from tensorgrad.errors import ProtocolError

count = run_js('''(w) => {
  if (!w.counted) {
    const post = w.postMessage.bind(w);
    w.postMessage = (...args) => { w.counted.n += 1; return post(...args); };
  }
  w.counted = { n: 0 };
  return () => w.counted.n;
}''')
train = await session.compile(model="MLP()", loss="loss_fn", inputs={"x": [8, 4], "y": [8, 1]},
                              optimizer="tg.optim.SGD(lr=0.1)", seed=2)
x, y = array.array("f", [0.5] * 32), array.array("f", [1.0] * 8)
for _ in range(3):
    await train.step(x=x, y=y)
params = lambda p: {k: v.tolist() for k, v in p.items()}
before = params(await train.download_params())
gid = train.graph_id
calls = {
    "reset params": lambda: train.reset(params="false"),
    "reset optimizer": lambda: train.reset(optimizer=1),
    "partial": lambda: train.upload_params({"l2.b": [9.0]}, partial="no"),
    "f64 param": lambda: train.upload_params({"l2.b": js.Float64Array.new(1)}, partial=True),
    "nan id": lambda: session.request("destroy", {"graphId": math.nan}),
    "inf id": lambda: session.request("reset", {"graphId": math.inf}),
    "half id": lambda: session.request("downloadParams", {"graphId": gid + 0.5}),
    "str id": lambda: session.request("destroy", {"graphId": str(gid)}),
    "nan lr": lambda: train.set_lr(math.nan),
    "seed": lambda: session.compile(model="MLP()", loss="loss_fn", inputs={"x": [8, 4]},
                                    seed=1.5),
}
posted = count(session.js.worker)
out = {}
for what, call in calls.items():
    try:
        await call()
        out[what] = "sent"
    except ProtocolError as exc:
        out[what] = str(exc)
json.dumps({"errors": out, "posted": posted(),
            "same": params(await train.download_params()) == before,
            "step": (await train.step(x=x, y=y)).kind})
"""


SHAPES = """
import array, json
import tensorgrad as tg

def view(n, shape):  # a flat f32 buffer seen with a shape
    return memoryview(array.array("f", [0.25] * n)).cast("B").cast("f", shape)

train2 = await session.compile(model="MLP()", loss="loss_fn", inputs={"x": [8, 4], "y": [8, 1]},
                               optimizer="tg.optim.Adam(lr=1e-2)", seed=1)
ys = array.array("f", [0.0] * 8)
out = {}
for key, x in (("transposed", view(32, (4, 8))), ("nested_other", [[0.5] * 16] * 2),
               ("nested_ok", [[0.5] * 4 for _ in range(8)]), ("shaped_ok", view(32, (8, 4)))):
    r = await train2.step(x=x, y=ys)
    out[key] = [r.kind, getattr(r, "message", "")]
try:
    await train2.upload_params({"l1.W": view(64, (16, 4))}, partial=True)
    out["upload"] = None
except tg.ShapeError as exc:
    out["upload"] = str(exc)
fwd = await train2.attach(forward="predict", inputs={"x": [None, 4]})
r = await fwd.run(x=view(12, (4, 3)))
out["forward"] = [r.kind, getattr(r, "message", "")]
await train2.destroy()
json.dumps(out)
"""


class PythonPage:
    """The test page with Python on the main thread; `py(source)` runs Python there."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.console: list[str] = []
        page.on("console", lambda m: self.console.append(f"[{m.type}] {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"[pageerror] {e}"))

    def py(self, source: str) -> Any:
        """Run `source` (top-level await allowed) on the page; its last expression, a JSON
        string, decoded. Python exceptions fail the test with their traceback."""
        try:
            text = self.page.evaluate("async (s) => await runPython(s)", source)
        except Exception as exc:  # noqa: BLE001 (the page's Python traceback, readable)
            raise AssertionError(f"Python on the page raised:\n{exc}\nconsole:\n" +
                                 "\n".join(self.console[-20:])) from None
        return json.loads(text)


@pytest.fixture(scope="module")
def page_python(browser: Any, web_url: str) -> Iterator[PythonPage]:
    page = PythonPage(browser.new_page())
    page.page.goto(web_url + "tests/page-python.html")
    timings = page.page.evaluate("async () => (await window.pagePython).timings")
    print(f"\npage-side Pyodide + tensorgrad wheel: {timings}")
    page.page.evaluate("async (src) => { const { pyodide } = await window.pagePython;"
                       " pyodide.globals.set('WORKER_MODEL', src); }", WORKER_MODEL)
    yield page
    page.page.close()


@pytest.fixture(scope="module")
def started(page_python: PythonPage) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = page_python.py(START)
    print(f"\ntensorgrad.web.start() from the page: {out['start_s']:.1f} s "
          f"(worker {out['timings']}), {time.perf_counter() - t0:.1f} s round trip")
    return out


def test_start_from_python_on_the_page(started: dict[str, Any]) -> None:
    assert started["type"] == "tensorgrad.web.client.Session"
    assert started["stages"] == ["loading-pyodide", "installing", "ready"], started
    assert started["timings"]["totalMs"] > 0


def test_training_from_python_on_the_page(page_python: PythonPage,
                                          started: dict[str, Any]) -> None:
    out = page_python.py(TRAIN)
    losses = out["losses"]
    print(f"\npage Python training: compile {out['compile_s']:.2f} s, {out['step_ms']:.1f} "
          f"ms/step, {out['kernels']} kernels, loss {losses[0]:.4f} -> {losses[19]:.4f}")
    assert out["all_completed"] and out["kinds"] == ["Completed"], out
    assert out["captures"] == ["Captures"]
    assert len(losses) == 22 and losses[19] < losses[0] / 3, losses
    assert out["x_intact"], "the Python input buffer changed (it must be copied, not moved)"
    assert out["names"] == ["l1.W", "l1.b", "l2.W", "l2.b"] and out["kernels"] > 0
    short = out["short"]
    assert short["type"] == "Failed" and short["kind"] == "failed", short
    assert short["name"] == "ShapeError" and short["is_shape_error"], short
    assert "'x'" in short["message"] and "ShapeError" in short["traceback"], short
    assert out["bad_type"]["type"] == "Failed" and "object" in out["bad_type"]["message"]
    # shaped like the native API's download (no NumPy in Pyodide: memoryviews)
    assert out["params"] == {"l1.W": ["memoryview", "f", [4, 16]],
                             "l1.b": ["memoryview", "f", [16]],
                             "l2.W": ["memoryview", "f", [16, 1]], "l2.b": ["memoryview", "f", [1]]}


def test_attach_run_params_and_destroy(page_python: PythonPage,
                                       started: dict[str, Any]) -> None:
    out = page_python.py(ATTACH)
    assert out["type"] == "Completed" and out["forward"] == "RemoteForward", out
    assert out["output_type"] == "memoryview" and out["shape"] == [3, 1], out
    for got, want in zip(out["got"], out["want"]):
        assert abs(got - want) <= 1e-4 * max(1.0, abs(want)), out
    assert out["step"] == "Completed" and out["l2.b"] == [0.5] and out["l1.W_same"], out
    assert out["partial"] == [[0.25], True], out  # a partial upload leaves the rest as is
    assert out["wrong"][0] == "Failed" and out["wrong"][1], out
    assert out["aborted"] == ["Aborted", "Aborted"], out


IN_FLIGHT = """
import array, json
import tensorgrad as tg

spec = dict(model="MLP()", loss="loss_fn", inputs={"x": [8, 4], "y": [8, 1]},
            optimizer={"kind": "adam", "lr": 0.01}, seed=3)
awaited, together = await session.compile(**spec), await session.compile(**spec)

def batch(i):
    xs = [((k * 7 + i * 3) % 11) / 11 - 0.5 for k in range(32)]
    return {"x": array.array("f", xs), "y": array.array("f", [xs[4 * r] * i for r in range(8)])}

one = [await awaited.step(**batch(i)) for i in range(6)]
calls = [together.step(**batch(i)) for i in range(6)]   # all sent now
got = [await c for c in reversed(calls)][::-1]           # awaited last to first
await awaited.destroy()
await together.destroy()
json.dumps({"awaited": [r.loss for r in one], "together": [r.loss for r in got],
            "kinds": [r.kind for r in got]})
"""


def test_steps_called_in_a_row_run_in_call_order_however_awaited(
        page_python: PythonPage, started: dict[str, Any]) -> None:
    """The Python page client sends a step when it is called (as the native step is queued
    when called): six steps called in a row and awaited last to first give the losses of six
    steps awaited one by one, in call order (the client sent each at its first await: the
    last one went first)."""
    out = page_python.py(IN_FLIGHT)
    assert out["kinds"] == ["completed"] * 6, out
    assert out["together"] == out["awaited"], out
    assert len(set(out["awaited"])) == 6, out


def test_the_python_client_refuses_mistyped_fields_before_sending(
        page_python: PythonPage, started: dict[str, Any]) -> None:
    out = page_python.py(MISTYPED)
    errors = out["errors"]
    idm = "field 'graphId' must be an integer id, got"
    assert errors == {
        "reset params": "reset: field 'params' must be a bool, got str 'false'",
        "reset optimizer": "reset: field 'optimizer' must be a bool, got int 1",
        "partial": "uploadParams: field 'partial' must be a bool, got str 'no'",
        "f64 param": ("uploadParams: field 'params' must be a record {name: Float32Array}, "
                      "got JS Float64Array(1) for 'l2.b'"),
        "nan id": f"destroy: {idm} float nan",
        "inf id": f"reset: {idm} float inf",
        "half id": errors["half id"],
        "str id": errors["str id"],
        "nan lr": ("setLR: field 'lr' must be a learning rate: a number, a schedule {kind, ...} "
                   "or a Python expression, got float nan"),
        "seed": "compile: field 'seed' must be an integer, got float 1.5",
    }, errors
    assert re.fullmatch(rf"downloadParams: {idm} float \d+\.5", errors["half id"]), errors
    assert re.fullmatch(rf"destroy: {idm} str '\d+'", errors["str id"]), errors
    assert out["posted"] == 0, "a mistyped message reached the worker"
    assert out["same"] and out["step"] == "completed", out


def test_the_page_client_checks_shapes_before_it_sends_data_flat(
        page_python: PythonPage, started: dict[str, Any]) -> None:
    """The page client sends typed arrays (flat), so it applies the host-data shape rule
    itself: data carrying 2+ dims must have the declared shape (None dims match any size)."""
    out = page_python.py(SHAPES)
    assert out["transposed"][0] == "failed" and out["transposed"][1].startswith(
        "step input 'x': got [4, 8], the transpose of [8, 4]: pass x.T"), out
    assert out["nested_other"][0] == "failed" and out["nested_other"][1].startswith(
        "step input 'x': got data of shape [2, 16] for shape [8, 4]"), out
    assert out["nested_ok"][0] == "completed" and out["shaped_ok"][0] == "completed", out
    assert out["upload"].startswith(
        "upload_params 'l1.W': got [16, 4], the transpose of [4, 16]: pass w.T (a PyTorch "
        "Linear weight is [out, in]; tensorgrad's Linear weight is [in, out])"), out
    assert out["forward"][0] == "failed" and out["forward"][1].startswith(
        "run input 'x': got data of shape [4, 3] for shape [None, 4]"), out


def test_check_webgpu_from_python_on_the_page(page_python: PythonPage,
                                             started: dict[str, Any]) -> None:
    out = page_python.py("""
import json
import tensorgrad.web
support = await tensorgrad.web.check_webgpu()
json.dumps([type(support).__name__, support.ok, support.reason, support.message,
            support.mode])
""")
    assert out[:3] == ["WebGPUSupport", True, None] and out[3].startswith("WebGPU ready"), out
    assert out[4] == "dedicated-worker", out  # the page's probe is for tensorgrad's worker


def test_errors_scripts_and_terminate(page_python: PythonPage, started: dict[str, Any]) -> None:
    out = page_python.py(ERRORS)
    name, remote, remote_name, message, traceback = out["exec"]
    assert (name, remote, remote_name, message) == ("ValueError", True, "ValueError",
                                                    "broken on purpose"), out
    assert "broken()" in traceback and "raise ValueError" in traceback, traceback
    assert out["compile"][0] == "NameError" and "NoSuchModel" in out["compile"][1], out
    assert out["posts"] == [{"i": i, "data": [i, i + 1]} for i in range(3)], out
    assert out["script"] == {"done": 3} and out["exec_value"] == "3" and out["ping"] == "hi"
    assert out["dead"] and "terminated" in out["after_terminate"], out
    errors = [line for line in page_python.console if line.startswith(("[error]", "[pageerror]"))]
    assert not errors, errors


def test_start_outside_a_browser_is_a_clear_error() -> None:
    import tensorgrad.web

    # a thread of its own: Playwright's sync API holds this thread's event loop
    with ThreadPoolExecutor(1) as pool, \
            pytest.raises(RuntimeError, match="Pyodide on a web page"):
        pool.submit(asyncio.run, tensorgrad.web.start()).result()

