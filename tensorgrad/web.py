"""The page bridge, Python side: post data to the page, convert values between JS and Python.

Inside the worker (Pyodide), :func:`post` sends ``{kind: "post", id, data}`` to the page, where
``id`` is the ``runScript`` request that is running, so the page routes it to that script's
``onPost``. Typed arrays in ``data`` are transferred, Python buffers become fresh typed arrays.
Outside Pyodide (CPython), :func:`post` hands ``data`` to the sink set by :func:`set_sink`
(by default it prints it), so the same script runs natively.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

__all__ = ["current_request", "from_js", "in_pyodide", "post", "set_sink", "to_js_value"]

# The id of the request whose script is running (asyncio tasks inherit it).
current_request: ContextVar[int | None] = ContextVar("tensorgrad_request", default=None)

_sink: Callable[[Any], None] | None = None

# Python buffer formats → JS typed array constructors.
_TYPED_ARRAYS = {
    "f": "Float32Array", "d": "Float64Array", "i": "Int32Array", "I": "Uint32Array",
    "l": "Int32Array", "L": "Uint32Array", "h": "Int16Array", "H": "Uint16Array",
    "b": "Int8Array", "B": "Uint8Array", "c": "Uint8Array",
}
# JS typed array constructors → Python buffer formats (for memoryview.cast).
_FORMATS = {
    "Float32Array": "f", "Float64Array": "d", "Int32Array": "i", "Uint32Array": "I",
    "Int16Array": "h", "Uint16Array": "H", "Int8Array": "b", "Uint8Array": "B",
    "Uint8ClampedArray": "B",
}


def in_pyodide() -> bool:
    """True inside Pyodide (browser main thread or worker)."""
    return sys.platform == "emscripten"


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


def _is_buffer(value: Any) -> bool:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    try:
        memoryview(value)
    except TypeError:
        return False
    return True


def _plain(value: Any) -> Any:
    """`value` with buffers flattened (they become typed arrays) and containers made plain."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__module__ == "pyodide.ffi" or type(value).__name__.startswith("Js"):
        return value  # already a JS value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if _is_buffer(value):
        mv = flat_buffer(value)
        if mv.format.lstrip("@=<") not in _TYPED_ARRAYS:
            raise TypeError(f"no typed array for buffer format {mv.format!r}")
        return mv
    if hasattr(value, "item") and callable(value.item):
        return value.item()  # a NumPy scalar
    raise TypeError(f"cannot send a {type(value).__name__} to the page")


def to_js_value(value: Any) -> Any:
    """Convert `value` to JS in one FFI call: dicts → Objects, lists → Arrays, buffers → fresh
    typed arrays (a copy, never a view of the WebAssembly heap). Pyodide only."""
    from pyodide.ffi import to_js

    import js

    return to_js(_plain(value), dict_converter=js.Object.fromEntries, create_pyproxies=False)


def from_js(value: Any) -> Any:
    """Convert a JS value to Python: Objects → dicts, Arrays → lists, typed arrays →
    memoryviews with their item format ('f' for Float32Array, 'i' for Int32Array, ...)."""

    def convert(obj: Any, recurse: Callable[[Any], Any], cache: Callable[[Any, Any], None]
                ) -> Any:
        return obj

    if getattr(value, "typeof", None) is None:
        return value  # not a JsProxy
    return _convert(value)


def _convert(value: Any) -> Any:
    kind = getattr(value, "typeof", None)
    if kind is None or kind != "object":
        return value
    name = value.constructor.name
    if name in _FORMATS:
        return value.to_memoryview().cast("B").cast(_FORMATS[name])
    if name == "ArrayBuffer":
        return value.to_memoryview()
    if name == "Array":
        return [_convert(v) for v in value]
    if name == "Object":
        return {k: _convert(v) for k, v in value.object_entries()}
    return value
