"""Short descriptions for ``repr()``: arrays as dtype and shape (a few values when tiny), byte
counts, input declarations. Nothing here ever writes out a buffer's bytes or a big array, so
the handles, results, compilations and exports that use it print in a line or two."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["array", "arrays", "byte_size", "clip", "count", "device", "mapping", "shape"]

PREVIEW_MAX = 6       # arrays with at most this many elements show their values
CLIP_MAX = 300        # longest message kept whole (an error's text in Failed)
ITEMS_MAX = 8         # entries of a mapping shown before "... (N more)"

# Buffer formats and NumPy dtype names -> tensorgrad's dtype names.
_DTYPES = {"f": "f32", "float32": "f32", "i": "i32", "int32": "i32", "l": "i64", "q": "i64",
           "int64": "i64", "d": "f64", "float64": "f64", "B": "u8", "uint8": "u8", "b": "i8",
           "int8": "i8", "?": "bool", "bool": "bool", "I": "u32", "uint32": "u32", "e": "f16",
           "float16": "f16", "h": "i16", "int16": "i16", "H": "u16", "uint16": "u16"}


def shape(dims: Iterable[Any], dtype: str = "f32") -> str:
    """``f32[256, 1]``: a dtype and its dims (None or a size name such as ``B`` as written)."""
    return f"{dtype}[{', '.join(str(d) for d in dims)}]"


def _dtype_name(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return _DTYPES.get(str(dtype), str(dtype))
    fmt = value.format.lstrip("@=<>!")
    return _DTYPES.get(fmt, fmt)


def _number(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def array(value: Any) -> str:
    """An array (NumPy, a memoryview, any buffer) as ``f32[2, 2]``, with its values when it has
    at most PREVIEW_MAX elements (``f32[1, 1] [0.4794]``); bytes and lists as their size."""
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value):,} bytes>"
    if isinstance(value, (list, tuple)):
        return f"<{type(value).__name__} of {len(value):,}>"
    if not hasattr(value, "shape"):
        try:
            value = memoryview(value)
        except TypeError:
            return f"<{type(value).__name__}>"
    dims = tuple(value.shape)
    size = 1
    for d in dims:
        size *= int(d)
    text = shape(dims, _dtype_name(value))
    if size <= PREVIEW_MAX and callable(getattr(value, "tolist", None)):
        text += " [" + ", ".join(_number(v) for v in _flat(value.tolist())) + "]"
    return text


def _flat(values: Any) -> list[Any]:
    """Nested lists (``tolist()`` of an array) in order, flat; a scalar as [scalar]."""
    if not isinstance(values, list):
        return [values]
    return [v for item in values for v in _flat(item)]


def mapping(items: Mapping[str, str]) -> str:
    """``{x: f32[256, 1], y: i32[256]}``: already-described values by name, at most ITEMS_MAX."""
    shown = [f"{k}: {v}" for k, v in list(items.items())[:ITEMS_MAX]]
    if len(items) > ITEMS_MAX:
        shown.append(f"... ({len(items) - ITEMS_MAX} more)")
    return "{" + ", ".join(shown) + "}"


def arrays(values: Mapping[str, Any]) -> str:
    """``{pred: f32[2, 2], err: f32[] [0.25]}``: arrays by name, each as :func:`array`."""
    return mapping({k: array(v) for k, v in values.items()})


def device(gpu: Any) -> str:
    """A GPU device as its description (adapter, driver, backend), else its type's name."""
    return str(getattr(gpu, "description", "") or type(gpu).__name__)


def byte_size(n: int) -> str:
    """``17.4 KB``, ``1.2 MB``: a byte count for people (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def count(n: int, what: str) -> str:
    """``4,353 params``, ``1 kernel``."""
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}s"


def clip(text: str, limit: int = CLIP_MAX) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"
