"""The catalogue of bad inputs, browser layer: what the page gets, in headless Chromium with
the real worker, Pyodide and navigator.gpu, for bad messages, bad data, a worker that dies,
Pyodide that cannot load and a lost GPU device. Nothing hangs; every pending call settles
with a clear error, and a new start() works."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .conftest import START_SESSION, Page

MODELS = """
import tensorgrad as tg

class BadNet(tg.Module):
    def __init__(self):
        self.l1 = tg.Linear(2, 8)
        self.l2 = tg.Linear(8, 1)

    def forward(self, x):
        return self.l2(tg.relu(self.l1(x)))

def bad_mse(model, x, y):
    return tg.mean(tg.square(model(x) - y))

class BadTokens(tg.Module):
    def __init__(self):
        self.emb = tg.Embedding(5, 3)

def bad_token_loss(model, ids, target):
    return tg.cross_entropy(model.emb(ids), target)

def bad_user_code(model, x, y):
    return tg.mean(model(x)) + not_defined_anywhere

"ok"
"""

COMPILE = """async () => {
  window.bad = await session.compile({ model: "BadNet()", loss: "bad_mse", seed: 1,
    inputs: { x: [4, 2], y: [4, 1] }, optimizer: { kind: "adam", lr: 0.01 } });
  window.badTokens = await session.compile({ model: "BadTokens()", loss: "bad_token_loss",
    seed: 1, inputs: { ids: [[4], "i32"], target: [[4], "i32"] },
    optimizer: { kind: "sgd", lr: 0.1 } });
  return true;
}"""

# A call on the page: resolves {kind: "completed"|"aborted"|"failed"|"rejected"|"ok", name,
# message} whether it rejects or resolves a result.
SETTLE = """async (source) => {
  const call = new Function("x", "y", `return (async () => (${source}))()`);
  const x = () => new Float32Array(8).fill(0.5), y = () => new Float32Array(4).fill(1);
  try {
    const r = await call(x, y);
    if (r && r.kind) return { kind: r.kind, name: r.error?.name, message: r.error?.message };
    return { kind: "ok", value: r ?? null };
  } catch (e) {
    return { kind: "rejected", name: e.name, message: e.message };
  }
}"""


@dataclass(frozen=True)
class Bad:
    what: str
    call: str       # a JS expression on the page (x() and y() make good f32 inputs)
    kind: str       # failed | rejected | aborted
    name: str
    message: str    # a regex searched in the message


CATALOGUE = [
    Bad("a syntax error in exec", "session.exec('def broken(:\\n  pass')", "rejected",
        "SyntaxError", r"invalid syntax|expected"),
    Bad("a syntax error in runScript", "session.runScript('async def main(:')", "rejected",
        "SyntaxError", r"invalid syntax|expected"),
    Bad("a script without main", "session.runScript('x = 1')", "rejected", "TypeError",
        r"^runScript: the source must define `async def main\(\)`$"),
    Bad("a Python error in the user's model", "session.compile({ model: 'BadNet()', "
        "loss: 'bad_user_code', inputs: { x: [4, 2], y: [4, 1] }, optimizer: "
        "{ kind: 'adam', lr: 0.1 } })", "rejected", "NameError",
        r"name 'not_defined_anywhere' is not defined"),
    Bad("a message kind the protocol lacks", "session.request('trainFaster', {})", "rejected",
        "ProtocolError", r"^unknown message kind \"trainFaster\" \(known: ping, exec"),
    Bad("a misspelled payload field", "session.request('step', { graphId: bad.graphId, "
        "input: {} })", "rejected", "ProtocolError",
        r"^step: payload field\(s\) missing \[inputs\] and unknown \[input\]"),
    Bad("a payload that is not an object", "session.request('exec', 'print(1)')", "rejected",
        "ProtocolError", r"^exec: the payload must be an object \{source, filename\?\}$"),
    Bad("an optimizer of an unknown kind", "session.compile({ model: 'BadNet()', loss: "
        "'bad_mse', inputs: { x: [4, 2], y: [4, 1] }, optimizer: { kind: 'lamb', lr: 1 } })",
        "rejected", "ValueError", r"^unknown optimizer kind 'lamb'"),
    Bad("a model expression that does not evaluate", "session.compile({ model: 'NoSuchNet()', "
        "loss: 'bad_mse', inputs: { x: [4, 2], y: [4, 1] }, optimizer: 'tg.optim.SGD(lr=1)' })",
        "rejected", "NameError", r"name 'NoSuchNet' is not defined"),
    Bad("data that cannot be sent (a function)", "bad.step({ x: () => 1, y: y() })", "failed",
        "ProtocolError", r"^step: field 'inputs' must be a record \{name: typed array\}, got "
        r"function for 'x'$"),
    Bad("a string as data", "bad.step({ x: 'zeros', y: y() })", "failed", "ProtocolError",
        r"^step: field 'inputs' must be a record \{name: typed array\}, got string 'zeros' "
        r"for 'x'$"),
    Bad("an Int32Array for an f32 input", "bad.step({ x: new Int32Array(8), y: y() })",
        "failed", "ShapeError", r"^input 'x': expected f32 data \(format 'f'\), got a buffer "
        r"of format 'i'"),
    Bad("an input of the wrong size", "bad.step({ x: new Float32Array(3), y: y() })", "failed",
        "ShapeError", r"^input 'x': expected 8 elements = 32 bytes \(shape \[4, 2\]\), got 12"),
    Bad("a missing input", "bad.step({ x: x() })", "failed", "ShapeError",
        r"^step: inputs missing \['y'\]"),
    Bad("an embedding id past the vocabulary", "badTokens.step({ ids: Int32Array.from([0, 1, "
        "9, 2]), target: Int32Array.from([0, 1, 2, 0]) })", "failed", "ShapeError",
        r"^input 'ids': holds 9 at flat index 2, outside 0\.\.4"),
    Bad("a NaN in the data", "bad.step({ x: x(), y: Float32Array.from([1, NaN, 1, 1]) })",
        "failed", "FloatingPointError", r"^loss is nan at step 1: the update was skipped, "
        r"params and optimizer state are unchanged; input 'y' holds nan at flat index 1"),
    Bad("uploading an unknown param", "bad.uploadParams({ 'l9.W': new Float32Array(2) })",
        "rejected", "KeyError", r"upload_params: unknown param\(s\) \['l9\.W'\]"),
    Bad("a negative learning rate", "bad.setLR(-1)", "rejected", "ValueError",
        r"^lr must be >= 0 \(a learning rate\), got -1"),
    Bad("a schedule of an unknown kind", "bad.setLR({ kind: 'exp', peak: 1 })", "rejected",
        "ValueError", r"unknown"),
    Bad("resetting a forward graph", "bad.attach({ forward: 'lambda m, x: m(x)', inputs: "
        "{ x: [null, 2] } }).then((f) => session.request('reset', { graphId: f.graphId }))",
        "rejected", "TypeError", r"^reset: graph \d+ is a forward graph, not a training graph"),
]


@pytest.fixture(scope="module")
def models(tg_page: Page) -> Page:
    assert tg_page.exec(MODELS) == "'ok'"
    assert tg_page.js(COMPILE) is True
    return tg_page


@pytest.mark.parametrize("bad", CATALOGUE, ids=[b.what for b in CATALOGUE])
def test_bad_input_settles_with_a_clear_error(models: Page, bad: Bad) -> None:
    got = models.js(SETTLE, bad.call)
    assert got["kind"] == bad.kind and got["name"] == bad.name, got
    assert re.search(bad.message, got["message"] or ""), got
    assert models.js("() => session.exec('1 + 1')") == "2"  # the worker goes on


def test_raw_malformed_messages_are_answered(models: Page) -> None:
    """Messages posted to the worker without the client's checks: the worker's own checks
    answer them, by id, and it keeps serving."""
    out = models.js("""async () => {
      const replies = [];
      const listen = (e) => { if (e.data?.id === 901 || e.data?.id === 902) replies.push(e.data); };
      session.worker.addEventListener("message", listen);
      session.worker.postMessage({ id: 901, kind: 42, payload: {} });
      session.worker.postMessage({ id: 902, kind: "step", payload: { graphId: "x", inputs: 5 } });
      for (let i = 0; i < 100 && replies.length < 2; i++) await new Promise((r) => setTimeout(r, 50));
      session.worker.removeEventListener("message", listen);
      return replies.map((r) => ({ id: r.id, ok: r.ok, name: r.error?.name,
                                   message: r.error?.message }));
    }""")
    byid = {r["id"]: r for r in out}
    assert byid[901]["ok"] is False and byid[901]["name"] == "ProtocolError"
    assert byid[901]["message"].startswith("unknown message kind 42"), byid
    assert byid[902]["ok"] is True or byid[902]["name"], byid  # a step result: never hangs
    assert models.js("() => session.exec('2 + 2')") == "4"


def test_calls_after_destroy_are_aborted(models: Page) -> None:
    out = models.js("""async () => {
      const t = await session.compile({ model: "BadNet()", loss: "bad_mse", seed: 1,
        inputs: { x: [4, 2], y: [4, 1] }, optimizer: "tg.optim.SGD(lr=0.1)" });
      const pending = t.step({ x: new Float32Array(8), y: new Float32Array(4) });
      await t.destroy();
      const after = await t.step({ x: new Float32Array(8), y: new Float32Array(4) });
      return [(await pending).kind, after.kind];
    }""")
    assert out[0] in ("completed", "aborted") and out[1] == "aborted", out


def test_an_upload_during_a_step_lands_wholly_after_it(models: Page) -> None:
    out = models.js("""async () => {
      const zeros = {};
      for (const [name, shape] of Object.entries(bad.paramShapes)) {
        zeros[name] = new Float32Array(shape.reduce((a, b) => a * b, 1));
      }
      const step = bad.step({ x: new Float32Array(8).fill(0.5), y: new Float32Array(4).fill(1) });
      const upload = bad.uploadParams(zeros);
      const [r] = await Promise.all([step, upload]);
      const params = await bad.downloadParams();
      return { kind: r.kind, nonzero: Object.values(params).reduce(
        (n, a) => n + a.filter((v) => v !== 0).length, 0) };
    }""")
    assert out == {"kind": "completed", "nonzero": 0}, out


def test_a_nan_step_changes_nothing_and_the_next_step_goes_on(models: Page) -> None:
    out = models.js("""async () => {
      const t = await session.compile({ model: "BadNet()", loss: "bad_mse", seed: 2,
        inputs: { x: [4, 2], y: [4, 1] }, optimizer: "tg.optim.Adam(lr=0.01)" });
      const x = () => new Float32Array(8).fill(0.5), y = () => new Float32Array(4).fill(1);
      const flat = (p) => Object.values(p).map((a) => Array.from(a).join()).join("|");
      const before = flat(await t.downloadParams());
      const nan = await t.step({ x: x(), y: Float32Array.from([NaN, 1, 1, 1]) });
      const same = flat(await t.downloadParams()) === before;
      const good = await t.step({ x: x(), y: y() });
      const moved = flat(await t.downloadParams()) !== before;
      await t.destroy();
      return { nan: nan.kind, same, good: good.kind, moved };
    }""")
    assert out == {"nan": "failed", "same": True, "good": "completed", "moved": True}, out


# ---- the worker and the device themselves -------------------------------------------------

@pytest.fixture
def fresh(browser: Any, web_url: str) -> Iterator[Page]:
    """A page of its own (its own worker), with the client module loaded as window.tg."""
    page = Page(browser.new_page())
    page.page.goto(web_url + "index.html")
    page.js('async () => { window.tg = await import("/tensorgrad.js"); }')
    yield page
    page.page.close()


def test_a_worker_that_dies_fails_every_pending_call_and_start_works_again(fresh: Page
                                                                           ) -> None:
    fresh.js(START_SESSION)
    out = fresh.js("""async () => {
      const slow = session.runScript("import asyncio\\nasync def main():\\n" +
                                     "    await asyncio.sleep(30)").then(
        () => "resolved", (e) => `${e.name}: ${e.message}`);
      session.exec("import js\\njs.close()").catch(() => null);  // the worker closes itself
      const t0 = performance.now();
      const pending = await slow;
      const waited = performance.now() - t0;
      const later = await session.exec("1").then(() => "resolved", (e) => e.name);
      const again = await tg.start();
      const works = await again.exec("6 * 7");
      again.terminate();
      return { pending, waited, later, works };
    }""")
    assert out["pending"].startswith("WorkerDied: tensorgrad's worker stopped (it was closed "
                                     "or crashed); pending calls failed"), out
    assert out["waited"] < 10_000 and out["later"] == "WorkerDied" and out["works"] == "42", out


def test_pyodide_that_cannot_load_rejects_start_and_start_works_again(fresh: Page) -> None:
    out = fresh.js("""async () => {
      const failed = await tg.start({ indexURL: "/no-pyodide-here/" }).then(
        () => "started", (e) => e.message);
      const session = await tg.start();
      const works = await session.exec("'ok'");
      session.terminate();
      return { failed, works };
    }""")
    assert re.match(r"loading Pyodide from http://127\.0\.0\.1:\d+/no-pyodide-here/ failed: ",
                    out["failed"]), out
    assert out["works"] == "'ok'", out


def test_a_lost_device_fails_every_call_by_name_and_a_new_device_works(fresh: Page) -> None:
    fresh.js(START_SESSION)
    assert fresh.js("(src) => session.exec(src)", MODELS) == "'ok'"
    out = fresh.js("""async () => {
      const compile = () => session.compile({ model: "BadNet()", loss: "bad_mse", seed: 1,
        inputs: { x: [4, 2], y: [4, 1] }, optimizer: "tg.optim.SGD(lr=0.1)" });
      const x = () => new Float32Array(8), y = () => new Float32Array(4);
      const t = await compile();
      const before = (await t.step({ x: x(), y: y() })).kind;
      await session.exec("import tensorgrad as tg\\n(await tg.default_device()).destroy()");
      await new Promise((r) => setTimeout(r, 100));  // device.lost settles
      const lost = await t.step({ x: x(), y: y() });
      const lostAgain = await t.step({ x: x(), y: y() });
      const fresh = await compile();                  // a new default device
      const after = (await fresh.step({ x: x(), y: y() })).kind;
      return { before, lost: [lost.kind, lost.error?.name, lost.error?.message],
               again: lostAgain.kind, after };
    }""")
    assert out["before"] == "completed" and out["again"] == "failed", out
    kind, name, message = out["lost"]
    assert kind == "failed" and name == "DeviceLostError", out
    assert message.startswith("the GPU device was lost (destroyed"), out
    assert out["after"] == "completed", out


# ---- mistyped fields: the protocol's field types -------------------------------------------

# Posts a raw message (no client checks) and resolves its reply; `posted()` counts what the
# page posted to the worker since `window.countPosts()`.
RAW = """
window.raw = (kind, payload) => new Promise((resolve) => {
  const id = 7000 + (window.rawIds = (window.rawIds ?? 0) + 1);
  const listen = (e) => {
    if (e.data?.id !== id) return;
    session.worker.removeEventListener("message", listen);
    resolve({ ok: e.data.ok, name: e.data.error?.name, message: e.data.error?.message,
              result: e.data.ok ? e.data.result : undefined });
  };
  session.worker.addEventListener("message", listen);
  session.worker.postMessage({ id, kind, payload });
});
window.countPosts = () => {
  if (!session.worker.counted) {
    const post = session.worker.postMessage.bind(session.worker);
    session.worker.postMessage = (...args) => { session.worker.counted.n += 1; return post(...args); };
  }
  session.worker.counted = { n: 0 };
};
window.posted = () => session.worker.counted.n;
window.flatParams = async (t) => Object.entries(await t.downloadParams()).map(
  ([k, v]) => `${k}=${Array.from(v).join()}`).join("|");
true
"""

ID = r"must be an integer id, got"
# (JS payload expression for a raw message or a client call, what the worker says came, what
# the JS client says came). `G` is the trained graph's id, `P()` a full set of params.
_F32 = r"must be a record \{name: Float32Array\}, got"
_LR = r"must be a learning rate: a number, a schedule \{kind, \.\.\.\} or a Python expression, got"
_IN = r"must be a record \{name: typed array\}, got"
MISTYPED = [
    ("reset", "{ graphId: G, params: 'false' }",
     r"field 'params' must be a bool, got str 'false'",
     r"field 'params' must be a bool, got string 'false'"),
    ("reset", "{ graphId: G, optimizer: 0 }",
     r"field 'optimizer' must be a bool, got int 0",
     r"field 'optimizer' must be a bool, got number 0"),
    ("uploadParams", "{ graphId: G, params: { 'l2.b': new Float32Array(1) }, partial: 'no' }",
     r"field 'partial' must be a bool, got str 'no'",
     r"field 'partial' must be a bool, got string 'no'"),
    ("uploadParams", "{ graphId: G, params: { ...P(), 'l2.b': new Float64Array(1) } }",
     rf"field 'params' {_F32} memoryview of format 'd' \(1 items\) for 'l2\.b'",
     rf"field 'params' {_F32} Float64Array\(1\) for 'l2\.b'"),
    ("reset", "{ graphId: NaN }", rf"field 'graphId' {ID} float nan",
     rf"field 'graphId' {ID} number NaN"),
    ("reset", "{ graphId: Infinity }", rf"field 'graphId' {ID} float inf",
     rf"field 'graphId' {ID} number Infinity"),
    ("reset", "{ graphId: G + 0.5 }", rf"field 'graphId' {ID} float \d+\.5",
     rf"field 'graphId' {ID} number \d+\.5"),
    ("reset", "{ graphId: String(G) }", rf"field 'graphId' {ID} str '\d+'",
     rf"field 'graphId' {ID} string '\d+'"),
    ("destroy", "{ graphId: true }", rf"field 'graphId' {ID} bool True",
     rf"field 'graphId' {ID} boolean true"),
    ("downloadParams", "{ graphId: -Infinity }", rf"field 'graphId' {ID} float -inf",
     rf"field 'graphId' {ID} number -Infinity"),
    ("setLR", "{ graphId: G, lr: NaN }", rf"field 'lr' {_LR} float nan",
     rf"field 'lr' {_LR} number NaN"),
    ("step", "{ graphId: G, inputs: { x: [1, 2], y: new Float32Array(4) } }",
     rf"field 'inputs' {_IN} list \[1, 2\] for 'x'",
     rf"field 'inputs' {_IN} array \[1,2\] for 'x'"),
]


@pytest.fixture(scope="module")
def trained(models: Page) -> Page:
    """`window.trained`: BadNet after a few SGD steps (params no longer the initial ones)."""
    models.js(RAW)
    models.js("""async () => {
      window.trained = await session.compile({ model: "BadNet()", loss: "bad_mse", seed: 5,
        inputs: { x: [4, 2], y: [4, 1] }, optimizer: "tg.optim.SGD(lr=0.5)" });
      window.G = trained.graphId;
      window.P = () => Object.fromEntries(Object.entries(trained.paramShapes).map(
        ([k, s]) => [k, new Float32Array(s.reduce((a, b) => a * b, 1)).fill(3)]));
      for (let i = 0; i < 3; i++) {
        await trained.step({ x: new Float32Array(8).fill(0.5), y: new Float32Array(4).fill(1) });
      }
    }""")
    return models


@pytest.mark.parametrize(("kind", "payload", "worker", "client"), MISTYPED,
                         ids=[f"{k} {p}"[:50] for k, p, _, _ in MISTYPED])
def test_the_worker_refuses_a_mistyped_field_and_the_params_stay(
        trained: Page, kind: str, payload: str, worker: str, client: str) -> None:
    """A raw message (no client checks) with a field of the wrong type: ProtocolError from
    the worker, and the trained params are what they were (downloaded and compared)."""
    out = trained.js(f"""async () => {{
      const before = await flatParams(trained);
      const reply = await raw("{kind}", {payload});
      return {{ reply, same: (await flatParams(trained)) === before,
                live: (await trained.step({{ x: new Float32Array(8),
                                            y: new Float32Array(4) }})).kind }};
    }}""")
    assert out["reply"]["ok"] is False and out["reply"]["name"] == "ProtocolError", out
    assert re.fullmatch(f"{kind}: {worker}", out["reply"]["message"]), out
    assert out["same"] and out["live"] == "completed", out


@pytest.mark.parametrize(("kind", "payload", "worker", "client"), MISTYPED,
                         ids=[f"{k} {p}"[:50] for k, p, _, _ in MISTYPED])
def test_the_js_client_refuses_a_mistyped_field_before_sending(
        trained: Page, kind: str, payload: str, worker: str, client: str) -> None:
    out = trained.js(f"""async () => {{
      const payload = {payload};
      const arrays = Object.values(payload.params ?? payload.inputs ?? {{}});
      countPosts();
      const err = await session.request("{kind}", payload).then(() => null, (e) => e);
      return {{ name: err?.name, message: err?.message, isError: err instanceof Error,
                posted: posted(), detached: arrays.some((a) => a.byteLength === 0) }};
    }}""")
    assert out["name"] == "ProtocolError" and out["isError"], out
    assert re.fullmatch(f"{kind}: {client}", out["message"]), out
    assert out["posted"] == 0 and not out["detached"], out


def test_the_js_clients_methods_refuse_mistyped_options(trained: Page) -> None:
    out = trained.js("""async () => {
      const before = await flatParams(trained);
      countPosts();
      const err = (p) => p.then(() => null, (e) => `${e.name}: ${e.message}`);
      const reset = await err(trained.reset({ params: "false" }));
      const partial = await err(trained.uploadParams({ "l2.b": new Float32Array(1) },
                                                     { partial: "no" }));
      const seed = await err(trained.replaceModel("BadNet()", { seed: 1.5 }));
      const n = posted();
      return { reset, partial, seed, posted: n, same: (await flatParams(trained)) === before };
    }""")
    assert out["reset"] == ("ProtocolError: reset: field 'params' must be a bool, got string "
                            "'false'"), out
    assert out["partial"] == ("ProtocolError: uploadParams: field 'partial' must be a bool, got "
                              "string 'no'"), out
    assert out["seed"] == ("ProtocolError: replaceModel: field 'seed' must be an integer, got "
                           "number 1.5"), out
    assert out["posted"] == 0 and out["same"], out


def test_null_fields_are_absent_for_the_worker(trained: Page) -> None:
    """{params: null} is the default (true), not false: reset re-initialises the params."""
    out = trained.js("""async () => {
      const before = await flatParams(trained);
      const reply = await raw("reset", { graphId: G, params: null, optimizer: null });
      const after = await flatParams(trained);
      await trained.reset();
      return { ok: reply.ok, reset: after !== before, init: after === await flatParams(trained) };
    }""")
    assert out == {"ok": True, "reset": True, "init": True}, out


def test_a_message_python_cannot_read_is_a_protocol_error(trained: Page) -> None:
    out = trained.js("""() => raw("step", { graphId: G, inputs: { x: new Float16Array(8),
                                                                    y: new Float32Array(4) } })""")
    assert out["ok"] is False and out["name"] == "ProtocolError", out
    assert out["message"].startswith("step: the worker cannot read this message's payload ("), out
    assert out["message"].endswith("send plain data and typed arrays (Float32Array, "
                                   "Int32Array, ...)"), out
