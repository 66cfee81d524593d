"""The worker's message loop (tensorgrad.web.worker) in CPython, on the native device: the
protocol table is enforced, optimizers and LRs arrive as plain data, reset/setLR work."""

from __future__ import annotations

import array
import asyncio
import contextlib
from typing import Any

import pytest

from tensorgrad import api
from tensorgrad.web import worker

MODEL = """
import tensorgrad as tg

class Tiny(tg.Module):
    def __init__(self):
        self.fc = tg.Linear(3, 1)

def tiny_loss(model, x, y):
    return tg.mean(tg.square(model.fc(x) - y))

class Two(tg.Module):  # the same loss fits it: model.fc(x) of [2, 3] -> [2, 1]
    def __init__(self):
        self.a = tg.Linear(3, 2)
        self.b = tg.Linear(2, 1)

    def fc(self, x):
        return self.b(tg.relu(self.a(x)))
"""
X = array.array("f", [0.5, -1.0, 2.0, 1.0, 0.0, -0.5])
Y = array.array("f", [1.0, -1.0])


@pytest.fixture
def session(gpu_device, monkeypatch) -> worker.Session:
    monkeypatch.setattr(api, "_default_device", gpu_device)  # the worker compiles on it
    s = worker.Session()
    reply = asyncio.run(worker.dispatch({"id": 1, "kind": "exec", "payload": {"source": MODEL}},
                                        s))
    assert reply["ok"], reply
    return s


def call(session: worker.Session, kind: str, payload: Any, request_id: int = 7) -> dict:
    return asyncio.run(worker.dispatch({"id": request_id, "kind": kind, "payload": payload},
                                       session))


def compile_tiny(session: worker.Session, optimizer: Any) -> dict:
    reply = call(session, "compile", {"model": "Tiny()", "loss": "tiny_loss",
                                      "inputs": {"x": [2, 3], "y": [2, 1]},
                                      "optimizer": optimizer, "seed": 4})
    assert reply["ok"], reply["error"]["traceback"]
    return reply["result"]


def test_plain_data_optimizer_and_graph_info(session) -> None:
    info = compile_tiny(session, {"kind": "adam", "lr": 0.05})
    assert info["paramNames"] == ["fc.W", "fc.b"]
    assert info["paramShapes"] == {"fc.W": [3, 1], "fc.b": [1]}
    assert info["paramCount"] == 4 and info["kernelCount"] > 0
    train = session.graph(info["graphId"]).obj
    assert type(train._optimizer).__name__ == "Adam" and train._optimizer.lr == 0.05
    step = call(session, "step", {"graphId": info["graphId"], "inputs": {"x": X, "y": Y}})
    assert step["ok"] and step["result"]["kind"] == "completed", step


def test_schedules_as_plain_data(session) -> None:
    info = compile_tiny(session, {"kind": "sgd", "lr": {"kind": "linear", "peak": 0.1,
                                                        "final": 0.0, "steps": 10}})
    train = session.graph(info["graphId"]).obj
    assert type(train._optimizer.lr).__name__ == "Linear"
    reply = call(session, "setLR", {"graphId": info["graphId"],
                                    "lr": {"kind": "constant", "value": 0.25}})
    assert reply["ok"], reply
    assert type(train._lr).__name__ == "Constant" and train._lr.value == 0.25


def test_reset_restores_the_initial_params(session) -> None:
    info = compile_tiny(session, "tg.optim.SGD(lr=0.5)")
    gid = info["graphId"]
    before = call(session, "downloadParams", {"graphId": gid})["result"]
    for _ in range(3):
        assert call(session, "step", {"graphId": gid, "inputs": {"x": X, "y": Y}})["ok"]
    moved = call(session, "downloadParams", {"graphId": gid})["result"]
    assert moved["fc.W"].tolist() != before["fc.W"].tolist()
    assert call(session, "reset", {"graphId": gid, "optimizer": False})["ok"]
    again = call(session, "downloadParams", {"graphId": gid})["result"]
    assert again["fc.W"].tolist() == before["fc.W"].tolist()
    assert session.graph(gid).obj.step_count == 3  # optimizer state was not reset
    assert call(session, "reset", {"graphId": gid})["ok"]
    assert session.graph(gid).obj.step_count == 0


@pytest.mark.parametrize(("message", "name", "text"), [
    ({"id": 3, "kind": "noSuchKind", "payload": {}}, "ProtocolError",
     "unknown message kind 'noSuchKind' (known: ping, exec, load, runScript, compile"),
    ({"id": 3, "kind": "step", "payload": {"graphId": 1}}, "ProtocolError",
     "step: payload field(s) missing ['inputs']; expected {graphId, inputs}"),
    ({"id": 3, "kind": "compile", "payload": {"model": "Tiny()", "loss": "tiny_loss",
                                              "inputs": {}, "optimiser": "x"}},
     "ProtocolError", ("compile: payload field(s) unknown ['optimiser']; expected {model, "
                       "loss, inputs, optimizer?, seed?}")),
    ({"id": 3, "kind": "exec", "payload": "print(1)"}, "ProtocolError",
     "exec: the payload must be an object {source, filename?}, got str"),
    ({"id": 3, "kind": "destroy", "payload": {"graphId": "one"}}, "ProtocolError",
     "destroy: field 'graphId' must be an integer id, got str 'one'"),
    ({"id": 3, "kind": "setLR", "payload": {"graphId": 999, "lr": 0.1}}, "AbortError",
     "graph 999 does not exist (destroyed?)"),
    ({"id": 3, "kind": "compile", "payload": {"model": "Tiny()", "loss": "tiny_loss",
                                              "inputs": {"x": [2, 3], "y": [2, 1]},
                                              "optimizer": {"kind": "lamb", "lr": 0.1}}},
     "ValueError", "unknown optimizer kind 'lamb' (known: ['adam', 'adamw', 'sgd'])"),
    ({"id": 3, "kind": "compile", "payload": {"model": "Tiny()", "loss": "tiny_loss",
                                              "inputs": {"x": [2, 3], "y": [2, 1]},
                                              "optimizer": {"kind": "sgd", "lr": 0.1},
                                              "seed": "abc"}},
     "ProtocolError", "compile: field 'seed' must be an integer, got str 'abc'"),
    ({"id": 3, "kind": "compile", "payload": {"model": "Tiny()", "loss": "tiny_loss",
                                              "inputs": {"x": [2, 3], "y": [2, 1]},
                                              "optimizer": {"kind": "sgd", "lr": 0.1},
                                              "seed": 1.5}},
     "ProtocolError", "compile: field 'seed' must be an integer, got float 1.5"),
    ({"id": 3, "kind": "compile", "payload": {"model": "Tiny()", "loss": "tiny_loss",
                                              "inputs": "x", "optimizer": {"kind": "sgd",
                                                                           "lr": 0.1}}},
     "ProtocolError", ("compile: field 'inputs' must be a record {name: shape or [shape, "
                       "dtype]}, got str 'x'")),
])
def test_bad_messages_are_answered_with_the_reason(session, message, name, text) -> None:
    reply = asyncio.run(worker.dispatch(message, session))
    assert reply["id"] == 3 and not reply["ok"]
    assert reply["error"]["name"] == name
    assert reply["error"]["message"].startswith(text), reply["error"]["message"]


def test_a_seed_is_an_int_as_it_arrives_from_js(session) -> None:
    """Pyodide turns a whole JS number into a Python int, so the worker takes exactly an int
    (a float seed, even a whole one, is a mistake made in Python on the page)."""
    reply = call(session, "compile", {"model": "Tiny()", "loss": "tiny_loss",
                                      "inputs": {"x": [2, 3], "y": [2, 1]},
                                      "optimizer": {"kind": "sgd", "lr": 0.1}, "seed": 4})
    assert reply["ok"], reply
    assert session.graph(reply["result"]["graphId"]).obj.seed == 4
    reply = call(session, "compile", {"model": "Tiny()", "loss": "tiny_loss",
                                      "inputs": {"x": [2, 3], "y": [2, 1]},
                                      "optimizer": {"kind": "sgd", "lr": 0.1}, "seed": 4.0})
    assert not reply["ok"] and reply["error"]["name"] == "ProtocolError", reply


def test_a_message_that_is_not_an_object(session) -> None:
    reply = asyncio.run(worker.dispatch(["exec", "1"], session))
    assert reply == {"id": None, "ok": False, "error": reply["error"]}
    assert reply["error"]["message"] == ("a message must be an object {id, kind, payload}, "
                                         "got list")


def test_step_on_a_destroyed_graph_is_aborted(session) -> None:
    info = compile_tiny(session, {"kind": "adam", "lr": 0.01})
    assert call(session, "destroy", {"graphId": info["graphId"]})["ok"]
    reply = call(session, "step", {"graphId": info["graphId"], "inputs": {"x": X, "y": Y}})
    assert reply["ok"] and reply["result"] == {"kind": "aborted"}


_ID = "field 'graphId' must be an integer id, got"


@pytest.mark.parametrize(("kind", "payload", "message"), [
    ("reset", {"params": "false"}, "reset: field 'params' must be a bool, got str 'false'"),
    ("reset", {"optimizer": 0}, "reset: field 'optimizer' must be a bool, got int 0"),
    ("uploadParams", {"params": {"fc.b": array.array("f", [9.0])}, "partial": "no"},
     "uploadParams: field 'partial' must be a bool, got str 'no'"),
    ("uploadParams", {"params": {"fc.b": array.array("d", [9.0])}, "partial": True},
     ("uploadParams: field 'params' must be a record {name: Float32Array}, got array of "
      "format 'd' (1 items) for 'fc.b'")),
    ("reset", {"graphId": float("nan")}, f"reset: {_ID} float nan"),
    ("destroy", {"graphId": float("inf")}, f"destroy: {_ID} float inf"),
    ("destroy", {"graphId": 1.5}, f"destroy: {_ID} float 1.5"),
])
def test_a_field_of_the_wrong_type_changes_nothing(session, kind, payload, message) -> None:
    """A mistyped field is refused before anything runs: the trained params stay (reset with
    params "false" once re-initialised them; partial "no" acted as partial)."""
    gid = compile_tiny(session, "tg.optim.SGD(lr=0.5)")["graphId"]
    assert call(session, "step", {"graphId": gid, "inputs": {"x": X, "y": Y}})["ok"]
    before = {k: v.tolist() for k, v in call(session, "downloadParams",
                                             {"graphId": gid})["result"].items()}
    reply = call(session, kind, {"graphId": gid, **payload})
    assert not reply["ok"] and reply["error"]["name"] == "ProtocolError", reply
    assert reply["error"]["message"] == message
    after = call(session, "downloadParams", {"graphId": gid})["result"]
    assert {k: v.tolist() for k, v in after.items()} == before
    assert session.graph(gid).obj.step_count == 1


def test_shaped_data_over_the_protocol_is_checked_against_the_declared_shape(session) -> None:
    """A 2-D buffer reaches upload_params and step with its shape (the worker does not flatten
    it first): a transposed one is refused, one of the declared shape or flat one is taken."""
    info = compile_tiny(session, {"kind": "sgd", "lr": 0.1})
    gid = info["graphId"]
    w_t = memoryview(array.array("f", [1.0, 2.0, 3.0])).cast("B").cast("f", (1, 3))
    reply = call(session, "uploadParams", {"graphId": gid, "params": {"fc.W": w_t},
                                           "partial": True})
    assert not reply["ok"] and reply["error"]["name"] == "ShapeError", reply
    assert reply["error"]["message"].startswith(
        "upload_params 'fc.W': got [1, 3], the transpose of [3, 1]: pass w.T"), reply
    x_t = memoryview(X).cast("B").cast("f", (3, 2))
    reply = call(session, "step", {"graphId": gid, "inputs": {"x": x_t, "y": Y}})
    assert reply["ok"] and reply["result"]["kind"] == "failed", reply
    assert reply["result"]["error"]["message"].startswith(
        "input 'x': got [3, 2], the transpose of [2, 3]: pass x.T"), reply
    w = memoryview(array.array("f", [1.0, 2.0, 3.0])).cast("B").cast("f", (3, 1))
    reply = call(session, "uploadParams", {"graphId": gid, "params": {"fc.W": w},
                                           "partial": True})
    assert reply["ok"], reply
    x = memoryview(X).cast("B").cast("f", (2, 3))
    reply = call(session, "step", {"graphId": gid, "inputs": {"x": x, "y": Y}})
    assert reply["ok"] and reply["result"]["kind"] == "completed", reply


# -- several messages in flight (the page sends steps without awaiting each) ----------------
def batch(i: int) -> dict[str, array.array]:
    return {"x": array.array("f", [(i * 3 + k) % 7 * 0.25 - 0.75 for k in range(6)]),
            "y": array.array("f", [0.5 * (i % 3) - 0.5, 1.0 - 0.25 * (i % 4)])}


def messages(gid: int, kinds: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{"id": 100 + n, "kind": kind, "payload": {"graphId": gid, **payload}}
            for n, (kind, payload) in enumerate(kinds)]


async def arrive_together(session: worker.Session, sent: list[dict[str, Any]],
                          train: Any = None) -> tuple[list[dict[str, Any]], int | None]:
    """Dispatch every message as the worker does when they arrive together (one coroutine each,
    started in arrival order). With `train`, its call queue is held meanwhile (nothing of it
    runs, on any machine): also how many calls wait in it once every handler reached its
    first wait."""
    holding = train._queue if train is not None else contextlib.nullcontext()
    async with holding:
        tasks = [asyncio.ensure_future(worker.dispatch(m, session)) for m in sent]
        for _ in range(3):
            await asyncio.sleep(0)
        waiting = len(train._queue._waiters) if train is not None else None
    return list(await asyncio.gather(*tasks)), waiting


def test_steps_sent_together_give_the_losses_and_params_of_awaited_steps(session) -> None:
    """Ten steps (and a download behind them) sent without waiting: the same losses, in order,
    and the same params as ten steps each awaited before the next, on a twin graph. Every
    step is in the handle's call queue as soon as its message is handled: no worker-side lock
    holds the later ones back until the earlier ones are done."""
    awaited, together = (compile_tiny(session, {"kind": "adam", "lr": 0.05})["graphId"]
                         for _ in range(2))
    losses = []
    for i in range(10):
        reply = call(session, "step", {"graphId": awaited, "inputs": batch(i)})
        losses.append(reply["result"]["loss"])
    expected = call(session, "downloadParams", {"graphId": awaited})["result"]
    train = session.graph(together).obj
    sent = messages(together, [("step", {"inputs": batch(i)}) for i in range(10)]
                    + [("downloadParams", {})])
    replies, waiting = asyncio.run(arrive_together(session, sent, train))
    assert [r["id"] for r in replies] == [m["id"] for m in sent]
    assert [r["result"]["loss"] for r in replies[:10]] == losses  # bit for bit, in order
    got = replies[10]["result"]
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in expected.items()}
    assert train.step_count == 10
    assert waiting == 11, f"{waiting} calls queued in the handle, expected the 11 sent"


def test_replace_model_aborts_the_steps_in_flight_before_it(session) -> None:
    """A replaceModel sent behind steps that have not finished makes them Aborted (as
    Training.replace_model does natively; the worker's lock let them finish before); the steps
    sent after it run on the new model, and each replaceModel reply describes its own model."""
    gid = compile_tiny(session, {"kind": "adam", "lr": 0.05})["graphId"]
    sent = messages(gid, [("step", {"inputs": batch(0)}), ("step", {"inputs": batch(1)}),
                          ("replaceModel", {"model": "Two()", "seed": 1}),
                          ("step", {"inputs": batch(2)}),
                          ("replaceModel", {"model": "Tiny()", "seed": 2}),
                          ("step", {"inputs": batch(3)}), ("step", {"inputs": batch(4)})])
    replies, _ = asyncio.run(arrive_together(session, sent))
    assert all(r["ok"] for r in replies), replies
    kinds = [r["result"]["kind"] if "kind" in (r["result"] or {}) else "info" for r in replies]
    assert kinds == ["aborted", "aborted", "info", "aborted", "info", "completed", "completed"]
    assert replies[2]["result"]["paramNames"] == ["a.W", "a.b", "b.W", "b.b"]
    assert replies[4]["result"]["paramNames"] == ["fc.W", "fc.b"]
    # the two steps after the last replaceModel ran on a fresh Tiny(seed 2): a twin agrees
    twin = call(session, "compile", {"model": "Tiny()", "loss": "tiny_loss",
                                     "inputs": {"x": [2, 3], "y": [2, 1]},
                                     "optimizer": {"kind": "adam", "lr": 0.05}, "seed": 2})
    twin_losses = [call(session, "step", {"graphId": twin["result"]["graphId"],
                                          "inputs": batch(i)})["result"]["loss"] for i in (3, 4)]
    assert [r["result"]["loss"] for r in replies[5:]] == twin_losses
    assert session.graph(gid).obj.step_count == 2


def test_destroy_aborts_the_steps_in_flight_and_those_after_it(session) -> None:
    gid = compile_tiny(session, {"kind": "adam", "lr": 0.05})["graphId"]
    sent = messages(gid, [("step", {"inputs": batch(i)}) for i in range(3)]
                    + [("destroy", {})] + [("step", {"inputs": batch(i)}) for i in range(2)])
    replies, _ = asyncio.run(arrive_together(session, sent))
    assert [r["result"] for r in replies] == [{"kind": "aborted"}] * 3 + [None] + [
        {"kind": "aborted"}] * 2
    assert gid not in session.graphs


def test_a_failed_step_in_flight_fails_alone_and_the_later_steps_run(session) -> None:
    """A step that fails among steps sent together (a NaN input: the update is skipped; an
    input of the wrong size: refused when its message is handled) gets its own failed reply;
    the steps sent after it still run, in order, with the losses, errors and params of the
    same steps awaited one by one."""
    def bad(i: int) -> dict[str, array.array]:
        data = batch(i)
        if i == 3:
            data["x"][4] = float("nan")
        if i == 6:
            data["x"] = array.array("f", data["x"][:5])
        return data

    awaited, together = (compile_tiny(session, {"kind": "adam", "lr": 0.05})["graphId"]
                         for _ in range(2))
    expected = [call(session, "step", {"graphId": awaited, "inputs": bad(i)})["result"]
                for i in range(9)]
    sent = messages(together, [("step", {"inputs": bad(i)}) for i in range(9)])
    replies, _ = asyncio.run(arrive_together(session, sent))
    got = [r["result"] for r in replies]

    def outcome(r: dict[str, Any]) -> tuple[Any, ...]:
        if r["kind"] == "failed":
            # (a ShapeError's message goes on with where the step was called: not compared)
            return ("failed", r["error"]["name"], r["error"]["message"].splitlines()[0])
        return (r["kind"], r["loss"])

    assert [outcome(r) for r in got] == [outcome(r) for r in expected]
    assert [r["kind"] for r in got] == ["completed"] * 3 + ["failed"] + ["completed"] * 2 + [
        "failed"] + ["completed"] * 2
    assert got[3]["error"]["name"] == "FloatingPointError"
    assert got[6]["error"]["name"] == "ShapeError"
    awaited_params, together_params = (
        {k: v.tolist() for k, v in call(session, "downloadParams", {"graphId": g})["result"].items()}
        for g in (awaited, together))
    assert together_params == awaited_params
    assert session.graph(together).obj.step_count == 7
