"""The worker and the page client: start-up, exec/load/runScript, errors, transfers, handlers."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Page

# A tiny real model for the compile/step/run/attach/params/setLR/replaceModel/destroy tests,
# defined in the worker's namespace: Linear(4, 2) against a one-hot of i32 labels, with the
# prediction captured. Linear's W is [in, out] (y = x @ W + b).
WORKER_MODEL = """
import tensorgrad as tg
import tensorgrad.optim
import tensorgrad.web.worker as loop

WK_LR = 1.0

class WkNet(tg.Module):
    def __init__(self):
        self.fc = tg.Linear(4, 2)

    def __call__(self, x):
        return self.fc(x)

class WkDeeper(tg.Module):
    def __init__(self):
        self.l1 = tg.Linear(4, 3)
        self.l2 = tg.Linear(3, 2)

    def __call__(self, x):
        return self.l2(tg.relu(self.l1(x)))

def wk_loss(model, x, y):
    pred = tg.capture("pred", model(x))
    d = pred - tg.one_hot(y, 2)
    return tg.mean(d * d)

def wk_predict(model, x):
    return model(x)

def wk_broken_loss(model, x, y):
    raise ValueError("broken loss on purpose")

def wk_broken_forward(model, x):
    raise ValueError("broken forward on purpose")
"""

COMPILE = """async () => {
  window.net = await session.compile({ model: "WkNet()", loss: "wk_loss",
    inputs: { x: [2, 4], y: [[2], "i32"] }, optimizer: "tg.optim.SGD(lr=0.1)", seed: 3 });
  return { graphId: net.graphId, paramNames: net.paramNames, kernelCount: net.kernelCount };
}"""

# Exactly representable in f32, so uploads and downloads compare exactly.
W = [0.5, -0.25, 1.0, 2.0, -1.5, 0.125, 3.0, -4.0]  # [4, 2]
B = [0.75, -2.0]
X = [0.5, 1.0, -0.5, 0.25, -1.0, 0.75, 0.5, -0.25]  # [2, 4]
Y = [1, 0]


def linear(x: list[float], w: list[float], b: list[float], n_in: int = 4) -> list[list[float]]:
    """Rows of x @ W + b (W is [in, out])."""
    n_out = len(b)
    return [[sum(x[r * n_in + i] * w[i * n_out + j] for i in range(n_in)) + b[j]
             for j in range(n_out)] for r in range(len(x) // n_in)]


def mse_grads(w: list[float], b: list[float]) -> tuple[list[float], list[float]]:
    """d wk_loss / d (W, b) at X, Y: loss = mean((pred - onehot)^2) over 4 elements."""
    d = [[p - (1.0 if Y[r] == j else 0.0) for j, p in enumerate(row)]
         for r, row in enumerate(linear(X, w, b))]
    gw = [sum(X[r * 4 + i] * d[r][j] for r in range(2)) / 2 for i in range(4) for j in range(2)]
    gb = [sum(d[r][j] for r in range(2)) / 2 for j in range(2)]
    return gw, gb


@pytest.fixture
def net(tg: Page) -> Iterator[Page]:
    """`window.net`: a Train handle on a real tg.compile of WkNet() (SGD, lr 0.1, seed 3)."""
    tg.exec(WORKER_MODEL)
    tg.info = tg.js(COMPILE)
    try:
        yield tg
    finally:
        tg.js("() => net.destroy()")


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
    reply = tg.call("ping", {"value": 7})
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
    reply = tg.call("exec", {"source": src})
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
    reply = tg.call("exec", {"source": "def ("})
    assert not reply["ok"] and reply["error"]["name"] == "SyntaxError"
    # checked against the worker's protocol table before it is posted
    reply = tg.call("noSuchKind", {})
    assert not reply["ok"] and reply["error"]["name"] == "ProtocolError"
    assert "noSuchKind" in reply["error"]["message"] and "runScript" in reply["error"]["message"]
    reply = tg.call("exec", {"source": "1", "sourse": "2"})
    assert not reply["ok"] and reply["error"]["name"] == "ProtocolError"
    assert reply["error"]["message"] == ("exec: payload field(s) unknown [sourse]; expected "
                                         "{source, filename?}")
    reply = tg.call("step", {"inputs": {}})
    assert reply["error"]["message"].startswith("step: payload field(s) missing [graphId]")
    reply = tg.call("exec", "1 + 1")  # not an object
    assert reply["error"]["message"] == ("exec: the payload must be an object "
                                         "{source, filename?}")


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
    reply = tg.call("runScript", {"source": "x = 1\nmain = None"})
    assert not reply["ok"] and "async def main()" in reply["error"]["message"]


def test_run_script_never_runs_an_earlier_scripts_main(tg: Page) -> None:
    """The namespace outlives a script, but a script without main fails: it does not run
    the main an earlier script (or exec) left behind."""
    first = tg.call("runScript", {"source": "RUNS = 0\nasync def main():\n"
                                            "    global RUNS\n    RUNS += 1\n    return RUNS"})
    assert first["ok"] and first["result"] == 1, first
    reply = tg.call("runScript", {"source": "x = 2"})
    assert not reply["ok"] and "async def main()" in reply["error"]["message"], reply
    assert tg.call("exec", {"source": "RUNS"})["result"] == "1"
    again = tg.call("runScript", {"source": "async def main():\n    return 'new'"})
    assert again["ok"] and again["result"] == "new", again


def test_load_runs_fetched_source(tg: Page, web_url: str) -> None:
    url = "data:text/plain,LOADED%20%3D%2021%0ALOADED%20*%202"
    assert tg.js("(url) => session.load(url)", url) == "42"
    assert tg.js("() => session.exec('LOADED')") == "21"
    reply = tg.js("""(url) => session.load(url).then(() => null,
                     (e) => ({ name: e.name, message: e.message }))""", web_url + "missing.py")
    assert reply["name"] == "OSError" and "404" in reply["message"]


def test_compile_evaluates_the_spec_in_the_namespace(net: Page) -> None:
    assert net.info["paramNames"] == ["fc.W", "fc.b"] and net.info["kernelCount"] > 0
    spec = net.exec_json(f"""(lambda t: {{"model": type(t._model).__name__,
        "loss": t._loss_fn is wk_loss, "inputs": t._input_decls,
        "optimizer": t._optimizer == tg.optim.SGD(lr=0.1), "seed": t.seed}})(
        loop.SESSION.graphs[{net.info['graphId']}].obj)""")
    assert spec == {"model": "WkNet", "loss": True, "optimizer": True, "seed": 3,
                    "inputs": {"x": [2, 4], "y": [[2], "i32"]}}  # as tg.compile takes JSON


STEP = """async ({ W, B, X, Y }) => {
  await net.uploadParams({ "fc.W": Float32Array.from(W), "fc.b": Float32Array.from(B) });
  const x = Float32Array.from(X), y = Int32Array.from(Y);
  const r = await net.step({ x, y });
  if (r.kind !== "completed") return { kind: r.kind, error: r.error?.message };
  const pred = r.captures.pred;
  return { kind: r.kind, loss: r.loss, xDetached: x.byteLength === 0,
           yDetached: y.byteLength === 0, names: Object.keys(r.captures), pred: Array.from(pred),
           type: pred.constructor.name, shape: r.captureShapes.pred };
}"""


def test_step_transfers_inputs_and_returns_loss_and_captures(net: Page) -> None:
    out: dict[str, Any] = net.js(STEP, {"W": W, "B": B, "X": X, "Y": Y})
    assert out["kind"] == "completed", out
    assert out["xDetached"] and out["yDetached"], "step inputs were copied, not transferred"
    assert out["names"] == ["pred"] and out["type"] == "Float32Array" and out["shape"] == [2, 2]
    pred = linear(X, W, B)  # the capture is the forward before the update
    assert out["pred"] == pytest.approx([v for row in pred for v in row], rel=1e-6)
    sq = [(p - (1.0 if Y[r] == j else 0.0)) ** 2 for r, row in enumerate(pred)
          for j, p in enumerate(row)]
    assert out["loss"] == pytest.approx(sum(sq) / 4, rel=1e-6)


# What a page sees of a step and a run result, as console.log or JSON.stringify show it: plain
# objects with own fields only (no class wrapping the captures), typed arrays for the data.
RESULT_FIELDS = """async () => {
  const fields = (r) => ({
    keys: Object.keys(r).sort(),
    plain: [r, r.captures, r.captureShapes].every((o) => Object.getPrototypeOf(o) === Object.prototype),
    captures: Object.fromEntries(Object.entries(r.captures).map(([k, v]) => [k, v.constructor.name])),
    json: JSON.parse(JSON.stringify({ ...r, captures: Object.keys(r.captures) })),
    cloned: Object.keys(structuredClone(r)).sort(),
  });
  const step = await net.step({ x: new Float32Array(8), y: new Int32Array([1, 0]) });
  const predict = await net.attach({ forward: "wk_predict", inputs: { x: [null, 4] } });
  const run = await predict.run({ x: new Float32Array(12) });
  const out = { step: fields(step), run: fields(run), output: run.output.constructor.name };
  await predict.destroy();
  return out;
}"""


def test_step_and_run_results_are_plain_fields_on_the_page(net: Page) -> None:
    """A result is {kind, loss | output + outputShape, captures: {name: typed array},
    captureShapes}: console.log showed `captures: {_data: {}, _shapes: {}}` before."""
    out = net.js(RESULT_FIELDS)
    step, run = out["step"], out["run"]
    assert step["keys"] == ["captureShapes", "captures", "kind", "loss"], step
    assert step["plain"] and step["captures"] == {"pred": "Float32Array"}, step
    assert step["json"]["captureShapes"] == {"pred": [2, 2]} and step["json"]["kind"] == "completed"
    assert step["cloned"] == step["keys"]
    assert run["keys"] == ["captureShapes", "captures", "kind", "output", "outputShape"], run
    assert run["plain"] and run["captures"] == {} and out["output"] == "Float32Array", out
    assert run["json"]["outputShape"] == [3, 2], run


def test_a_script_posts_step_and_run_results_as_plain_fields(net: Page) -> None:
    """tensorgrad.web.post(result) and a script's returned result arrive as the same plain
    fields as step()/run() replies (they raised TypeError / came back as a repr before)."""
    src = """
import tensorgrad as tg
from tensorgrad.web import post
import tensorgrad.web.worker as loop

async def main():
    train = loop.SESSION.graphs[GRAPH].obj
    post(await train.step(x=[0.0] * 8, y=[1, 0]))
    post(await train.step(x=[0.0] * 3, y=[1, 0]))
    return tg.Aborted()
"""
    out = net.js("""async (src) => {
      const posts = [];
      const result = await session.runScript(src, { onPost: (d) => posts.push(d) });
      return { result, posts: posts.map((p) => ({ keys: Object.keys(p).sort(),
               pred: p.captures?.pred?.constructor.name, shape: p.captureShapes?.pred,
               error: p.error && { name: p.error.name, message: p.error.message } })) };
    }""", f"GRAPH = {net.info['graphId']}\n{src}")
    ok, bad = out["posts"]
    assert ok == {"keys": ["captureShapes", "captures", "kind", "loss"], "pred": "Float32Array",
                  "shape": [2, 2], "error": None}, ok
    assert bad["keys"] == ["error", "kind"] and bad["error"]["name"] == "ShapeError", bad
    assert "'x'" in bad["error"]["message"], bad
    assert out["result"] == {"kind": "aborted"}


NEVER_REJECTS = """async () => {
  const y = () => new Int32Array([1, 0]);
  const short = await net.step({ x: new Float32Array(3), y: y() });
  const wrongType = await net.step({ x: new Int32Array(8), y: y() });
  const missing = await net.step({ x: new Float32Array(8) });
  const ok = await net.step({ x: new Float32Array(8), y: y() });  // still usable
  const run = await net.run({ x: new Float32Array(8), y: y() });  // a Train has no run
  const broken = await net.attach({ forward: "wk_broken_forward", inputs: { x: [null, 4] } });
  const brokenRun = await broken.run({ x: new Float32Array(4) });
  const nan = await net.step({ x: new Float32Array(8).fill(NaN), y: y() });  // diverges
  const compileError = await session.compile({ model: "WkNet()", loss: "wk_broken_loss",
      inputs: { x: [2, 4], y: [[2], "i32"] }, optimizer: "tg.optim.SGD(lr=0.1)" })
    .then(() => ({ kind: "compiled" }), (error) => ({ kind: "rejected", error }));
  const e = (r) => ({ kind: r.kind, name: r.error?.name, message: r.error?.message,
                      traceback: r.error?.traceback });
  return { short: e(short), wrongType: e(wrongType), missing: e(missing), nan: e(nan),
           run: e(run), brokenRun: e(brokenRun), ok: ok.kind, compileError: e(compileError) };
}"""


def test_step_and_run_never_reject(net: Page) -> None:
    out = net.js(NEVER_REJECTS)
    for case in ("short", "wrongType", "missing", "nan", "run", "brokenRun"):
        assert out[case]["kind"] == "failed", (case, out[case])
        assert out[case]["name"] and out[case]["message"], (case, out[case])
        assert out[case]["message"] in out[case]["traceback"], (case, out[case])
    for case in ("short", "wrongType"):  # the input check, made when step is called
        assert out[case]["name"] == "ShapeError" and "'x'" in out[case]["message"], out[case]
        assert out[case]["traceback"].startswith("Traceback (most recent call last):")
        assert "in _snapshot" in out[case]["traceback"], out[case]["traceback"]
    assert "8 elements" in out["short"]["message"] and "f32" in out["wrongType"]["message"]
    assert out["missing"]["name"] == "ShapeError" and "'y'" in out["missing"]["message"]
    assert out["nan"]["name"] == "FloatingPointError" and "nan" in out["nan"]["message"]
    assert out["run"]["name"] == "AttributeError" and "run" in out["run"]["message"]
    assert out["ok"] == "completed"
    # A Python error inside the user's forward (traced on the first run) and loss (compile).
    broken = out["brokenRun"]
    assert broken["name"] == "ValueError" and broken["message"] == "broken forward on purpose"
    assert "in wk_broken_forward" in broken["traceback"], broken["traceback"]
    assert 'raise ValueError("broken forward on purpose")' in broken["traceback"]
    compile_error = out["compileError"]
    assert compile_error["kind"] == "rejected" and compile_error["name"] == "ValueError"
    assert compile_error["message"] == "broken loss on purpose"
    assert "in wk_broken_loss" in compile_error["traceback"]
    assert 'raise ValueError("broken loss on purpose")' in compile_error["traceback"]


PARAMS = """async ({ W, B }) => {
  const plain = (p) => Object.fromEntries(Object.entries(p).map(
    ([k, v]) => [k, { type: v.constructor.name, values: Array.from(v) }]));
  const w = Float32Array.from(W), b = Float32Array.from(B);
  await net.uploadParams({ "fc.W": w, "fc.b": b });
  const full = plain(await net.downloadParams());
  const b2 = new Float32Array([7.5, -8]);
  await net.uploadParams({ "fc.b": b2 }, { partial: true });
  const partial = plain(await net.downloadParams());
  const err = (p) => p.then(() => null, (e) => ({ name: e.name, message: e.message }));
  return { detached: [w, b, b2].every((a) => a.byteLength === 0), full, partial,
           notPartial: await err(net.uploadParams({ "fc.b": new Float32Array(2) })),
           wrongSize: await err(net.uploadParams({ "fc.b": new Float32Array(3) },
                                                 { partial: true })),
           after: plain(await net.downloadParams()) };
}"""


def test_upload_and_download_params_round_trip(net: Page) -> None:
    out = net.js(PARAMS, {"W": W, "B": B})
    assert out["detached"], "uploaded params were copied, not transferred"
    f32 = "Float32Array"
    assert out["full"] == {"fc.W": {"type": f32, "values": W}, "fc.b": {"type": f32, "values": B}}
    assert out["partial"] == {"fc.W": {"type": f32, "values": W},
                              "fc.b": {"type": f32, "values": [7.5, -8]}}
    assert out["notPartial"]["name"] == "KeyError" and "fc.W" in out["notPartial"]["message"]
    assert out["wrongSize"]["name"] == "ShapeError" and "fc.b" in out["wrongSize"]["message"]
    assert out["after"] == out["partial"], "a rejected upload wrote something"


SET_LR = """async ({ W, B, X, Y }) => {
  const params = async () => Object.fromEntries(Object.entries(await net.downloadParams())
    .map(([k, v]) => [k, Array.from(v)]));
  const step = () => net.step({ x: Float32Array.from(X), y: Int32Array.from(Y) });
  await net.uploadParams({ "fc.W": Float32Array.from(W), "fc.b": Float32Array.from(B) });
  await net.setLR(0);  // a number
  const frozen = (await step()).kind;
  const afterFrozen = await params();
  await net.setLR("WK_LR / 4");  // a Python expression, evaluated in the namespace
  const moved = (await step()).kind;
  return { frozen, afterFrozen, moved, afterMoved: await params() };
}"""


def test_set_lr_takes_effect(net: Page) -> None:
    out = net.js(SET_LR, {"W": W, "B": B, "X": X, "Y": Y})
    assert out["frozen"] == "completed" and out["moved"] == "completed", out
    assert out["afterFrozen"] == {"fc.W": W, "fc.b": B}, "set_lr(0) did not freeze the params"
    gw, gb = mse_grads(W, B)  # SGD with lr 0.25: p - 0.25 * grad
    assert out["afterMoved"]["fc.W"] == pytest.approx(
        [w - 0.25 * g for w, g in zip(W, gw)], rel=1e-5, abs=1e-6)
    assert out["afterMoved"]["fc.b"] == pytest.approx(
        [b - 0.25 * g for b, g in zip(B, gb)], rel=1e-5, abs=1e-6)


ATTACH_REPLACE_DESTROY = """async ({ W, B, rows }) => {
  await net.uploadParams({ "fc.W": Float32Array.from(W), "fc.b": Float32Array.from(B) });
  const forward = await net.attach({ forward: "wk_predict", inputs: { x: [null, 4] } });
  const x = Float32Array.from(rows.flat());
  const run = await forward.run({ x });
  const replaced = await net.replaceModel("WkDeeper()", { seed: 1 });
  const handle = { names: net.paramNames, kernels: net.kernelCount };
  const rerun = await forward.run({ x: new Float32Array(8) });  // retraced on the new model
  const restep = await net.step({ x: new Float32Array(8), y: new Int32Array([0, 1]) });
  await net.destroy();
  const after = await net.step({ x: new Float32Array(8), y: new Int32Array(2) });
  const afterRun = await forward.run({ x: new Float32Array(4) });
  return { forwardId: forward.graphId, forwardNames: forward.paramNames, run: run.kind,
           output: Array.from(run.output ?? []), outputShape: run.outputShape,
           type: run.output?.constructor.name, xDetached: x.byteLength === 0, replaced,
           handle, rerun: [rerun.kind, rerun.outputShape], restep: restep.kind,
           after: after.kind, afterRun: afterRun.kind };
}"""


def test_attach_replace_model_and_destroy(net: Page) -> None:
    rows = [[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    out = net.js(ATTACH_REPLACE_DESTROY, {"W": W, "B": B, "rows": rows})
    # attach with a None batch dim: the forward from the uploaded (downloadable) params
    assert out["run"] == "completed" and out["forwardNames"] == ["fc.W", "fc.b"], out
    assert out["outputShape"] == [3, 2] and out["type"] == "Float32Array"
    expected = linear([v for row in rows for v in row], W, B)
    assert out["output"] == pytest.approx([v for row in expected for v in row], rel=1e-6)
    assert out["xDetached"], "run inputs were copied, not transferred"
    # replaceModel: new params on the handle, the attached forward follows the new model
    names = ["l1.W", "l1.b", "l2.W", "l2.b"]
    assert sorted(out["replaced"]["paramNames"]) == names
    assert out["handle"] == {"names": out["replaced"]["paramNames"],
                             "kernels": out["replaced"]["kernelCount"]}
    assert out["rerun"] == ["completed", [2, 2]] and out["restep"] == "completed"
    # destroy: later steps and runs of the attached forward are aborted, the graphs are gone
    assert out["after"] == "aborted" and out["afterRun"] == "aborted"
    ids = [net.info["graphId"], out["forwardId"]]
    assert net.exec_json(f"[i in loop.SESSION.graphs for i in {ids}]") == [False, False]


# Steps sent without awaiting the last (several in flight), against the same steps awaited one
# by one on a twin graph (same model, seed, optimizer and batches).
IN_FLIGHT_SETUP = """
  const spec = { model: "WkNet()", loss: "wk_loss", inputs: { x: [2, 4], y: [[2], "i32"] },
                 optimizer: { kind: "adam", lr: 0.05 }, seed: 5 };
  const batch = (i) => ({ x: Float32Array.from(X, (v, k) => v * (((i + k) % 3) - 1) + 0.125 * i),
                          y: Int32Array.from([i % 2, (i + 1) % 2]) });
  // step 10 of a run has a NaN input (the worker skips its update), step 7 a field the client's
  // protocol check refuses (never sent)
  const faulty = (i) => i === 10 ? { ...batch(i), x: batch(i).x.map((v, k) => k === 2 ? NaN : v) }
    : i === 7 ? { ...batch(i), x: "not a typed array" } : batch(i);
  const outcome = (r) => r.kind === "completed" ? r.loss : `${r.kind} ${r.error?.name}`;
  const plain = (p) => Object.fromEntries(Object.entries(p).map(([k, v]) => [k, Array.from(v)]));
  const settled = [];
  const track = (name, promise) => promise.then((r) => { settled.push(name); return r; });
"""

IN_FLIGHT = """async ({ X, n }) => {""" + IN_FLIGHT_SETUP + """
  const awaited = await session.compile(spec), together = await session.compile(spec);
  const one = [];
  for (let i = 0; i < n; i++) one.push(await awaited.step(faulty(i)));
  const calls = [];
  for (let i = 0; i < n; i++) calls.push(track(i, together.step(faulty(i))));
  const params = together.downloadParams();  // queued behind the steps
  // Handled as soon as it arrives, while the first step runs: how many calls wait their turn
  // in the handle's queue, how many steps are in flight (submitted, not finished) and done.
  const waiting = session.exec("import asyncio\\nfor _ in range(3):\\n    await asyncio.sleep(0)\\n" +
    `(lambda t: (len(t._queue._waiters), len(t._flight), t.step_count))(loop.SESSION.graphs[${together.graphId}].obj)`);
  const all = await Promise.all(calls);
  const out = { awaited: one.map(outcome), together: all.map(outcome),
                kinds: all.map((r) => r.kind), settled, waiting: await waiting,
                paramsAwaited: plain(await awaited.downloadParams()),
                paramsTogether: plain(await params),
                captures: all.every((r, i) => r.kind !== "completed" ||
                  Array.from(r.captures.pred).join() === Array.from(one[i].captures.pred).join()) };
  await awaited.destroy();
  await together.destroy();
  return out;
}"""


def test_steps_in_flight_give_the_losses_and_params_of_awaited_steps(net: Page) -> None:
    """Twelve steps called without awaiting: each is queued in the worker as soon as it
    arrives, and they give the losses, captures and params of twelve awaited steps, bit for
    bit, their promises settling in call order. A step that fails (a NaN input: update
    skipped; a field the protocol check refuses: never sent) fails alone, in its place; the
    steps after it run."""
    n = 12
    out = net.js(IN_FLIGHT, {"X": X, "n": n})
    failed = {7: "failed ProtocolError", 10: "failed FloatingPointError"}
    assert out["kinds"] == ["failed" if i in failed else "completed" for i in range(n)], out
    assert out["together"] == out["awaited"], out
    assert [out["together"][i] for i in failed] == list(failed.values()), out
    assert len(set(out["awaited"])) == n  # twelve different outcomes, not one loss repeated
    assert out["captures"] and out["paramsTogether"] == out["paramsAwaited"], out
    assert out["settled"] == list(range(n)), out["settled"]
    # while the first steps ran, every later step sent (11: one was refused) and the download
    # (12 calls) already waited in the handle's queue, or was submitted and in flight, or done
    # (done counts the completed steps, the NaN one never; the probe runs long before it); one
    # step may hold the turn, submitting
    waiting, in_flight, done = ast.literal_eval(out["waiting"])
    assert waiting > 0 and n - 1 <= waiting + in_flight + done <= n, out["waiting"]


# In the worker, synchronously: messages handed over as web/worker.mjs hands them, and steps
# offered to express() while an earlier message has not started, and while a call made on
# the graph has not started its task.
EXPRESS_ORDER = """
import asyncio
from array import array
g = loop.SESSION.graphs[{gid}].obj
def step_message(i):
    x = memoryview(array("f", [v * (i + 1) for v in {X}]))
    return {{"id": -1 - i, "kind": "step",
             "payload": {{"graphId": {gid}, "inputs": {{"x": x, "y": memoryview(array("i", {Y}))}}}}}}
bias = {{"fc.b": memoryview(array("f", [0.5, -0.5]))}}
for _ in range(100):  # its tiered start done, the optimized program checked by a step
    await g.step(**step_message(0)["payload"]["inputs"])
    if not g._exe.quick:
        break
    await asyncio.sleep(0.01)
await g.step(**step_message(0)["payload"]["inputs"])
before = loop.SESSION.express_steps
behind = loop.handle({{"id": -100, "kind": "uploadParams",
                      "payload": {{"graphId": {gid}, "params": bias, "partial": True}}}})
passed_a_message = loop.express(step_message(1))  # the upload's handler has not started
upload_ok = bool((await behind).ok)
call = g.upload_params(bias, partial=True)  # a call made, its task not started
passed_a_call = loop.express(step_message(2))
await call
alone = loop.express(step_message(3))  # nothing ahead of it
await g.download_params()  # (after that step)
(passed_a_message, upload_ok, passed_a_call, alone, loop.SESSION.express_steps - before)
"""


def test_express_takes_no_step_past_an_earlier_message_or_call(net: Page) -> None:
    """A step message is not submitted ahead of a message handed to the worker before it
    whose handler has not started, nor of a call made on its graph whose task has not run;
    with nothing ahead of it, it is (the worker's express path, on the real device)."""
    out = net.exec(EXPRESS_ORDER.format(gid=net.info["graphId"], X=X, Y=Y))
    assert ast.literal_eval(out) == (False, True, False, True, 1), out


REPLACE_IN_FLIGHT = """async ({ X }) => {""" + IN_FLIGHT_SETUP + """
  const t = await session.compile(spec);
  const s0 = track("s0", t.step(batch(0))), s1 = track("s1", t.step(batch(1)));
  const replaced = t.replaceModel("WkDeeper()", { seed: 1 });
  const s2 = track("s2", t.step(batch(2))), s3 = track("s3", t.step(batch(3)));
  const kinds = (await Promise.all([s0, s1, s2, s3])).map((r) => r.kind);
  const info = await replaced;
  const d0 = track("d0", t.step(batch(4))), d1 = track("d1", t.step(batch(5)));
  const destroyed = t.destroy();
  const d2 = track("d2", t.step(batch(6)));
  const afterDestroy = (await Promise.all([d0, d1, d2])).map((r) => r.kind);
  await destroyed;
  return { kinds, names: info.paramNames, handleNames: t.paramNames, afterDestroy, settled };
}"""


def test_replace_model_and_destroy_abort_the_steps_in_flight(net: Page) -> None:
    """Steps called before replaceModel() that have not finished resolve aborted (the Python
    API's rule; the worker let them finish before), those after it run on the new model;
    destroy() aborts the steps in flight and those after it, and every step promise settles
    in call order (a step after destroy is answered at once: it waits for the earlier
    ones)."""
    out = net.js(REPLACE_IN_FLIGHT, {"X": X})
    assert out["kinds"] == ["aborted", "aborted", "completed", "completed"], out
    assert out["names"] == out["handleNames"] == ["l1.W", "l1.b", "l2.W", "l2.b"], out
    assert out["afterDestroy"] == ["aborted", "aborted", "aborted"], out
    assert out["settled"] == ["s0", "s1", "s2", "s3", "d0", "d1", "d2"], out


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


PLAIN_DATA = """async () => {
  const train = await session.compile({ model: "WkNet()", loss: "wk_loss",
    inputs: { x: [2, 4], y: [[2], "i32"] }, seed: 3,
    optimizer: { kind: "adamw", lr: { kind: "linear", peak: 0.1, final: 0.01, steps: 10 },
                 weight_decay: 0.1 } });
  const before = await train.downloadParams();
  const step = await train.step({ x: new Float32Array(8).fill(1), y: new Int32Array([1, 0]) });
  await train.setLR({ kind: "constant", value: 0.05 });
  await train.reset({ optimizer: false });
  const after = await train.downloadParams();
  const info = { shapes: train.paramShapes, count: train.paramCount, step: step.kind,
                 same: Array.from(after["fc.W"]).join() === Array.from(before["fc.W"]).join() };
  await train.destroy();
  return info;
}"""


def test_plain_data_optimizer_schedule_reset_and_param_shapes(net: Page) -> None:
    out = net.js(PLAIN_DATA)
    assert out == {"shapes": {"fc.W": [4, 2], "fc.b": [2]}, "count": 10, "step": "completed",
                   "same": True}, out
    kind = net.exec_json(f"type(loop.SESSION.graphs[{net.info['graphId']}].obj._optimizer)"
                         ".__name__")
    assert kind == "SGD"  # the fixture's graph is untouched


SINGLE_FLIGHT = """async () => {
  const calls = [];
  let release;
  const gate = new Promise((r) => { release = r; });
  const slow = tg.singleFlight(async (n) => { calls.push(n); if (n === 1) await gate; return n * 10; });
  const a = slow(1), b = slow(2), c = slow(3);   // 2 is displaced by 3 while 1 runs
  const bResult = await b;
  release();
  return { a: await a, b: bResult, c: await c, calls };
}"""


def test_single_flight_in_js(tg: Page) -> None:
    out = tg.js(SINGLE_FLIGHT)
    assert out == {"a": {"kind": "completed", "value": 10}, "b": {"kind": "aborted"},
                   "c": {"kind": "completed", "value": 30}, "calls": [1, 3]}


def test_check_webgpu_probes_without_freezing_and_caches(tg: Page) -> None:
    out = tg.js("""async () => {
      const t0 = performance.now();
      const first = await tg.checkWebGPU();
      const ms = performance.now() - t0;
      const second = await tg.checkWebGPU();
      return { first, same: first === second, ms };
    }""")
    assert out["first"]["ok"] is True and out["first"]["message"].startswith("WebGPU ready")
    assert out["same"], "a success is cached"
    print(f"\ncheckWebGPU: {out['first']['message']} in {out['ms']:.0f} ms")


def test_check_webgpu_inside_the_worker(tg: Page) -> None:
    got = tg.exec_json("(lambda r: [r.ok, r.reason, r.message])("
                       "await __import__('tensorgrad').check_webgpu())")
    assert got[0] is True and got[1] is None and got[2].startswith("WebGPU ready"), got


# JS values, as sources; each is checked against every primitive field type by the JS client's
# FIELD_CHECKS and by the worker's TYPES after the trip a message makes (structured clone, then
# Pyodide's conversion to Python).
SAMPLES = [
    "true", "false", "0", "1", "-0", "7", "1.5", "NaN", "Infinity", "-Infinity", "2 ** 53",
    "2 ** 53 - 1", "-(2 ** 53 - 1)", "10n", "'1'", "'false'", "''", "[]", "[1, 2]", "[1, null]",
    "[1.5]", "[true]", "['2']", "[[2], 'i32']", "[3, 'i32']", "[[2, null], 'f32']", "[[2], 3]",
    "[undefined, 2]", "{}", "{ shape: [2] }", "{ shape: [2], dtype: 'i32' }", "{ shape: [2], other: 1 }",
    "{ shape: 'x' }", "{ kind: 'adam', lr: 0.1 }", "{ lr: 0.1 }", "{ kind: 3 }",
    "new Float32Array(2)", "new Float64Array(2)", "new Int8Array(1)", "new Int16Array(1)",
    "new Int32Array(2)", "new Uint8Array(2)", "new Uint8ClampedArray(2)", "new Uint16Array(1)",
    "new Uint32Array(1)", "new BigInt64Array(1)", "new DataView(new ArrayBuffer(4))",
    "new ArrayBuffer(4)", "new Map([['kind', 'adam']])", "new Set([1])", "new Date(0)",
]
# Where the JS client is stricter: values that reach Python as a valid one would (an
# ArrayBuffer or a DataView as bytes, like a Uint8Array; a Map as a dict).
JS_STRICTER = {("typedArray", "new ArrayBuffer(4)"),
               ("typedArray", "new DataView(new ArrayBuffer(4))"),
               ("plainData", "new Map([['kind', 'adam']])")}


def test_the_js_clients_field_checks_agree_with_the_workers(tg: Page) -> None:
    primitives = tg.exec_json("[n for n, t in __import__('tensorgrad.web.protocol', fromlist="
                              "['TYPES']).TYPES.items() if t.test is not None]")
    js = tg.js("""([samples, names]) => Object.fromEntries(names.map((n) => [n,
      samples.map((s) => tg.FIELD_CHECKS[n]((0, eval)(`(${s})`)))]))""", [SAMPLES, primitives])
    py = tg.exec_json(f"""(lambda TYPES, convert, run_js: {{n: [
        TYPES[n].test(convert(run_js("(s) => structuredClone((0, eval)(`(${{s}})`))")(s)))
        for s in {SAMPLES!r}] for n in {primitives!r}}})(
        __import__('tensorgrad.web.protocol', fromlist=['TYPES']).TYPES,
        __import__('tensorgrad.web.convert', fromlist=['from_js']).from_js,
        __import__('pyodide.code', fromlist=['run_js']).run_js)""")
    differ = {(n, s) for n in primitives for s, a, b in zip(SAMPLES, js[n], py[n]) if a != b}
    assert differ == JS_STRICTER, differ
    for name, sample in JS_STRICTER:
        assert not js[name][SAMPLES.index(sample)], (name, sample)  # JS refuses, Python not
    assert sum(map(sum, js.values())) > 40  # accepted values, not only refusals


def test_the_workers_events_have_the_tables_types(tg: Page) -> None:
    """The progress events of start-up and the posts of a script, as the page received them,
    check against the table's event types."""
    from tensorgrad.web.protocol import check_event

    for event in tg.progress:
        check_event(event)
    posts = tg.js("""async () => {
      const seen = [];
      const listen = (e) => { if (e.data?.kind === "post") seen.push(e.data); };
      session.worker.addEventListener("message", listen);
      await session.runScript("import tensorgrad.web\\nfrom array import array\\n" +
        "async def main():\\n    tensorgrad.web.post({'w': array('f', [1, 2])})\\n" +
        "    tensorgrad.web.post(None)");
      session.worker.removeEventListener("message", listen);
      return seen.map((e) => ({ ...e, data: e.data && { w: Array.from(e.data.w) } }));
    }""")
    assert len(posts) == 2 and posts[0]["data"] == {"w": [1, 2]}, posts
    for event in posts:
        check_event(event)
