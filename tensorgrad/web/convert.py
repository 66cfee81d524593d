"""Values across the JS↔Python boundary (Pyodide): plain data, buffers and typed arrays.

:func:`plain` makes a value sendable (containers plain, buffers flat), :func:`to_js_value`
converts it in one FFI call, :func:`from_js` brings a JS value back (typed arrays become
memoryviews). Outside Pyodide only :func:`plain` and :func:`flat_buffer` apply.
"""

from __future__ import annotations

import array
from collections.abc import Mapping
from typing import Any

from ..errors import user_traceback
from ..gpu import in_pyodide
from ..results import Aborted, Completed, Failed

__all__ = ["error_info", "flat_buffer", "from_js", "is_js", "plain", "result_message",
           "to_js_value", "typed_array_name"]

# Buffer formats Pyodide turns into typed arrays (Float32Array, Int32Array, ...): item sizes.
_TYPED_ARRAY_FORMATS = {"f": 4, "d": 8, "i": 4, "I": 4, "l": 4, "L": 4, "h": 2, "H": 2,
                        "b": 1, "B": 1, "c": 1}


def flat_buffer(data: Any) -> memoryview:
    """A flat, C-contiguous memoryview of any buffer-protocol object, keeping its item format."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    fmt: Any = mv.format.lstrip("@=<")  # (a str; memoryview.cast's stubs name literals)
    if mv.ndim != 1 or fmt != mv.format:
        mv = mv.cast("B").cast(fmt) if mv.c_contiguous else memoryview(mv.tobytes()).cast(fmt)
    return mv


# The JS typed array a Python buffer of each element format travels as (4-byte 'l'/'L' only:
# wasm32's C long).
_TYPED_ARRAY_NAMES = {"f": "Float32Array", "d": "Float64Array", "b": "Int8Array",
                      "h": "Int16Array", "i": "Int32Array", "l": "Int32Array", "B": "Uint8Array",
                      "H": "Uint16Array", "I": "Uint32Array", "L": "Uint32Array"}


# Python's own types, never a JsProxy: is_js answers for them without asking Pyodide's
# JsProxy type check (Python code, a few µs a call in the worker's per-step path).
_PYTHON_TYPES = frozenset({type(None), bool, int, float, str, bytes, bytearray, memoryview,
                           dict, list, tuple, array.array})


def is_js(value: Any) -> bool:
    """Whether `value` is a JS object seen from Python (a JsProxy; never outside Pyodide)."""
    if type(value) in _PYTHON_TYPES or not in_pyodide():
        return False
    from pyodide.ffi import JsProxy

    return isinstance(value, JsProxy)


def typed_array_name(value: Any) -> str | None:
    """The JS typed array `value` is ('Float32Array', ...: a JsProxy of one) or travels as (a
    Python buffer of a typed-array element format: memoryview, array.array, NumPy array);
    None for anything else (DataView, a bytes-like of no such format, a non-buffer)."""
    if is_js(value):
        import js

        if not js.ArrayBuffer.isView(value):
            return None
        name = str(value.constructor.name)
        return name if name.endswith("Array") else None
    try:
        mv = value if isinstance(value, memoryview) else memoryview(value)
    except TypeError:
        return None
    fmt = mv.format.lstrip("@=<")
    if _TYPED_ARRAY_FORMATS.get(fmt) != mv.itemsize:
        return None
    return _TYPED_ARRAY_NAMES.get(fmt)


def _is_buffer(value: Any) -> bool:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    try:
        memoryview(value)
    except TypeError:
        return False
    return True


def error_info(exc: BaseException) -> dict[str, str]:
    """``{name, message, traceback}`` of an exception; the traceback is cut to the user's
    frames (:func:`tensorgrad.errors.user_traceback`: the worker loop's, tensorgrad's,
    asyncio's and Pyodide's frames around them left out, so it ends at the user's line)."""
    return {"name": type(exc).__name__, "message": str(exc),
            "traceback": user_traceback(exc)}


def _array_fields(value: Any) -> tuple[memoryview, list[int]]:
    mv = value if isinstance(value, memoryview) else memoryview(value)
    return flat_buffer(mv), list(mv.shape or ())


def result_message(result: Completed | Aborted | Failed) -> dict[str, Any]:
    """A step or run result as the page sees it, plain fields only: ``{kind: "completed",
    loss | output + outputShape, captures: {name: typed array}, captureShapes: {name:
    dims}}``, ``{kind: "aborted"}`` or ``{kind: "failed", error: {name, message,
    traceback}}``."""
    if isinstance(result, Aborted):
        return {"kind": "aborted"}
    if isinstance(result, Failed):
        return {"kind": "failed", "error": error_info(result.error)}
    captures: dict[str, memoryview] = {}
    shapes: dict[str, list[int]] = {}
    for name, value in result.captures.items():
        captures[name], shapes[name] = _array_fields(value)
    reply: dict[str, Any] = {"kind": "completed", "captures": captures, "captureShapes": shapes}
    if result.loss is not None:
        reply["loss"] = float(result.loss)
    if result.output is not None:
        reply["output"], reply["outputShape"] = _array_fields(result.output)
    return reply


def plain(value: Any) -> Any:
    """`value` made sendable: buffers flattened (they become typed arrays), containers made
    plain dicts and lists, step/run results their :func:`result_message`. Raises TypeError
    for anything the page cannot receive."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if is_js(value):
        return value
    if isinstance(value, (Completed, Aborted, Failed)):
        return plain(result_message(value))
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
    if value is None or not in_pyodide():
        return value
    from pyodide.ffi import JsProxy, jsnull

    if value is jsnull:
        return None
    if not isinstance(value, JsProxy):
        return value

    def fix(v: Any) -> Any:
        if v is jsnull:
            return None
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return fix(value.to_py())
