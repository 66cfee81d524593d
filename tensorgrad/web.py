"""The page bridge, Python side: post data to the page, convert values between JS and Python.

Inside the worker (Pyodide), :func:`post` sends ``{kind: "post", id, data}`` to the page, where
``id`` is the ``runScript`` request that is running, so the page routes it to that script's
``onPost``. Typed arrays in ``data`` are transferred, Python buffers become fresh typed arrays.
Outside Pyodide (CPython), :func:`post` hands ``data`` to the sink set by :func:`set_sink`
(by default it prints it), so the same script runs natively.
"""

from __future__ import annotations

import array
import importlib.util
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .gpu import in_pyodide

__all__ = ["TrainingRun", "current_request", "flat_buffer", "from_js", "import_source",
           "in_pyodide", "plain", "post", "set_sink", "to_js_value", "train_steps"]

# The id of the request whose script is running (asyncio tasks inherit it).
current_request: ContextVar[int | None] = ContextVar("tensorgrad_request", default=None)

_sink: Callable[[Any], None] | None = None

# Buffer formats Pyodide turns into typed arrays (Float32Array, Int32Array, ...): item sizes.
_TYPED_ARRAY_FORMATS = {"f": 4, "d": 8, "i": 4, "I": 4, "l": 4, "L": 4, "h": 2, "H": 2,
                        "b": 1, "B": 1, "c": 1}


def set_sink(sink: Callable[[Any], None] | None) -> None:
    """Where :func:`post` sends data outside Pyodide (None: print it)."""
    global _sink
    _sink = sink


def post(data: Any) -> None:
    """Stream `data` (JSON-like values, buffers, typed arrays) to the page."""
    if not in_pyodide():
        (_sink or print)(data)
        return
    import js

    message = to_js_value({"kind": "post", "id": current_request.get(), "data": data})
    send = getattr(js, "tensorgradPost", None) or js.postMessage
    send(message)


def flat_buffer(data: Any) -> memoryview:
    """A flat, C-contiguous memoryview of any buffer-protocol object, keeping its item format."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    fmt = mv.format.lstrip("@=<")
    if mv.ndim != 1 or fmt != mv.format:
        mv = mv.cast("B").cast(fmt) if mv.c_contiguous else memoryview(mv.tobytes()).cast(fmt)
    return mv


def _is_js(value: Any) -> bool:
    if not in_pyodide():
        return False
    from pyodide.ffi import JsProxy

    return isinstance(value, JsProxy)


def _is_buffer(value: Any) -> bool:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    try:
        memoryview(value)
    except TypeError:
        return False
    return True


def plain(value: Any) -> Any:
    """`value` made sendable: buffers flattened (they become typed arrays), containers made
    plain dicts and lists. Raises TypeError for anything the page cannot receive."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if _is_js(value):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return value.item()  # a NumPy scalar or 0-d array: a number
    if _is_buffer(value):
        mv = flat_buffer(value)
        if mv.format == "?":
            mv = mv.cast("B")  # bools travel as a Uint8Array of 0/1
        if _TYPED_ARRAY_FORMATS.get(mv.format) != mv.itemsize:
            raise TypeError(f"no typed array for buffer format {mv.format!r} "
                            f"({mv.itemsize} bytes per item)")
        return mv
    raise TypeError(f"cannot send a {type(value).__name__} to the page")


def to_js_value(value: Any) -> Any:
    """Convert `value` to JS in one FFI call: dicts → Objects, lists → Arrays, buffers → fresh
    typed arrays (a copy, never a view of the WebAssembly heap). Pyodide only."""
    import js
    from pyodide.ffi import to_js

    return to_js(plain(value), dict_converter=js.Object.fromEntries, create_pyproxies=False)


def from_js(value: Any) -> Any:
    """A JS value (a message) as Python, in one FFI call: Objects → dicts, Arrays → lists,
    typed arrays → memoryviews (format 'f' for Float32Array, 'i' for Int32Array, ...),
    null and undefined → None. Non-JS values pass through."""
    if not _is_js(value):
        return value
    from pyodide.ffi import jsnull

    def fix(v: Any) -> Any:
        if v is jsnull:
            return None
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return fix(value.to_py())


# ---- script-mode helpers: the pieces every training page needs -------------------------------

async def import_source(name: str, url: str, local_path: str | Path) -> ModuleType:
    """Import a module's source as `name`: fetched from `url` into the worker's filesystem
    inside Pyodide, read from `local_path` natively. The module is put in `sys.modules`."""
    path = Path(local_path)
    if in_pyodide():
        from pyodide.http import pyfetch  # type: ignore[import-not-found]

        response = await pyfetch(url)
        if not response.ok:
            raise OSError(f"GET {url}: HTTP {response.status}")
        path = Path("/home/pyodide/modules") / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(await response.string())
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class TrainingRun:
    """What :func:`train_steps` did: steps taken, losses, and its speed."""

    step: int                    # the global step count after the run
    run_steps: int = 0
    stopped: bool = False
    last_loss: float | None = None
    step_seconds: float = 0.0    # time inside train.step
    wall_seconds: float = 0.0

    @property
    def steps_per_s(self) -> float | None:
        return self.run_steps / self.step_seconds if self.step_seconds else None

    @property
    def wall_steps_per_s(self) -> float | None:
        return self.run_steps / self.wall_seconds if self.wall_seconds else None


async def train_steps(train: Any, next_batch: Callable[[], Mapping[str, Any]], steps: int, *,
                      start_step: int = 0, every: int = 100,
                      on_every: Callable[[int, float, float], Awaitable[None]] | None = None,
                      should_stop: Callable[[], bool] = lambda: False,
                      losses: list[float] | None = None, max_pending: int = 50,
                      stream_seconds: float = 0.25) -> TrainingRun:
    """Run up to `steps` training steps, streaming losses to the page.

    Posts `{kind: "loss", step, losses}` (a Float32Array of consecutive per-step losses,
    `step` the first one's number) at least every `stream_seconds`; every `every` steps
    awaits `on_every(step, loss, steps_per_s since the last call)`. Stops early when
    `should_stop()` is true; a step that does not complete raises RuntimeError."""
    run = TrainingRun(start_step)
    pending = array.array("f")
    t_run = t_mark = t_post = time.perf_counter()
    mark = start_step

    def flush() -> None:
        nonlocal pending, t_post
        if pending:
            post({"kind": "loss", "step": run.step - len(pending) + 1, "losses": pending})
        pending, t_post = array.array("f"), time.perf_counter()

    try:
        while run.run_steps < steps and not should_stop():
            t0 = time.perf_counter()
            result = await train.step(**next_batch())
            run.step_seconds += time.perf_counter() - t0
            if result.kind != "completed":
                raise RuntimeError(f"step {run.step + 1} {result.kind}: "
                                   f"{getattr(result, 'error', '')}")
            run.step += 1
            run.run_steps += 1
            run.last_loss = result.loss
            if losses is not None:
                losses.append(result.loss)
            pending.append(result.loss)
            if len(pending) >= max_pending or time.perf_counter() - t_post > stream_seconds:
                flush()
            if on_every is not None and run.step % every == 0:
                flush()
                rate = (run.step - mark) / (time.perf_counter() - t_mark)
                await on_every(run.step, result.loss, rate)
                t_mark, mark = time.perf_counter(), run.step
    finally:
        flush()
    run.stopped = should_stop()
    run.wall_seconds = time.perf_counter() - t_run
    return run


# ---- Python on the page: the page client (tensorgrad/web_client.py), imported when used ------

async def start(on_progress: Callable[[dict[str, Any]], Any] | None = None,
                client_url: str | None = None, **options: Any) -> Any:
    """From Python in a page-side Pyodide (PyScript, or loadPyodide on the page): load
    tensorgrad.js, start tensorgrad's worker and return a :class:`tensorgrad.web_client.Session`
    (``exec``, ``load``, ``run_script``, ``compile`` → ``step`` ...). See ``web_client.start``."""
    from .web_client import start as _start

    return await _start(on_progress=on_progress, client_url=client_url, **options)
