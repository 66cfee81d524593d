"""The page bridge, Python side: post data to the page, convert values between JS and Python.

Inside the worker (Pyodide), :func:`post` sends ``{kind: "post", id, data}`` to the page, where
``id`` is the ``runScript`` request that is running, so the page routes it to that script's
``onPost``. Typed arrays in ``data`` are transferred, Python buffers become fresh typed arrays.
Outside Pyodide (CPython), :func:`post` hands ``data`` to the sink set by :func:`set_sink`
(by default it prints it), so the same script runs natively.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

from .gpu import in_pyodide

__all__ = ["current_request", "flat_buffer", "from_js", "in_pyodide", "plain", "post",
           "set_sink", "to_js_value"]

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
