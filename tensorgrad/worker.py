"""The Python message loop of tensorgrad's Web Worker (``web/worker.mjs`` calls :func:`handle`).

A message ``{id, kind, payload}`` goes to the handler registered for ``kind``. What the handler
returns becomes ``{id, ok: true, result}``; what it raises becomes ``{id, ok: false, error:
{name, message, traceback}}``. Handlers run concurrently (each message is its own coroutine);
work on one graph is serialised by that graph's lock. Add a kind with::

    @handler("myKind")
    async def my_kind(payload: dict, session: Session) -> Any:
        return {...}   # JSON-like values; buffers become typed arrays, transferred

Typed arrays in a payload arrive as memoryviews ('f' for Float32Array, 'i' for Int32Array).
The same loop runs in CPython with plain dicts (``await handle({...})``), for tests.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import itertools
import linecache
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import AbortError
from .web import current_request, flat_buffer, from_js, in_pyodide, plain, to_js_value

__all__ = ["HANDLERS", "Graph", "Session", "handle", "handler", "run_source"]

Handler = Callable[[Any, "Session"], Awaitable[Any]]
HANDLERS: dict[str, Handler] = {}


def handler(kind: str) -> Callable[[Handler], Handler]:
    """Register an async ``(payload, session) -> result`` function for messages of `kind`."""

    def register(fn: Handler) -> Handler:
        HANDLERS[kind] = fn
        return fn

    return register


@dataclass
class Graph:
    """A compiled graph held by the worker: a training or an attached forward object."""

    obj: Any
    parent: int | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    destroyed: bool = False


class Session:
    """What the worker keeps between messages: the exec namespace and the compiled graphs."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.graphs: dict[int, Graph] = {}
        self._ids = itertools.count(1)

    def add_graph(self, graph: Graph) -> int:
        graph_id = next(self._ids)
        self.graphs[graph_id] = graph
        return graph_id

    def graph(self, graph_id: Any) -> Graph:
        """The live graph `graph_id`, else :class:`~tensorgrad.errors.AbortError`."""
        graph = self.graphs.get(int(graph_id))
        if graph is None or graph.destroyed:
            raise AbortError(f"graph {graph_id} does not exist (destroyed?)")
        return graph

    def evaluate(self, source: Any) -> Any:
        """A Python expression string evaluated in the namespace; other values pass through."""
        return eval(source, self.namespace) if isinstance(source, str) else source


SESSION = Session()


# -- the loop ---------------------------------------------------------------------------------
def error_info(exc: BaseException) -> dict[str, str]:
    """``{name, message, traceback}`` of an exception, the full formatted traceback included."""
    name = type(exc).__name__
    return {"name": name, "message": str(exc),
            "traceback": "".join(traceback.format_exception(exc))}


async def dispatch(message: Mapping[str, Any], session: Session = SESSION) -> dict[str, Any]:
    """Run the handler for one message; the reply as a Python dict."""
    request_id = message.get("id")
    kind = message.get("kind")
    token = current_request.set(request_id)
    try:
        fn = HANDLERS.get(kind)
        if fn is None:
            raise ValueError(f"unknown message kind {kind!r} "
                             f"(known: {', '.join(sorted(HANDLERS))})")
        return {"id": request_id, "ok": True, "result": await fn(message.get("payload"), session)}
    except (Exception, SystemExit) as exc:  # noqa: BLE001 (every failure goes to the page)
        return {"id": request_id, "ok": False, "error": error_info(exc)}
    finally:
        current_request.reset(token)


async def handle(message: Any) -> Any:
    """The worker's entry point: a JS message in, a JS reply out (dicts in and out in CPython)."""
    message = from_js(message)  # typed arrays become memoryviews (one copy)
    reply = await dispatch(message)
    if not in_pyodide():
        return reply
    try:
        return to_js_value(reply)
    except Exception as exc:  # noqa: BLE001 (a result the page cannot receive)
        return to_js_value({"id": reply["id"], "ok": False, "error": error_info(exc)})


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# -- running Python source --------------------------------------------------------------------
_sources = itertools.count(1)


async def run_source(source: str, namespace: dict[str, Any], filename: str | None = None) -> Any:
    """Execute `source` in `namespace` (top-level ``await`` allowed); the value of its last
    line when that is an expression, else None. Tracebacks show the source's lines."""
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
    expr = compile(ast.Expression(last.value), filename, "eval", flags=flags)
    value = eval(expr, namespace)
    if expr.co_flags & inspect.CO_COROUTINE:
        value = await value
    return value


def _source(payload: Any) -> tuple[str, str | None]:
    if isinstance(payload, str):
        return payload, None
    return payload["source"], payload.get("filename")


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
async def _ping(payload: Any, session: Session) -> dict[str, Any]:
    return {"pong": payload, "python": sys.version.split()[0], "platform": sys.platform,
            "kinds": sorted(HANDLERS)}


@handler("exec")
async def _exec(payload: Any, session: Session) -> str | None:
    """Run Python source in the session namespace; the repr of its last expression (or None)."""
    source, filename = _source(payload)
    value = await run_source(source, session.namespace, filename)
    return None if value is None else repr(value)


@handler("load")
async def _load(payload: Any, session: Session) -> str | None:
    """Fetch a URL of Python source and run it like ``exec``."""
    url = payload if isinstance(payload, str) else payload["url"]
    value = await run_source(await _fetch_text(url), session.namespace, url)
    return None if value is None else repr(value)


@handler("runScript")
async def _run_script(payload: Any, session: Session) -> Any:
    """Run source that defines ``async def main()`` and await it; ``tensorgrad.web.post(obj)``
    inside it streams ``{kind: "post", id, data}`` to the page. Returns main's value when it
    can be sent as is (JSON-like, buffers), else its repr."""
    source, filename = _source(payload)
    await run_source(source, session.namespace, filename)
    main = session.namespace.get("main")
    if not callable(main):
        raise TypeError("runScript: the source must define `async def main()`")
    value = await _maybe_await(main())
    try:
        return plain(value)
    except TypeError:
        return repr(value)


# -- compiled graphs (the async Python API: train = await tg.compile(...)) ------------------
def _tensorgrad() -> Any:
    import tensorgrad

    return tensorgrad


def _param_names(obj: Any) -> list[str]:
    return list(getattr(obj, "param_names", None) or getattr(obj, "paramNames", None) or [])


def _kernel_count(obj: Any) -> int:
    count = getattr(obj, "kernel_count", None)
    if count is None:
        count = len(getattr(obj, "kernels", None) or ())
    return int(count)


def _captures(captures: Any) -> tuple[dict[str, memoryview], dict[str, list[int]]]:
    """Captured tensors as flat buffers (sent as typed arrays) and their shapes."""
    if captures is None:
        return {}, {}
    if hasattr(captures, "items"):
        items = list(captures.items())
    else:
        items = [(name, captures.get(name)) for name in captures.names()]
    data, shapes = {}, {}
    for name, value in items:
        mv = memoryview(value)
        data[name], shapes[name] = flat_buffer(mv), list(mv.shape)
    return data, shapes


def _result(res: Any, output: str) -> dict[str, Any]:
    """A step/run result object (``.kind``, ``.loss`` / ``.output``, ``.captures``,
    ``.error``) as the page receives it."""
    kind = getattr(res, "kind", "completed")
    if kind == "aborted":
        return {"kind": "aborted"}
    if kind == "failed":
        error = getattr(res, "error", None)
        info = error_info(error) if isinstance(error, BaseException) else {
            "name": "Error", "message": str(error), "traceback": ""}
        return {"kind": "failed", "error": info}
    captures, shapes = _captures(getattr(res, "captures", None))
    reply: dict[str, Any] = {"kind": "completed", "captures": captures, "captureShapes": shapes}
    if output == "loss":
        reply["loss"] = float(res.loss)
    else:
        mv = memoryview(res.output)
        reply["output"], reply["outputShape"] = flat_buffer(mv), list(mv.shape)
    return reply


@handler("compile")
async def _compile(payload: Any, session: Session) -> dict[str, Any]:
    """``{model: expr, loss: name, inputs: {name: shape | [shape, "i32"]}, optimizer: expr |
    dict, seed?}`` → ``{graphId, paramNames, kernelCount}``."""
    tg = _tensorgrad()
    kwargs: dict[str, Any] = {}
    if payload.get("seed") is not None:
        kwargs["seed"] = int(payload["seed"])
    train = await tg.compile(
        model=session.evaluate(payload["model"]), loss=session.evaluate(payload["loss"]),
        inputs=payload["inputs"], optimizer=session.evaluate(payload.get("optimizer")), **kwargs)
    graph_id = session.add_graph(Graph(train))
    return {"graphId": graph_id, "paramNames": _param_names(train),
            "kernelCount": _kernel_count(train)}


async def _step_or_run(payload: Any, session: Session, method: str, output: str
                       ) -> dict[str, Any]:
    try:
        graph = session.graph(payload["graphId"])
        async with graph.lock:
            if graph.destroyed:
                raise AbortError(f"graph {payload['graphId']} was destroyed")
            res = await getattr(graph.obj, method)(**(payload.get("inputs") or {}))
    except AbortError:
        return {"kind": "aborted"}
    return _result(res, output)


@handler("step")
async def _step(payload: Any, session: Session) -> dict[str, Any]:
    """``{graphId, inputs: {name: TypedArray}}`` → ``{kind, loss, captures, captureShapes}``."""
    return await _step_or_run(payload, session, "step", "loss")


@handler("run")
async def _run(payload: Any, session: Session) -> dict[str, Any]:
    """``{graphId, inputs}`` → ``{kind, output, outputShape, captures, captureShapes}``."""
    return await _step_or_run(payload, session, "run", "output")


@handler("attach")
async def _attach(payload: Any, session: Session) -> dict[str, Any]:
    """``{graphId, forward: expr, inputs, output?}``: a forward graph sharing the parent's
    parameters → ``{graphId, paramNames}``."""
    parent_id = int(payload["graphId"])
    parent = session.graph(parent_id)
    kwargs = {"output": payload["output"]} if payload.get("output") else {}
    forward = await parent.obj.attach(forward=session.evaluate(payload["forward"]),
                                      inputs=payload["inputs"], **kwargs)
    graph_id = session.add_graph(Graph(forward, parent=parent_id))
    return {"graphId": graph_id, "paramNames": _param_names(forward)}


@handler("uploadParams")
async def _upload_params(payload: Any, session: Session) -> None:
    """``{graphId, params: {name: Float32Array}, partial?: bool}``."""
    graph = session.graph(payload["graphId"])
    params = {name: flat_buffer(data) for name, data in payload["params"].items()}
    partial = bool(payload.get("partial", False))
    async with graph.lock:
        await _maybe_await(graph.obj.upload_params(params, partial=partial))


@handler("downloadParams")
async def _download_params(payload: Any, session: Session) -> dict[str, memoryview]:
    """``{graphId}`` → ``{name: Float32Array}`` (transferred)."""
    graph = session.graph(payload["graphId"])
    async with graph.lock:
        params = await _maybe_await(graph.obj.download_params())
    return {name: flat_buffer(value) for name, value in params.items()}


@handler("setLR")
async def _set_lr(payload: Any, session: Session) -> None:
    """``{graphId, lr: number | expr}`` (an expression can build a schedule)."""
    graph = session.graph(payload["graphId"])
    async with graph.lock:
        await _maybe_await(graph.obj.set_lr(session.evaluate(payload["lr"])))


@handler("replaceModel")
async def _replace_model(payload: Any, session: Session) -> dict[str, Any]:
    """``{graphId, model: expr, seed?, optimizer?}`` → ``{paramNames, kernelCount}``."""
    graph = session.graph(payload["graphId"])
    kwargs: dict[str, Any] = {}
    if payload.get("seed") is not None:
        kwargs["seed"] = int(payload["seed"])
    if payload.get("optimizer") is not None:
        kwargs["optimizer"] = session.evaluate(payload["optimizer"])
    async with graph.lock:
        await _maybe_await(graph.obj.replace_model(session.evaluate(payload["model"]), **kwargs))
    return {"paramNames": _param_names(graph.obj), "kernelCount": _kernel_count(graph.obj)}


@handler("destroy")
async def _destroy(payload: Any, session: Session) -> None:
    """``{graphId}``: destroy a graph and the forward graphs attached to it."""
    graph_id = int(payload["graphId"])
    doomed = [graph_id] + [i for i, g in session.graphs.items() if g.parent == graph_id]
    for i in reversed(doomed):
        graph = session.graphs.pop(i, None)
        if graph is None:
            continue
        graph.destroyed = True
        destroy = getattr(graph.obj, "destroy", None)
        if destroy is not None:
            await _maybe_await(destroy())
