"""The worker and the page client: start-up, exec/load/runScript, errors, transfers, handlers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Page

# Stand-ins for the compiler (`tg.compile` and what it returns), swapped into the worker loop
# for these tests: they exercise compile/step/run/attach/params/setLR/replaceModel/destroy
# through the real message loop and page client, whatever state the real compiler is in.
FAKE_TG = """
from array import array
from types import SimpleNamespace
import tensorgrad.worker as loop

class FakeModel:
    pass

def fake_loss(model, x, y):
    pass

class FakeTrain:
    def __init__(self, **spec):
        self.spec = spec
        self.param_names = ["w"]
        self.kernel_count = 7
        self.params = {"w": array("f", [1.0, 2.0, 3.0])}

    async def step(self, x, y):
        # typed arrays arrive as flat memoryviews; tg.compile's handle validates and shapes them
        assert (x.format, x.shape, y.format, y.shape) == ("f", (8,), "i", (2,)), (x, y)
        if y[0] < 0:
            raise ValueError("negative label")
        total = sum(x)
        doubled = array("f", [2 * v for v in x])
        return SimpleNamespace(kind="completed", loss=total, error=None,
                               captures={"doubled": memoryview(doubled).cast("B").cast("f", (2, 4))})

    async def run(self, x, y):
        return SimpleNamespace(kind="failed", error=RuntimeError("forward broke"), captures=None)

    async def attach(self, forward, inputs, output="f32"):
        return FakeForward(forward, inputs)

    async def upload_params(self, params, partial=False):
        self.params = {k: array("f", v) for k, v in params.items()}

    async def download_params(self):
        return self.params

    async def set_lr(self, lr):
        global LAST_LR
        LAST_LR = lr

    async def replace_model(self, model, seed=None, optimizer=None):
        self.param_names = ["w", "b"]

    def destroy(self):
        pass

class FakeForward:
    def __init__(self, forward, inputs):
        self.forward, self.inputs, self.param_names = forward, inputs, ["w"]

    async def run(self, x):
        assert self.inputs == {"x": [None, 2]}, self.inputs
        return SimpleNamespace(kind="completed", output=array("f", [v + 1 for v in x]),
                               captures={})

async def fake_compile(**spec):
    return FakeTrain(**spec)

real_tensorgrad = loop._tensorgrad
loop._tensorgrad = lambda: SimpleNamespace(compile=fake_compile)
"""

COMPILE_FAKE = """async () => {
  window.fake = await session.compile({ model: "FakeModel()", loss: "fake_loss",
    inputs: { x: [2, 4], y: [[2], "i32"] }, optimizer: "{'kind': 'adam', 'lr': 0.1}",
    seed: 3 });
  return { graphId: fake.graphId, paramNames: fake.paramNames, kernelCount: fake.kernelCount };
}"""


@pytest.fixture
def fake(tg: Page) -> Iterator[Page]:
    """`window.fake`: a Train handle on a FakeTrain compiled through the worker loop."""
    tg.exec(FAKE_TG)
    try:
        tg.info = tg.js(COMPILE_FAKE)
        yield tg
    finally:
        tg.exec("loop._tensorgrad = real_tensorgrad")


def test_start_reports_progress_with_times(tg: Page) -> None:
    stages = [p["stage"] for p in tg.progress]
    assert stages == ["loading-pyodide", "installing", "ready"], tg.progress
    times = [p["ms"] for p in tg.progress]
    assert times == sorted(times) and times[-1] > 0
    timings = tg.progress[-1]["timings"]
    assert set(timings) >= {"pyodideMs", "micropipMs", "wheelMs", "totalMs"}
    assert all(v >= 0 for v in timings.values())
    print("\nworker start-up (ms):", timings)
    assert tg.js("() => session.timings.totalMs") == timings["totalMs"]


def test_ping_lists_handlers(tg: Page) -> None:
    reply = tg.call("ping", 7)
    assert reply["ok"] and reply["result"]["pong"] == 7
    assert reply["result"]["platform"] == "emscripten"
    assert {"exec", "load", "runScript", "compile", "step", "destroy"} <= set(
        reply["result"]["kinds"])


def test_exec_returns_repr_and_keeps_namespace(tg: Page) -> None:
    assert tg.js("() => session.exec('x = 20\\nx + 22')") == "42"
    assert tg.js("() => session.exec('x')") == "20"
    assert tg.js("() => session.exec('y = 1')") is None
    assert tg.js("() => session.exec('\"a\" * 3')") == "'aaa'"
    src = "import asyncio\nawait asyncio.sleep(0)\nasync def f():\n    return 5\nawait f()"
    assert tg.js("(src) => session.exec(src)", src) == "5"


def test_python_error_arrives_with_message_and_traceback(tg: Page) -> None:
    src = "def inner():\n    raise ValueError('boom: bad thing')\n\ninner()\n"
    reply = tg.call("exec", src)
    assert not reply["ok"]
    err = reply["error"]
    assert err["name"] == "ValueError"
    assert err["message"] == "boom: bad thing"
    tb = err["traceback"]
    assert tb.startswith("Traceback (most recent call last):")
    assert "line 4" in tb and "inner()" in tb  # the caller's line, with its source
    assert "raise ValueError('boom: bad thing')" in tb
    assert tb.rstrip().endswith("ValueError: boom: bad thing")
    # The worker survives and keeps answering.
    assert tg.js("() => session.exec('1 + 1')") == "2"


def test_syntax_error_and_unknown_kind(tg: Page) -> None:
    reply = tg.call("exec", "def (")
    assert not reply["ok"] and reply["error"]["name"] == "SyntaxError"
    reply = tg.call("noSuchKind", None)
    assert not reply["ok"] and reply["error"]["name"] == "ValueError"
    assert "noSuchKind" in reply["error"]["message"] and "runScript" in reply["error"]["message"]


def test_run_script_streams_posts(tg: Page) -> None:
    src = """
import asyncio
from array import array
from tensorgrad.web import post

async def main():
    for i in range(3):
        post({"step": i, "loss": 1.0 / (i + 1), "w": array("f", [i, i + 0.5])})
        await asyncio.sleep(0.01)
    return {"steps": 3}
"""
    out = tg.js("""async (src) => {
      const posts = [];
      const result = await session.runScript(src, { onPost: (d) => posts.push(d) });
      return { result, posts: posts.map((p) => ({ step: p.step, loss: p.loss,
               type: p.w.constructor.name, w: Array.from(p.w) })) };
    }""", src)
    assert out["result"] == {"steps": 3}
    assert [p["step"] for p in out["posts"]] == [0, 1, 2]
    assert out["posts"][2] == {"step": 2, "loss": 1 / 3, "type": "Float32Array", "w": [2, 2.5]}


def test_run_script_posts_go_to_their_own_script(tg: Page) -> None:
    src = """
import asyncio
from tensorgrad.web import post

async def main():
    for i in range(4):
        post(TAG + str(i))
        await asyncio.sleep(0.005)
"""
    out = tg.js("""async (src) => {
      const a = [], b = [];
      await Promise.all([
        session.runScript("TAG = 'a'\\n" + src, { onPost: (d) => a.push(d) }),
        session.runScript("TAG = 'b'\\n" + src, { onPost: (d) => b.push(d) }),
      ]);
      return { a, b };
    }""", src)
    # Both scripts share the namespace (TAG is 'b' once the second has started), but every
    # post reaches the script that made it: four each.
    assert len(out["a"]) == 4 and len(out["b"]) == 4, out


def test_run_script_without_main_fails(tg: Page) -> None:
    reply = tg.call("runScript", "x = 1\nmain = None")
    assert not reply["ok"] and "async def main()" in reply["error"]["message"]


def test_load_runs_fetched_source(tg: Page, web_url: str) -> None:
    url = "data:text/plain,LOADED%20%3D%2021%0ALOADED%20*%202"
    assert tg.js("(url) => session.load(url)", url) == "42"
    assert tg.js("() => session.exec('LOADED')") == "21"
    reply = tg.js("""(url) => session.load(url).then(() => null,
                     (e) => ({ name: e.name, message: e.message }))""", web_url + "missing.py")
    assert reply["name"] == "OSError" and "404" in reply["message"]


def test_compile_evaluates_the_spec_in_the_namespace(fake: Page) -> None:
    assert fake.info["paramNames"] == ["w"] and fake.info["kernelCount"] == 7
    spec = fake.exec_json(f"""{{k: repr(v) for k, v in
        loop.SESSION.graphs[{fake.info['graphId']}].obj.spec.items()}}""")
    assert spec["inputs"] == "{'x': [2, 4], 'y': [[2], 'i32']}"  # as tg.compile takes JSON
    assert spec["optimizer"] == "{'kind': 'adam', 'lr': 0.1}"
    assert "FakeModel object" in spec["model"] and "fake_loss" in spec["loss"]
    assert spec["seed"] == "3"


def test_step_transfers_inputs_and_returns_loss_and_captures(fake: Page) -> None:
    out: dict[str, Any] = fake.js("""async () => {
      const x = new Float32Array([1, 2, 3, 4, 5, 6, 7, 8]);
      const y = new Int32Array([1, 0]);
      const r = await fake.step({ x, y });
      return { kind: r.kind, loss: r.loss, xDetached: x.byteLength === 0,
               yDetached: y.byteLength === 0, names: r.captures.names(),
               doubled: Array.from(r.captures.get("doubled")),
               type: r.captures.get("doubled").constructor.name,
               shape: r.captures.shape("doubled") };
    }""")
    assert out["kind"] == "completed" and out["loss"] == 36
    assert out["xDetached"] and out["yDetached"], "step inputs were copied, not transferred"
    assert out["names"] == ["doubled"] and out["type"] == "Float32Array"
    assert out["doubled"] == [2, 4, 6, 8, 10, 12, 14, 16] and out["shape"] == [2, 4]


def test_step_never_rejects(fake: Page) -> None:
    out = fake.js("""async () => {
      const bad = await fake.step({ x: new Float32Array(8), y: new Int32Array([-1, 0]) });
      const missing = await fake.step({ x: new Float32Array(8) });
      const run = await fake.run({ x: new Float32Array(8), y: new Int32Array(2) });
      const e = (r) => ({ kind: r.kind, name: r.error?.name, message: r.error?.message,
                          traceback: r.error?.traceback });
      return { bad: e(bad), missing: e(missing), run: e(run) };
    }""")
    assert out["bad"]["kind"] == "failed" and out["bad"]["name"] == "ValueError"
    assert "negative label" in out["bad"]["message"] and "in step" in out["bad"]["traceback"]
    assert out["missing"]["kind"] == "failed" and out["missing"]["name"] == "TypeError"
    assert "'y'" in out["missing"]["message"]
    assert out["run"] == {"kind": "failed", "name": "RuntimeError", "message": "forward broke",
                          "traceback": out["run"]["traceback"]}


def test_params_lr_attach_replace_and_destroy(fake: Page) -> None:
    out = fake.js("""async () => {
      const w = new Float32Array([4, 5, 6]);
      await fake.uploadParams({ w });
      const params = await fake.downloadParams();
      await fake.setLR("0.5 * 0.5");
      const forward = await fake.attach({ forward: "fake_loss", inputs: { x: [null, 2] } });
      const x = new Float32Array([1, 2, 3, 4]);
      const run = await forward.run({ x });
      const replaced = await fake.replaceModel("FakeModel()", { seed: 1 });
      await fake.destroy();
      const after = await fake.step({ x: new Float32Array(8), y: new Int32Array(2) });
      const afterRun = await forward.run({ x: new Float32Array(2) });
      return { detached: w.byteLength === 0, w: Array.from(params.w),
               type: params.w.constructor.name, run: Array.from(run.output),
               runShape: run.outputShape, xDetached: x.byteLength === 0,
               names: replaced.paramNames, handleNames: fake.paramNames, after: after.kind,
               afterRun: afterRun.kind };
    }""")
    assert out == {"detached": True, "w": [4, 5, 6], "type": "Float32Array", "run": [2, 3, 4, 5],
                   "runShape": [4], "xDetached": True, "names": ["w", "b"],
                   "handleNames": ["w", "b"], "after": "aborted", "afterRun": "aborted"}
    assert fake.exec("LAST_LR") == "0.25"
    assert fake.exec(f"loop.SESSION.graphs.get({fake.info['graphId']})") is None


def test_compile_reports_missing_compiler_or_bad_spec(tg: Page) -> None:
    """compile evaluates its spec in the namespace; a bad name fails with the Python error."""
    out = tg.js("""() => session.compile({ model: "NoSuchModel()", loss: "loss_fn",
                      inputs: { x: [2, 3] }, optimizer: null })
                    .then(() => "compiled", (e) => ({ name: e.name, message: e.message }))""")
    assert out != "compiled" and out["name"] in {"NameError", "AttributeError", "ImportError"}


def test_worker_crash_rejects_pending_requests(tg: Page) -> None:
    """A worker that dies (an uncaught error) rejects every pending request: no hang."""
    out = tg.js("""async () => {
      const src = `
        self.postMessage({ kind: "progress", stage: "ready", ms: 0, timings: {} });
        self.onmessage = () => setTimeout(() => { throw new Error("worker crashed"); }, 20);
      `;
      const url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
      const s = await tg.start({ workerUrl: url });
      const results = await Promise.allSettled([s.exec("1"), s.exec("2")]);
      const later = await s.exec("3").then(() => "resolved", (e) => e.message);
      return { results: results.map((r) => [r.status, r.reason?.message]), later };
    }""")
    for status, message in out["results"]:
        assert status == "rejected" and "worker crashed" in message, out
    assert "worker crashed" in out["later"]


def test_missing_worker_script_rejects_start(tg: Page) -> None:
    out = tg.js("""() => tg.start({ workerUrl: "/no-such-worker.mjs" })
                    .then(() => "started", (e) => e.message)""")
    assert out.startswith("tensorgrad worker failed"), out
