"""tensorgrad's page client for Python on the page (PyScript, or Pyodide loaded by the page).

The same client as ``web/tensorgrad.js``, from Python running in a page-side Pyodide: it loads
``tensorgrad.js`` (a dynamic ``import()``), which starts tensorgrad's worker (its own Pyodide
with the compiler and the GPU), and sends protocol messages (:mod:`tensorgrad.web.protocol`)
through that JS session::

    import array
    import tensorgrad as tg
    import tensorgrad.web

    session = await tensorgrad.web.start(on_progress=lambda p: print(p["stage"], p["ms"]))
    await session.exec("import tensorgrad as tg\\nfrom model import MLP, loss_fn")
    train = await session.compile(model="MLP()", loss="loss_fn",
                                  inputs={"x": [32, 784], "y": [[32], "i32"]},
                                  optimizer="tg.optim.Adam(lr=1e-3)", seed=1)
    match await train.step(x=array.array("f", xs), y=array.array("i", ys)):
        case tg.Completed(loss=loss): print(loss)
        case tg.Aborted(): ...
        case tg.Failed(error=err): print(err.name, err, err.remote_traceback)

Model, loss and optimizer are Python *expressions* evaluated in the worker's namespace (define
them there with :meth:`Session.exec`, :meth:`Session.load` or :meth:`Session.run_script`); an
optimizer may also be plain data (``{"kind": "adam", "lr": 1e-3}``). Step and run inputs are
Python buffers (``array.array``, ``memoryview``, ``bytes``, NumPy arrays), lists of
numbers, or JS typed arrays (data carrying 2 or more dims must have the declared shape, as
natively); each is copied into a fresh typed array that is transferred to the
worker (a JS typed array passed as is is transferred itself, so it is detached afterwards).
``step`` and ``run`` return the native API's result objects and never raise; the other calls
raise :class:`~tensorgrad.errors.RemoteError` (mixed with the worker's exception class of that
name where tensorgrad knows it, e.g. ``ValueError`` or ``tensorgrad.ShapeError``).
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable, Coroutine, Mapping
from math import prod
from typing import TYPE_CHECKING, Any, Self

from ..errors import RemoteError, remote_error
from ..gpu import WebGPUSupport, in_pyodide
from ..hostdata import (
    check_host_shape,
    flat_list,
    from_bytes,
    is_numpy,
    list_array,
    numpy_as,
    numpy_or_none,
)
from ..results import Aborted, Captures, Completed, Failed, Result
from .convert import flat_buffer, from_js, plain, to_js_value
from .protocol import check_payload

if TYPE_CHECKING:
    from ..ir import DType

__all__ = ["RemoteForward", "RemoteTraining", "Session", "check_webgpu", "start"]

ProgressCallback = Callable[[dict[str, Any]], Any]
PostCallback = Callable[[Any], Any]

# JS typed-array element formats → tensorgrad dtypes (what the worker's buffers hold).
_DTYPE_OF_FORMAT: dict[str, DType] = {"f": "f32", "i": "i32", "l": "i32", "I": "bool",
                                      "L": "bool"}
_FORMAT_OF_DTYPE = {"f32": "f", "i32": "i", "bool": "I"}


# -- JS calls ---------------------------------------------------------------------------------
def _error_from_js(err: Any) -> RemoteError:
    """A RemoteError from a JS Error (or a protocol error object) carrying ``name``,
    ``message`` and ``traceback``."""
    if isinstance(err, RemoteError):
        return err
    if isinstance(err, Mapping):
        return remote_error(str(err.get("name") or "Error"), str(err.get("message") or ""),
                            str(err.get("traceback") or ""))
    name = _text(getattr(err, "name", None)) or type(err).__name__
    message = _text(getattr(err, "message", None)) or str(err)
    traceback = _text(getattr(err, "traceback", None)) or _text(getattr(err, "stack", None))
    return remote_error(name, message, traceback)


def _text(value: Any) -> str:
    value = from_js(value)
    return "" if value is None else str(value)


async def _call(promise: Any) -> Any:
    """Await a JS promise; a rejection becomes :class:`RemoteError`."""
    from pyodide.ffi import JsException

    try:
        return await promise
    except JsException as exc:
        raise _error_from_js(exc) from None


def _callback_proxy(fn: Callable[[Any], Any] | None) -> Any:
    """A JS-callable proxy passing each argument to `fn` as Python data (a coroutine it
    returns is scheduled); a no-op without `fn`. The caller destroys the proxy."""
    from pyodide.ffi import create_proxy

    def call(data: Any) -> None:
        if fn is None:
            return
        value = fn(from_js(data))
        if inspect.isawaitable(value):
            asyncio.ensure_future(value)

    return create_proxy(call)


# -- host data --------------------------------------------------------------------------------
def _decls(inputs: Mapping[str, Any] | None) -> dict[str, tuple[Any, str]]:
    """``{name: (shape, dtype)}`` from an inputs spec ``{name: shape | [shape, dtype]}`` (the
    shape as declared, None dims included; None when it is not a sequence of dims)."""
    out = {}
    for name, spec in (inputs or {}).items():
        dtype, shape = "f32", spec
        if isinstance(spec, (list, tuple)) and len(spec) == 2 and isinstance(spec[1], str):
            shape, dtype = spec
        elif isinstance(spec, Mapping):
            shape, dtype = spec.get("shape"), str(spec.get("dtype", "f32"))
        if isinstance(shape, int):
            shape = (shape,)
        ok = isinstance(shape, (list, tuple)) and all(
            d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in shape)
        out[str(name)] = (tuple(shape) if ok else None, dtype)
    return out


def _typed_array(what: str, value: Any, dtype: str, shape: Any = None,
                 param: bool = False) -> Any:
    """`value` as a fresh JS typed array (a JsProxy typed array passes through). Data that
    carries a shape is checked against the declared `shape` first (the shape rule of
    :func:`tensorgrad.hostdata.check_layout`): it travels flat."""
    from pyodide.ffi import JsProxy

    if isinstance(value, JsProxy):
        return value
    if shape is not None:
        check_host_shape(what, value, shape, param)
    fmt = _FORMAT_OF_DTYPE.get(dtype, "f")
    if is_numpy(value):  # converted (and range-checked) as the native API does
        host: DType = "i32" if dtype == "i32" else "bool" if dtype == "bool" else "f32"
        value = numpy_or_none().ascontiguousarray(numpy_as(what, value, host))
    elif isinstance(value, (list, tuple)):
        items = flat_list(what, value, (None,) if shape is None else shape, param)
        value = list_array(what, items, fmt, dtype, len(items))
    try:
        mv = plain(flat_buffer(value))  # a flat memoryview with a typed-array format
    except TypeError as exc:
        raise TypeError(f"{what}: expected a buffer of {dtype} data (array.array, memoryview, "
                        f"bytes, a NumPy array), a list or a JS typed array; got "
                        f"{type(value).__name__} ({exc})") from None
    return to_js_value(mv)  # Pyodide copies the bytes into a new ArrayBuffer (never the heap)


def _typed_arrays(inputs: Mapping[str, Any], decls: Mapping[str, tuple[Any, str]], what: str,
                  param: bool = False) -> dict[str, Any]:
    out = {}
    for name, value in inputs.items():
        shape, dtype = decls.get(name, (None, "f32"))
        out[name] = _typed_array(f"{what} '{name}'", value, dtype, shape, param)
    return out


def _host_array(data: Any, shape: list[int] | None) -> Any:
    """A typed array from the worker as the native API returns it: a NumPy array when NumPy
    imports, else a memoryview cast to `shape` (flat when the shape is unknown)."""
    mv = data if isinstance(data, memoryview) else memoryview(from_js(data))
    dtype = _DTYPE_OF_FORMAT.get(mv.format)
    if shape is None or dtype is None:
        return mv
    count = prod(int(n) for n in shape)
    if mv.nbytes != mv.itemsize * count:
        return mv
    if numpy_or_none() is None and count == 0:
        return mv  # memoryview.cast refuses zero-size shapes
    return from_bytes(mv.cast("B"), [int(n) for n in shape], dtype)


def _result(reply: Mapping[str, Any], output: bool) -> Result:
    """A step/run reply ``{kind, loss | output, captures, error}`` as a native result."""
    kind = reply.get("kind")
    if kind == "aborted":
        return Aborted()
    if kind == "failed":
        return Failed(_error_from_js(reply.get("error") or {}))
    shapes = reply.get("captureShapes") or {}
    captures = Captures({name: _host_array(data, shapes.get(name))
                         for name, data in (reply.get("captures") or {}).items()})
    if output:
        return Completed(output=_host_array(reply["output"], reply.get("outputShape")),
                         captures=captures)
    return Completed(loss=float(reply["loss"]), captures=captures)


def _local_failure(exc: BaseException) -> Failed:
    return Failed(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))


async def _value(result: Result) -> Result:
    return result


async def _settled(sent: Any, output: bool) -> Result:
    """The result of a step/run message already sent (`sent`: the JS promise of its reply)."""
    try:
        return _result(from_js(await _call(sent)), output=output)
    except Exception as exc:  # noqa: BLE001 (step/run report failures, never raise)
        return _local_failure(exc)


# -- graphs -----------------------------------------------------------------------------------
class RemoteForward:
    """A forward graph held by the worker (from :meth:`RemoteTraining.attach`), sharing its
    training graph's parameters. The remote twin of :class:`tensorgrad.Forward`."""

    def __init__(self, session: Session, info: Mapping[str, Any],
                 inputs: Mapping[str, Any] | None) -> None:
        self.session = session
        self.graph_id = int(info["graphId"])
        self.input_decls = _decls(inputs)
        self.input_dtypes = {name: dtype for name, (_, dtype) in self.input_decls.items()}
        self._update(info)

    def _update(self, info: Mapping[str, Any]) -> None:
        self.param_names: list[str] = list(info.get("paramNames") or [])
        self.param_shapes: dict[str, tuple[int, ...]] = {
            k: tuple(v) for k, v in (info.get("paramShapes") or {}).items()}
        self.param_count: int = int(info.get("paramCount") or 0)

    async def _request(self, kind: str, **payload: Any) -> Any:
        return await self.session.request(kind, {"graphId": self.graph_id, **payload})

    def _graph_call(self, kind: str, inputs: Mapping[str, Any], output: bool
                    ) -> Coroutine[Any, Any, Result]:
        """Convert `inputs` and send the message now (so calls reach the worker in call order
        however they are awaited); a coroutine of the result."""
        try:
            typed = _typed_arrays(inputs, self.input_decls, f"{kind} input")
            sent = self.session._post(kind, {"graphId": self.graph_id, "inputs": typed},
                                      transfer=[t.buffer for t in typed.values()])
        except Exception as exc:  # noqa: BLE001 (step/run report failures, never raise)
            return _value(_local_failure(exc))
        return _settled(sent, output)

    def run(self, **inputs: Any) -> Coroutine[Any, Any, Result]:
        """Run the forward (await it): ``Completed(output=..., captures=...)``, ``Aborted()``
        or ``Failed(error)``; never raises. The output is shaped like the native one (a NumPy
        array when NumPy imports, else a memoryview cast to the output's shape). Sent when
        called, like :meth:`RemoteTraining.step`."""
        return self._graph_call("run", inputs, output=True)

    async def upload_params(self, params: Mapping[str, Any], partial: bool = False) -> None:
        """Replace parameters: ``{name: buffer | list | typed array}`` of f32 values; every
        param unless `partial`."""
        typed = _typed_arrays(params, {n: (s, "f32") for n, s in self.param_shapes.items()},
                              "upload_params", param=True)
        await self.session.request("uploadParams", {"graphId": self.graph_id, "params": typed,
                                                    "partial": partial},
                                   transfer=[t.buffer for t in typed.values()])

    async def download_params(self) -> dict[str, Any]:
        """The parameters ``{name: array}``, shaped like the native API's (copies)."""
        params = await self._request("downloadParams") or {}
        return {name: _host_array(value, list(self.param_shapes.get(name, ())) or None)
                for name, value in params.items()}

    async def destroy(self) -> None:
        """Free the graph in the worker (and, for a training graph, its attached forwards);
        pending and later calls return ``Aborted()``."""
        await self._request("destroy")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} graph {self.graph_id}: {', '.join(self.param_names)}>"


class RemoteTraining(RemoteForward):
    """A compiled training step held by the worker. The remote twin of
    :class:`tensorgrad.Training` (``await train.step(**inputs)`` and friends)."""

    def __init__(self, session: Session, info: Mapping[str, Any], spec: Mapping[str, Any]
                 ) -> None:
        super().__init__(session, info, spec.get("inputs"))
        self.spec = dict(spec)

    def _update(self, info: Mapping[str, Any]) -> None:
        super()._update(info)
        self.kernel_count: int = int(info.get("kernelCount") or 0)

    def step(self, **inputs: Any) -> Coroutine[Any, Any, Result]:
        """One training step (await it): ``Completed(loss=..., captures=...)``, ``Aborted()``
        or ``Failed(error)``; never raises. Inputs are buffers, lists or typed arrays.

        The step is sent to the worker when called, as the native ``step`` is queued when
        called: steps (and runs) called one after another run in that order however they
        are awaited, so a page can call the next step before reading the last loss (a few in
        flight keep the worker busy), with the results of steps awaited one by one."""
        return self._graph_call("step", inputs, output=False)

    async def attach(self, forward: str, inputs: Mapping[str, Any], output: str | None = None
                     ) -> RemoteForward:
        """A forward graph sharing this graph's parameters: `forward` is an expression naming
        a ``fn(model, **inputs)`` in the worker; one input dim may be None."""
        payload: dict[str, Any] = {"forward": forward, "inputs": inputs}
        if output is not None:
            payload["output"] = output
        return RemoteForward(self.session, await self._request("attach", **payload), inputs)

    async def reset(self, params: bool = True, optimizer: bool = True) -> None:
        """Re-initialise params (same seed) and/or the optimizer state and step counter."""
        await self._request("reset", params=params, optimizer=optimizer)

    async def set_lr(self, lr: float | str | Mapping[str, Any]) -> None:
        """A new learning rate: a number, a schedule as plain data, or an expression."""
        await self._request("setLR", lr=lr)

    async def replace_model(self, model: str, seed: int | None = None,
                            optimizer: str | Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Recompile for a new model expression; this handle stays valid and pending calls
        return ``Aborted()``. Returns ``{paramNames, paramShapes, paramCount, kernelCount}``."""
        options = {k: v for k, v in (("seed", seed), ("optimizer", optimizer)) if v is not None}
        info = await self._request("replaceModel", model=model, **options) or {}
        self._update(info)
        return info


# -- the session ------------------------------------------------------------------------------
class Session:
    """One tensorgrad worker (its own Pyodide, the compiler, the GPU) and its namespace."""

    def __init__(self, js_session: Any, client: Any) -> None:
        self.js = js_session
        self.client = client  # the imported tensorgrad.js module

    async def request(self, kind: str, payload: Mapping[str, Any] | None = None, *,
                      transfer: list[Any] | None = None, on_post: PostCallback | None = None
                      ) -> Any:
        """Send one protocol message (checked against the table first); its result as Python
        data. `transfer` lists JS ArrayBuffers to move to the worker. Raises
        :class:`~tensorgrad.web.protocol.ProtocolError` for a message the table does not
        allow, :class:`RemoteError` when the worker fails it."""
        proxy = _callback_proxy(on_post) if on_post is not None else None
        try:
            reply = await _call(self._post(kind, payload, transfer=transfer, on_post=proxy))
        finally:
            if proxy is not None:
                proxy.destroy()
        return from_js(reply)

    def _post(self, kind: str, payload: Mapping[str, Any] | None, *,
              transfer: list[Any] | None = None, on_post: Any = None) -> Any:
        """Check and send one message now; the JS promise of its reply."""
        check_payload(kind, payload or {})
        options: dict[str, Any] = {"transfer": transfer or []}
        if on_post is not None:
            options["onPost"] = on_post
        return self.js.request(kind, to_js_value(payload or {}), to_js_value(options))

    @property
    def timings(self) -> dict[str, Any]:
        """The worker's start-up timings (ms): pyodideMs, wheelMs, micropipMs, importMs..."""
        return from_js(self.js.timings) or {}

    @property
    def install(self) -> dict[str, Any]:
        """How the worker started: ``{path: "unpack" | "micropip", snapshot: {used, ...},
        wheels}`` (the wheel's install path, whether the bundle's Pyodide snapshot was used)."""
        return from_js(self.js.install) or {}

    @property
    def dead(self) -> bool:
        """True once the worker is gone (terminated or crashed)."""
        return from_js(self.js.dead) is not None

    async def exec(self, source: str) -> str | None:
        """Run Python source in the worker's namespace (top-level ``await`` allowed); the repr
        of its last expression, or None. Raises :class:`RemoteError` when it raised."""
        return await self.request("exec", {"source": source})

    async def load(self, url: str) -> str | None:
        """Fetch Python source from `url` (relative to the page) and run it like exec."""
        import js

        return await self.request("load", {"url": str(js.URL.new(url, js.location.href).href)})

    async def run_script(self, source: str, on_post: PostCallback | None = None) -> Any:
        """Run source defining ``async def main()`` in the worker and await it; each
        ``tensorgrad.web.post(obj)`` there calls ``on_post(obj)`` here (a dict, typed arrays as
        memoryviews; a coroutine it returns is scheduled). Returns main's value."""
        return await self.request("runScript", {"source": source},
                                  on_post=on_post or (lambda _: None))

    async def ping(self, value: Any = None) -> dict[str, Any]:
        """``{pong, python, platform, kinds}`` from the worker."""
        return await self.request("ping", {"value": value}) or {}

    async def compile(self, *, model: str, loss: str, inputs: Mapping[str, Any],
                      optimizer: str | Mapping[str, Any] | None = None,
                      seed: int | None = None) -> RemoteTraining:
        """Compile a training step in the worker. `model`, `loss` and `optimizer` are Python
        expressions there (``"MLP()"``, ``"loss_fn"``, ``"tg.optim.Adam(lr=1e-3)"``); the
        optimizer may also be plain data; `inputs` is ``{name: shape | [shape, dtype]}``.
        Raises :class:`RemoteError` on failure."""
        spec: dict[str, Any] = {"model": model, "loss": loss, "inputs": inputs}
        if optimizer is not None:
            spec["optimizer"] = optimizer
        if seed is not None:
            spec["seed"] = seed
        return RemoteTraining(self, await self.request("compile", spec), spec)

    def terminate(self) -> None:
        """Stop the worker; pending requests fail and later ones raise."""
        self.js.terminate()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.terminate()


# -- start ------------------------------------------------------------------------------------
def _check_browser() -> Any:
    """The `js` module of a browser context that can start a Web Worker, else RuntimeError."""
    if not in_pyodide():
        raise RuntimeError(
            "tensorgrad.web.start() runs in Pyodide on a web page (PyScript, or loadPyodide on "
            f"the page), not here (sys.platform is {sys.platform!r}); natively, use "
            "`await tensorgrad.compile(...)` directly")
    import js

    if not hasattr(js, "Worker") or not hasattr(js, "location"):
        raise RuntimeError(
            "tensorgrad.web.start() needs a browser page that can start a Web Worker; this "
            "Pyodide has none (Node.js?). Inside tensorgrad's own worker, use "
            "`await tensorgrad.compile(...)` directly")
    return js


def _page_base(js: Any) -> str:
    return _text(getattr(getattr(js, "document", None), "baseURI", None)) or _text(
        js.location.href)


def _default_client_urls(js: Any) -> list[str]:
    """Where tensorgrad.js may be: beside the page (its base URL), then the folder above
    Pyodide's (the root of a served ``dist/web/``, where ``pyodide/`` lives)."""
    base = _page_base(js)
    urls = [str(js.URL.new("tensorgrad.js", base).href)]
    try:
        import pyodide_js

        index_url = _text(pyodide_js._api.config.indexURL)
        if index_url:
            urls.append(str(js.URL.new("../tensorgrad.js", js.URL.new(index_url, base)).href))
    except Exception:  # noqa: BLE001, S110 (Pyodide's internals moved: the page base only)
        pass
    return list(dict.fromkeys(urls))


_clients: dict[str | None, Any] = {}


async def _import_client(js: Any, client_url: str | None) -> Any:
    """The tensorgrad.js module (imported once per URL)."""
    if client_url in _clients:
        return _clients[client_url]
    from pyodide.code import run_js

    import_module = run_js("(url) => import(url)")
    urls = ([str(js.URL.new(client_url, _page_base(js)).href)] if client_url is not None
            else _default_client_urls(js))
    errors = []
    for url in urls:
        try:
            module = _clients[client_url] = await import_module(url)
            return module
        except Exception as exc:  # noqa: BLE001 (try the next place)
            errors.append(f"{url}: {exc}")
    raise RuntimeError("cannot import tensorgrad.js (pass client_url=...): " + "; ".join(errors))


async def start(on_progress: ProgressCallback | None = None, client_url: str | None = None, *,
                worker_url: str | None = None, wheel_url: str | None = None,
                index_url: str | None = None) -> Session:
    """Start tensorgrad's worker from Python on a page; a :class:`Session` once Pyodide and
    tensorgrad are loaded in it.

    `on_progress(p)` gets ``{stage, ms, ...}`` dicts (stage: loading-pyodide, installing,
    ready). `client_url` is tensorgrad.js (default: beside the page, else the root of the
    served ``dist/web/`` above Pyodide's folder); `worker_url`, `wheel_url` and `index_url`
    go to its ``start`` (default: ``worker.mjs`` beside tensorgrad.js, which reads
    ``manifest.json``). Raises RuntimeError outside a browser page, :class:`RemoteError` when
    the worker cannot start."""
    js = _check_browser()
    client = await _import_client(js, client_url)
    proxy = _callback_proxy(on_progress)
    options: dict[str, Any] = {"onProgress": proxy}
    for key, value in (("workerUrl", worker_url), ("wheelUrl", wheel_url),
                       ("indexURL", index_url)):
        if value is not None:
            options[key] = value
    try:
        js_session = await _call(client.start(to_js_value(options)))
    finally:
        proxy.destroy()  # start() calls onProgress only until the worker is ready
    return Session(js_session, client)


async def check_webgpu(client_url: str | None = None) -> WebGPUSupport:
    """Whether this page can run tensorgrad: tensorgrad.js's ``checkWebGPU`` (it probes the
    adapter in a throwaway worker, so the page never freezes; a success is cached)."""
    js = _check_browser()
    client = await _import_client(js, client_url)
    got = from_js(await _call(client.checkWebGPU()))
    return WebGPUSupport(bool(got.get("ok")), str(got.get("message") or ""),
                         got.get("reason"), mode="dedicated-worker")
