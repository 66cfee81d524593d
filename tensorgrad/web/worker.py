"""The Python message loop of tensorgrad's Web Worker (``web/worker.mjs`` calls :func:`handle`).

A message ``{id, kind, payload}`` is checked against the protocol table
(:mod:`tensorgrad.web.protocol`: its kind, its fields and each field's type) and goes to the
handler registered for ``kind``, its null fields left out (an optional field takes its
default: a handler never sees a field of the wrong type or None). What the
handler returns becomes ``{id, ok: true, result}``; what it raises becomes ``{id, ok: false,
error: {name, message, traceback}}``, `name` being the exception's class name (the page
client maps it back, see :func:`tensorgrad.errors.remote_error`). Handlers run concurrently
(each message is its own coroutine, started in arrival order). A handler that works on a
graph calls its handle before its first ``await``, so the call takes its place in the
handle's own call queue (:class:`~tensorgrad.flight.CallQueue`) in message order: a step
starts as soon as its message arrives, while the steps sent before it still run, and the
page can keep several in flight. Steps, runs, uploads and the rest run one at a time in that
order with the results of the Python API; a ``replaceModel`` or ``destroy`` makes the calls
sent before it that have not finished return Aborted, as :meth:`Training.replace_model
<tensorgrad.Training.replace_model>` does.

Typed arrays in a payload arrive as memoryviews ('f' for Float32Array, 'i' for Int32Array).
A message Python cannot read (a Float16Array, ...) is answered with a ProtocolError.
The same loop runs in CPython with plain dicts (``await handle({...})``), for tests.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import itertools
import linecache
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, cast

from .. import api, optim
from .. import lr as lr_mod
from ..api import Forward, Training
from ..errors import AbortError, ProtocolError
from ..gpu import in_pyodide
from ..results import Result
from .convert import error_info, flat_buffer, from_js, plain, result_message, to_js_value
from .loop import worker_loop
from .protocol import MESSAGES, check_payload
from .script import current_request

__all__ = ["HANDLERS", "Graph", "Session", "dispatch", "express", "handle", "handler",
           "run_source"]

Handler = Callable[[dict[str, Any], "Session"], Awaitable[Any]]
HANDLERS: dict[str, Handler] = {}


def handler(kind: str) -> Callable[[Handler], Handler]:
    """Register the async ``(payload, session) -> result`` function for `kind` (a kind of the
    protocol table)."""
    if kind not in MESSAGES:
        raise ValueError(f"handler: {kind!r} is not a message kind of the protocol table")

    def register(fn: Handler) -> Handler:
        HANDLERS[kind] = fn
        return fn

    return register


@dataclass
class Graph:
    """A compiled graph held by the worker: a training or an attached forward handle."""

    obj: Training | Forward
    parent: int | None = None
    destroyed: bool = False


class Session:
    """What the worker keeps between messages: the exec namespace and the compiled graphs."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.graphs: dict[int, Graph] = {}
        self.express_steps = 0  # steps taken by express()
        self.unstarted = 0  # messages handed to handle() whose coroutine has not started
        self._ids = itertools.count(1)

    def add_graph(self, graph: Graph) -> int:
        graph_id = next(self._ids)
        self.graphs[graph_id] = graph
        return graph_id

    def graph(self, graph_id: int) -> Graph:
        """The live graph `graph_id` (an id the protocol checked), else
        :class:`~tensorgrad.errors.AbortError`."""
        graph = self.graphs.get(graph_id)
        if graph is None or graph.destroyed:
            raise AbortError(f"graph {graph_id} does not exist (destroyed?)")
        return graph

    def evaluate(self, source: Any) -> Any:
        """A Python expression string evaluated in the namespace; other values pass through."""
        return eval(source, self.namespace) if isinstance(source, str) else source

    def optimizer(self, value: Any) -> Any:
        """An optimizer from an expression or plain data ``{kind: "adam", lr: ...}``."""
        if isinstance(value, Mapping):
            return optim.from_dict(value)
        return self.evaluate(value)

    def lr(self, value: Any) -> Any:
        """A learning rate: a number, a schedule as plain data, or an expression."""
        if isinstance(value, Mapping):
            return lr_mod.from_dict(dict(value))
        return self.evaluate(value)


SESSION = Session()


# -- the loop ---------------------------------------------------------------------------------
async def dispatch(message: Any, session: Session = SESSION) -> dict[str, Any]:
    """Run the handler for one message; the reply as a Python dict."""
    request_id = message.get("id") if isinstance(message, Mapping) else None
    token = current_request.set(request_id)
    try:
        if not isinstance(message, Mapping):
            raise ProtocolError(f"a message must be an object {{id, kind, payload}}, got "
                                f"{type(message).__name__}")
        kind, payload = message.get("kind"), message.get("payload")
        check_payload(kind, payload)
        fields = {k: v for k, v in (payload or {}).items() if v is not None}
        result = await HANDLERS[cast(str, kind)](fields, session)  # (checked just above)
        return {"id": request_id, "ok": True, "result": result}
    except (Exception, SystemExit) as exc:  # noqa: BLE001 (every failure goes to the page)
        return {"id": request_id, "ok": False, "error": error_info(exc)}
    finally:
        current_request.reset(token)


def _unreadable(message: Any, exc: Exception) -> Any:
    """The reply to a JS message Python cannot convert (a value Pyodide has no conversion
    for, such as a Float16Array): a ProtocolError naming the kind and why."""
    request_id = kind = None
    try:
        request_id, kind = from_js(message.id), from_js(message.kind)
    except Exception:  # noqa: BLE001, S110 (not even an object: no id, no kind)
        pass
    error = ProtocolError(f"{kind}: the worker cannot read this message's payload ({exc}); "
                          "send plain data and typed arrays (Float32Array, Int32Array, ...)")
    return to_js_value({"id": request_id, "ok": False, "error": error_info(error)})


def handle(message: Any) -> Coroutine[Any, Any, Any]:
    """The worker's entry point: a JS message in, (a coroutine of) its JS reply out (dicts in
    and out in CPython). Until that coroutine starts, the message counts as not started
    (:attr:`Session.unstarted`): :func:`express` takes no step before it."""
    SESSION.unstarted += 1
    return _handle(message)


async def _handle(message: Any) -> Any:
    SESSION.unstarted -= 1  # (its handler makes its graph call before its first await)
    try:
        message = from_js(message)  # typed arrays become memoryviews (one copy)
    except Exception as exc:  # noqa: BLE001 (a value Pyodide cannot convert)
        return _unreadable(message, exc)
    reply = await dispatch(message)
    return _js_reply(reply) if in_pyodide() else reply


def _js_reply(reply: dict[str, Any]) -> Any:
    """A reply as the JS object posted to the page; one the page cannot receive becomes
    that error's reply."""
    try:
        return to_js_value(reply)
    except Exception as exc:  # noqa: BLE001 (a result the page cannot receive)
        return to_js_value({"id": reply["id"], "ok": False, "error": error_info(exc)})


def express(message: Any) -> bool:
    """A "step" message's fast path (``web/worker.mjs`` offers it each one before
    :func:`handle`): when every message before it has started (its call, if any, has its
    place in its graph's queue) and its training can submit the step without waiting
    (nothing of it queued or running, room in its flight), the step is submitted now and
    its reply posted once its result is in, with no task or future on the way in the common
    case: True. False, with nothing done, for any other message (:func:`handle` answers it).
    The reply is the one :func:`handle` gives, bit for bit; a device's ``submits_now =
    False`` turns it off."""
    loop = worker_loop()
    if loop is None or not _all_started():
        return False
    try:
        msg = from_js(message)
        if not isinstance(msg, Mapping) or msg.get("kind") != "step":
            return False
        payload: Any = msg.get("payload")
        check_payload("step", payload)
        graph = SESSION.graphs.get(payload["graphId"])
        if graph is None or graph.destroyed or not isinstance(graph.obj, Training):
            return False
        reply = functools.partial(_post_step_result, msg.get("id"))
        taken = graph.obj._step_now(payload["inputs"], reply, loop, _all_started)
    except Exception:  # noqa: BLE001 - handle() answers it
        return False
    SESSION.express_steps += taken
    return taken


def _all_started() -> bool:
    """Whether every message handed to :func:`handle` has started its handler."""
    return not SESSION.unstarted


def _post_step_result(request_id: Any, result: Result) -> None:
    """Post an express step's reply, as :func:`dispatch` and :func:`handle` make it."""
    import js

    # (the Result itself: to_js_value makes its result_message, inside _js_reply's guard)
    js.tensorgradPost(_js_reply({"id": request_id, "ok": True, "result": result}))


# -- running Python source --------------------------------------------------------------------
_sources = itertools.count(1)


async def run_source(source: str, namespace: dict[str, Any], filename: str | None = None) -> Any:
    """Execute `source` in `namespace` (top-level ``await`` allowed); the value of its last
    line when that is an expression, else None. Tracebacks show the source's lines."""
    if not isinstance(source, str):
        raise ProtocolError(f"source must be a string, got {type(source).__name__}")
    filename = filename or f"<exec-{next(_sources)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    body = compile(tree, filename, "exec", flags=flags)
    result = eval(body, namespace)
    if body.co_flags & inspect.CO_COROUTINE:
        await result
    if last is None:
        return None
    expr = compile(ast.Expression(cast(ast.Expr, last).value), filename, "eval", flags=flags)
    value = eval(expr, namespace)
    if expr.co_flags & inspect.CO_COROUTINE:
        value = await value
    return value


async def _fetch_text(url: str) -> str:
    if in_pyodide():
        from pyodide.http import pyfetch

        response = await pyfetch(url)
        if not response.ok:
            raise OSError(f"GET {url}: HTTP {response.status}")
        return await response.string()
    import urllib.request

    def get() -> str:
        with urllib.request.urlopen(url) as response:
            return response.read().decode()

    return await asyncio.to_thread(get)


@handler("ping")
async def _ping(payload: dict[str, Any], session: Session) -> dict[str, Any]:
    return {"pong": payload.get("value"), "python": sys.version.split()[0],
            "platform": sys.platform, "kinds": sorted(HANDLERS)}


@handler("exec")
async def _exec(payload: dict[str, Any], session: Session) -> str | None:
    value = await run_source(payload["source"], session.namespace, payload.get("filename"))
    return None if value is None else repr(value)


@handler("load")
async def _load(payload: dict[str, Any], session: Session) -> str | None:
    url = payload["url"]
    value = await run_source(await _fetch_text(url), session.namespace, url)
    return None if value is None else repr(value)


@handler("runScript")
async def _run_script(payload: dict[str, Any], session: Session) -> Any:
    """``tensorgrad.web.post(obj)`` inside main() streams ``{kind: "post", id, data}``.

    The source must define `main` itself: the namespace is shared (a demo's state outlives
    its runs), and a `main` left there by an earlier script or exec is never run instead."""
    earlier = session.namespace.get("main")
    await run_source(payload["source"], session.namespace, payload.get("filename"))
    main = session.namespace.get("main")
    if not callable(main) or main is earlier:
        raise TypeError("runScript: the source must define `async def main()`")
    value = main()
    if inspect.isawaitable(value):
        value = await value
    try:
        return plain(value)
    except TypeError:
        return repr(value)


# -- compiled graphs (the async Python API: train = await tg.compile(...)) ------------------
def _graph_info(obj: Training | Forward) -> dict[str, Any]:
    info: dict[str, Any] = {"paramNames": obj.param_names,
                            "paramShapes": {k: list(v) for k, v in obj.param_shapes.items()},
                            "paramCount": obj.param_count}
    if isinstance(obj, Training):
        info["kernelCount"] = obj.kernel_count
    return info


@handler("compile")
async def _compile(payload: dict[str, Any], session: Session) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if "seed" in payload:
        kwargs["seed"] = payload["seed"]
    train = await api.compile(
        model=session.evaluate(payload["model"]), loss=session.evaluate(payload["loss"]),
        inputs=payload["inputs"], optimizer=session.optimizer(payload.get("optimizer")),
        **kwargs)
    return {"graphId": session.add_graph(Graph(train)), **_graph_info(train)}


async def _step_or_run(payload: dict[str, Any], session: Session, method: str
                       ) -> dict[str, Any]:
    """The graph's step or run, queued at once behind the graph's earlier calls; the result
    as the page sees it (:func:`result_message`)."""
    try:
        graph = session.graph(payload["graphId"])
        res = await getattr(graph.obj, method)(**dict(payload["inputs"]))
    except AbortError:
        return {"kind": "aborted"}
    return result_message(res)


@handler("step")
async def _step(payload: dict[str, Any], session: Session) -> dict[str, Any]:
    return await _step_or_run(payload, session, "step")


@handler("run")
async def _run(payload: dict[str, Any], session: Session) -> dict[str, Any]:
    return await _step_or_run(payload, session, "run")


@handler("attach")
async def _attach(payload: dict[str, Any], session: Session) -> dict[str, Any]:
    parent_id = payload["graphId"]
    parent = session.graph(parent_id)
    if not isinstance(parent.obj, Training):
        raise TypeError(f"attach: graph {parent_id} is a forward graph; attach to a training "
                        "graph")
    kwargs = {"output": payload["output"]} if "output" in payload else {}
    forward = await parent.obj.attach(forward=session.evaluate(payload["forward"]),
                                      inputs=payload["inputs"], **kwargs)
    return {"graphId": session.add_graph(Graph(forward, parent=parent_id)),
            **_graph_info(forward)}


@handler("uploadParams")
async def _upload_params(payload: dict[str, Any], session: Session) -> None:
    graph = session.graph(payload["graphId"])
    params = dict(payload["params"])  # checked by upload_params (shapes too), not flattened
    await graph.obj.upload_params(params, partial=payload.get("partial", False))


@handler("downloadParams")
async def _download_params(payload: dict[str, Any], session: Session) -> dict[str, memoryview]:
    graph = session.graph(payload["graphId"])
    params = await graph.obj.download_params()
    return {name: flat_buffer(value) for name, value in params.items()}


def _training(graph: Graph, kind: str, graph_id: Any) -> Training:
    if not isinstance(graph.obj, Training):
        raise TypeError(f"{kind}: graph {graph_id} is a forward graph, not a training graph")
    return graph.obj


@handler("reset")
async def _reset(payload: dict[str, Any], session: Session) -> None:
    graph = session.graph(payload["graphId"])
    train = _training(graph, "reset", payload["graphId"])
    await train.reset(params=payload.get("params", True), optimizer=payload.get("optimizer", True))


@handler("setLR")
async def _set_lr(payload: dict[str, Any], session: Session) -> None:
    graph = session.graph(payload["graphId"])
    train = _training(graph, "setLR", payload["graphId"])
    await train.set_lr(session.lr(payload["lr"]))


@handler("replaceModel")
async def _replace_model(payload: dict[str, Any], session: Session) -> dict[str, Any]:
    graph = session.graph(payload["graphId"])
    train = _training(graph, "replaceModel", payload["graphId"])
    kwargs: dict[str, Any] = {}
    if "seed" in payload:
        kwargs["seed"] = payload["seed"]
    if "optimizer" in payload:
        kwargs["optimizer"] = session.optimizer(payload["optimizer"])
    rebuilt = train.replace_model(session.evaluate(payload["model"]), **kwargs)

    async def describe() -> dict[str, Any]:
        return _graph_info(train)

    # Read in the handle's turn right after the rebuild: a later call may already be queued
    # behind it (another replaceModel), and it would run before this handler resumes.
    info = train._queue.submit(describe)
    try:
        await rebuilt
    finally:
        described = await info
    return described


@handler("destroy")
async def _destroy(payload: dict[str, Any], session: Session) -> None:
    graph_id = payload["graphId"]
    doomed = [graph_id] + [i for i, g in session.graphs.items() if g.parent == graph_id]
    for i in reversed(doomed):
        graph = session.graphs.pop(i, None)
        if graph is not None:
            graph.destroyed = True
            graph.obj.destroy()


_unhandled = sorted(set(MESSAGES) - set(HANDLERS))
if _unhandled:  # a programming error, caught at import
    raise RuntimeError(f"the worker has no handler for the protocol's kinds {_unhandled}")
