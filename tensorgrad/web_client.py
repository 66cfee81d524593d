"""tensorgrad's page client for Python on the page (PyScript, or Pyodide loaded by the page).

The same client as ``web/tensorgrad.js``, from Python running in a page-side Pyodide: it loads
``tensorgrad.js`` (a dynamic ``import()``), which starts tensorgrad's worker (its own Pyodide
with the compiler and the GPU), and wraps the JS session::

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
them there with :meth:`Session.exec`, :meth:`Session.load` or :meth:`Session.run_script`).
Step and run inputs are Python buffers (``array.array``, ``memoryview``, ``bytes``, NumPy
arrays), flat lists of numbers, or JS typed arrays; each is copied into a fresh typed array
that is transferred to the worker (a JS typed array passed as is is transferred itself, so it
is detached afterwards). ``step`` and ``run`` return the native API's result objects
(:class:`tensorgrad.Completed`, :class:`~tensorgrad.Aborted`, :class:`~tensorgrad.Failed`) and
never raise; the other calls raise :class:`RemoteError` (a subclass of the worker's exception
type where tensorgrad knows it, e.g. ``ValueError`` or ``tensorgrad.ShapeError``).
"""

from __future__ import annotations

import array
import asyncio
import inspect
from collections.abc import Callable, Mapping
from typing import Any, Self

from .errors import RemoteError, remote_error
from .hostdata import from_bytes, numpy_or_none
from .results import Aborted, Captures, Completed, Failed, Result
from .web import flat_buffer, from_js, in_pyodide, plain

__all__ = ["RemoteError", "RemoteForward", "RemoteTraining", "Session", "start"]

ProgressCallback = Callable[[dict[str, Any]], Any]
PostCallback = Callable[[Any], Any]

# JS typed-array element formats → tensorgrad dtypes (what the worker's buffers hold).
_DTYPE_OF_FORMAT = {"f": "f32", "i": "i32", "l": "i32", "I": "bool", "L": "bool"}
_FORMAT_OF_DTYPE = {"f32": "f", "i32": "i", "bool": "I"}


def _text(value: Any) -> str:
    value = _py(value)
    return "" if value is None else str(value)


def _error_from_js(err: Any) -> RemoteError:
    """A RemoteError from a JS Error carrying ``name``, ``message`` and ``traceback``."""
    if isinstance(err, RemoteError):
        return err
    name = _text(getattr(err, "name", None)) or type(err).__name__
    message = _text(getattr(err, "message", None)) or str(err)
    traceback = _text(getattr(err, "traceback", None)) or _text(getattr(err, "stack", None))
    return remote_error(name, message, traceback)


async def _call(promise: Any) -> Any:
    """Await a JS promise; a rejection becomes :class:`RemoteError`."""
    try:
        return await promise
    except Exception as exc:
        if _is_js_error(exc):
            raise _error_from_js(exc) from None
        raise


def _is_js_error(exc: BaseException) -> bool:
    from pyodide.ffi import JsException

    return isinstance(exc, JsException)


# -- conversions ------------------------------------------------------------------------------
def _callback_proxy(fn: Callable[[Any], Any] | None) -> Any:
    """A JS-callable proxy passing each argument to `fn` as Python data (a coroutine it
    returns is scheduled); a no-op without `fn`. The caller destroys the proxy."""
    from pyodide.ffi import create_proxy

    def call(data: Any) -> None:
        if fn is None:
            return
        value = fn(_py(data))
        if inspect.isawaitable(value):
            asyncio.ensure_future(value)

    return create_proxy(call)


def _py(value: Any) -> Any:
    """A JS value as Python (JS null and undefined → None; objects → dicts, typed arrays →
    memoryviews); Python values pass through."""
    if value is None:
        return None
    from pyodide.ffi import JsProxy, jsnull

    if value is jsnull:
        return None
    return from_js(value) if isinstance(value, JsProxy) else value


def _to_js(value: Any) -> Any:
    """A Python value as JS: dicts → Objects, lists/tuples → Arrays, JsProxies unwrapped."""
    import js
    from pyodide.ffi import to_js

    return to_js(value, dict_converter=js.Object.fromEntries, create_pyproxies=False)


def _dtypes(inputs: Mapping[str, Any] | None) -> dict[str, str]:
    """``{name: dtype}`` from an inputs spec ``{name: shape | [shape, dtype]}``."""
    out = {}
    for name, spec in (inputs or {}).items():
        dtype = "f32"
        if (isinstance(spec, (list, tuple)) and len(spec) == 2 and isinstance(spec[1], str)):
            dtype = spec[1]
        out[str(name)] = dtype
    return out


def _typed_array(what: str, value: Any, dtype: str) -> Any:
    """`value` as a fresh JS typed array (a JsProxy typed array passes through)."""
    from pyodide.ffi import JsProxy

    if isinstance(value, JsProxy):
        return value
    fmt = _FORMAT_OF_DTYPE.get(dtype, "f")
    np = numpy_or_none()
    if np is not None and isinstance(value, np.ndarray):
        want = np.dtype({"f": "float32", "i": "int32", "I": "uint32"}[fmt])
        if value.dtype != want and value.dtype.kind in ("f" if fmt == "f" else "iub"):
            value = value.astype(want)
        value = np.ascontiguousarray(value)
    elif isinstance(value, (list, tuple)):
        try:
            value = array.array(fmt, value)
        except TypeError as exc:
            raise TypeError(f"{what}: expected a flat list of {dtype} numbers ({exc})") from None
    try:
        mv = plain(flat_buffer(value))  # a flat memoryview with a typed-array format
    except TypeError as exc:
        raise TypeError(f"{what}: expected a buffer of {dtype} data (array.array, memoryview, "
                        f"bytes, a NumPy array), a flat list or a JS typed array; got "
                        f"{type(value).__name__} ({exc})") from None
    return _to_js(mv)  # Pyodide copies the bytes into a new ArrayBuffer (never the heap)


def _inputs_to_js(inputs: Mapping[str, Any], dtypes: Mapping[str, str], what: str) -> Any:
    return _to_js({name: _typed_array(f"{what} '{name}'", value, dtypes.get(name, "f32"))
                   for name, value in inputs.items()})


def _host_array(data: Any, shape: list[int] | None) -> Any:
    """A typed array from the worker as the native API returns it: a NumPy array when NumPy
    imports, else a memoryview cast to `shape` (flat when the shape is unknown)."""
    mv = data if isinstance(data, memoryview) else _py(data)
    if not isinstance(mv, memoryview):
        mv = memoryview(mv)
    dtype = _DTYPE_OF_FORMAT.get(mv.format)
    if shape is None or dtype is None:
        return mv
    count = 1
    for n in shape:
        count *= int(n)
    if mv.nbytes != mv.itemsize * count:
        return mv
    if numpy_or_none() is None and count == 0:
        return mv  # memoryview.cast refuses zero-size shapes
    return from_bytes(mv.cast("B"), [int(n) for n in shape], dtype)


def _captures(js_captures: Any) -> Captures:
    captures = Captures()
    if js_captures is None or _py(js_captures) is None:
        return captures
    for name in _py(js_captures.names()) or []:
        shape = _py(js_captures.shape(name))
        captures[name] = _host_array(js_captures.get(name), shape)
    return captures


def _result(js_result: Any, output: bool) -> Result:
    """A JS step/run result ``{kind, loss | output, captures, error}`` as a native result."""
    kind = _text(js_result.kind)
    if kind == "aborted":
        return Aborted()
    if kind == "failed":
        return Failed(_error_from_js(js_result.error))
    captures = _captures(getattr(js_result, "captures", None))
    if output:
        shape = _py(getattr(js_result, "outputShape", None))
        return Completed(output=_host_array(js_result.output, shape), captures=captures)
    return Completed(loss=float(js_result.loss), captures=captures)


def _local_failure(exc: BaseException) -> Failed:
    return Failed(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))


# -- graphs -----------------------------------------------------------------------------------
class RemoteForward:
    """A forward graph held by the worker (from :meth:`RemoteTraining.attach`), sharing its
    training graph's parameters. The remote twin of :class:`tensorgrad.Forward`."""

    def __init__(self, session: Session, js_graph: Any, inputs: Mapping[str, Any] | None
                 ) -> None:
        self.session = session
        self.js = js_graph
        self.input_dtypes = _dtypes(inputs)

    @property
    def graph_id(self) -> int:
        """The worker's id of this graph."""
        return int(self.js.graphId)

    @property
    def param_names(self) -> list[str]:
        """The parameter names, in the worker's order."""
        return list(_py(self.js.paramNames) or [])

    async def run(self, **inputs: Any) -> Result:
        """Run the forward: ``Completed(output=..., captures=...)``, ``Aborted()`` or
        ``Failed(error)``; never raises. The output is shaped like the native one (a NumPy
        array when NumPy imports, else a memoryview cast to the output's shape)."""
        try:
            js_inputs = _inputs_to_js(inputs, self.input_dtypes, "run input")
            return _result(await self.js.run(js_inputs), output=True)
        except Exception as exc:  # noqa: BLE001 (run reports failures, it never raises)
            return _local_failure(exc)

    async def upload_params(self, params: Mapping[str, Any], partial: bool = False) -> None:
        """Replace parameters: ``{name: buffer | list | typed array}`` of f32 values; every
        param unless `partial`."""
        js_params = _inputs_to_js(params, {}, "parameter")
        await _call(self.js.uploadParams(js_params, _to_js({"partial": partial})))

    async def download_params(self) -> dict[str, memoryview]:
        """The parameters as flat f32 memoryviews, ``{name: memoryview}`` (copies)."""
        params = _py(await _call(self.js.downloadParams())) or {}
        return {name: value if isinstance(value, memoryview) else memoryview(value)
                for name, value in params.items()}

    async def destroy(self) -> None:
        """Free the graph in the worker (and, for a training graph, its attached forwards);
        pending and later calls return ``Aborted()``."""
        await _call(self.js.destroy())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} graph {self.graph_id}: {', '.join(self.param_names)}>"


class RemoteTraining(RemoteForward):
    """A compiled training step held by the worker. The remote twin of
    :class:`tensorgrad.Training` (``await train.step(**inputs)`` and friends)."""

    def __init__(self, session: Session, js_train: Any, spec: Mapping[str, Any]) -> None:
        super().__init__(session, js_train, spec.get("inputs"))
        self.spec = dict(spec)

    @property
    def kernel_count(self) -> int:
        """How many kernels one step dispatches."""
        return int(self.js.kernelCount)

    async def step(self, **inputs: Any) -> Result:
        """One training step: ``Completed(loss=..., captures=...)``, ``Aborted()`` or
        ``Failed(error)``; never raises. Inputs are buffers, flat lists or typed arrays."""
        try:
            js_inputs = _inputs_to_js(inputs, self.input_dtypes, "step input")
            return _result(await self.js.step(js_inputs), output=False)
        except Exception as exc:  # noqa: BLE001 (step reports failures, it never raises)
            return _local_failure(exc)

    async def attach(self, forward: str, inputs: Mapping[str, Any], output: str | None = None
                     ) -> RemoteForward:
        """A forward graph sharing this graph's parameters: `forward` is an expression naming
        a ``fn(model, **inputs)`` in the worker; one input dim may be None."""
        spec: dict[str, Any] = {"forward": forward, "inputs": inputs}
        if output is not None:
            spec["output"] = output
        js_forward = await _call(self.js.attach(_to_js(spec)))
        return RemoteForward(self.session, js_forward, inputs)

    async def set_lr(self, lr: float | str) -> None:
        """A new learning rate: a number, or an expression building a schedule."""
        await _call(self.js.setLR(lr))

    async def replace_model(self, model: str, seed: int | None = None,
                            optimizer: str | None = None) -> dict[str, Any]:
        """Recompile for a new model expression; this handle stays valid and pending calls
        return ``Aborted()``. Returns ``{paramNames, kernelCount}``."""
        options = {k: v for k, v in (("seed", seed), ("optimizer", optimizer)) if v is not None}
        return _py(await _call(self.js.replaceModel(model, _to_js(options)))) or {}


# -- the session ------------------------------------------------------------------------------
class Session:
    """One tensorgrad worker (its own Pyodide, the compiler, the GPU) and its namespace."""

    def __init__(self, js_session: Any, client: Any) -> None:
        self.js = js_session
        self.client = client  # the imported tensorgrad.js module

    @property
    def timings(self) -> dict[str, Any]:
        """The worker's start-up timings (ms): pyodideMs, micropipMs, wheelMs, importMs..."""
        return _py(self.js.timings) or {}

    @property
    def dead(self) -> bool:
        """True once the worker is gone (terminated or crashed)."""
        return _py(self.js.dead) is not None

    async def exec(self, source: str) -> str | None:
        """Run Python source in the worker's namespace (top-level ``await`` allowed); the repr
        of its last expression, or None. Raises :class:`RemoteError` when it raised."""
        return _py(await _call(self.js.exec(source)))

    async def load(self, url: str) -> str | None:
        """Fetch Python source from `url` (relative to the page) and run it like exec."""
        return _py(await _call(self.js.load(url)))

    async def run_script(self, source: str, on_post: PostCallback | None = None) -> Any:
        """Run source defining ``async def main()`` in the worker and await it; each
        ``tensorgrad.web.post(obj)`` there calls ``on_post(obj)`` here (a dict, typed arrays as
        memoryviews; a coroutine it returns is scheduled). Returns main's value."""
        proxy = _callback_proxy(on_post)
        try:
            result = await _call(self.js.runScript(source, _to_js({"onPost": proxy})))
        finally:
            proxy.destroy()
        return _py(result)

    async def ping(self, value: Any = None) -> dict[str, Any]:
        """``{pong, python, platform, kinds}`` from the worker."""
        return _py(await _call(self.js.ping(_to_js(value)))) or {}

    async def compile(self, *, model: str, loss: str, inputs: Mapping[str, Any],
                      optimizer: str | Mapping[str, Any] | None = None,
                      seed: int | None = None) -> RemoteTraining:
        """Compile a training step in the worker. `model`, `loss` and `optimizer` are Python
        expressions there (``"MLP()"``, ``"loss_fn"``, ``"tg.optim.Adam(lr=1e-3)"``); `inputs`
        is ``{name: shape | [shape, dtype]}``. Raises :class:`RemoteError` on failure."""
        spec: dict[str, Any] = {"model": model, "loss": loss, "inputs": inputs,
                                "optimizer": optimizer}
        if seed is not None:
            spec["seed"] = int(seed)
        js_train = await _call(self.js.compile(_to_js(spec)))
        return RemoteTraining(self, js_train, spec)

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
            f"the page), not here (sys.platform is {__import__('sys').platform!r}); natively, "
            "use `await tensorgrad.compile(...)` directly")
    import js

    if not hasattr(js, "Worker") or not hasattr(js, "location"):
        raise RuntimeError(
            "tensorgrad.web.start() needs a browser page that can start a Web Worker; this "
            "Pyodide has none (Node.js?). Inside tensorgrad's own worker, use "
            "`await tensorgrad.compile(...)` directly")
    return js


def _default_client_urls(js: Any) -> list[str]:
    """Where tensorgrad.js may be: beside the page (its base URL), then the folder above
    Pyodide's (the root of a served ``dist/web/``, where ``pyodide/`` lives)."""
    base = _text(getattr(getattr(js, "document", None), "baseURI", None)) or _text(
        js.location.href)
    urls = [str(js.URL.new("tensorgrad.js", base).href)]
    try:
        import pyodide_js

        index_url = _text(pyodide_js._api.config.indexURL)
        if index_url:
            urls.append(str(js.URL.new("../tensorgrad.js", js.URL.new(index_url, base)).href))
    except Exception:  # noqa: BLE001, S110 (Pyodide's internals moved: the page base only)
        pass
    return list(dict.fromkeys(urls))


async def _import_client(js: Any, client_url: str | None) -> Any:
    from pyodide.code import run_js

    import_module = run_js("(url) => import(url)")
    base = _text(getattr(getattr(js, "document", None), "baseURI", None)) or _text(
        js.location.href)
    urls = ([str(js.URL.new(client_url, base).href)] if client_url is not None
            else _default_client_urls(js))
    errors = []
    for url in urls:
        try:
            return await import_module(url)
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
        js_session = await _call(client.start(_to_js(options)))
    finally:
        proxy.destroy()  # start() calls onProgress only until the worker is ready
    return Session(js_session, client)
