"""Host-side tensor data without requiring numpy.

Inputs may be numpy arrays or any buffer (`array.array`, `memoryview`, `bytes`) of the right
size and dtype; outputs are numpy arrays when numpy imports, else memoryviews cast to shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

from .errors import ShapeError

_FORMATS = {"f32": ("f", "float32"), "i32": ("i", "int32"), "bool": ("I", "uint32")}
_NUMPY: Any = None


def numpy_or_none() -> Any:
    """The numpy module when importable, else None (checked once)."""
    global _NUMPY
    if _NUMPY is None:
        try:
            import numpy
            _NUMPY = numpy
        except ImportError:
            _NUMPY = False
    return _NUMPY or None


def to_bytes(what: str, value: Any, shape: Sequence[int], dtype: str) -> memoryview:
    """Validate host data for a tensor of `shape`/`dtype` and view it as raw bytes.

    Raises ShapeError naming `what` (e.g. "input 'x'") with the expected and actual size."""
    fmt, np_name = _FORMATS[dtype]
    count = prod(shape)
    np = numpy_or_none()
    if np is not None and isinstance(value, np.ndarray):
        if value.dtype != np.dtype(np_name):
            kind = value.dtype.kind
            ok = (dtype == "f32" and kind == "f") or (dtype in ("i32", "bool") and kind in "iub")
            if not ok:
                raise ShapeError(what, f"expected {dtype} data, got a numpy array of "
                                 f"{value.dtype}")
            if dtype == "i32" and kind in "iu" and value.size:
                lo, hi = int(value.min()), int(value.max())
                if lo < -2**31 or hi >= 2**31:
                    raise ShapeError(what, f"a {value.dtype} array with values {lo}..{hi} "
                                     "does not fit i32 (-2147483648..2147483647)")
            value = value.astype(np_name)
        if value.size != count:
            raise ShapeError(what, f"expected {count} elements (shape {list(shape)}), got "
                             f"{value.size} (shape {list(value.shape)})")
        return memoryview(np.ascontiguousarray(value)).cast("B")
    if isinstance(value, (list, tuple)):
        import array
        try:
            value = array.array(fmt, value)
        except TypeError as e:
            raise ShapeError(what, f"expected {count} {dtype} numbers, got {e}") from None
    try:
        view = memoryview(value)
    except TypeError:
        raise ShapeError(what, f"expected a numpy array or a buffer of {dtype}, got "
                         f"{type(value).__name__}") from None
    if view.format not in ("B", "b", "c") and view.format.lstrip("@=<") != fmt and \
            not (dtype == "i32" and view.format.lstrip("@=<") in ("l",) and view.itemsize == 4):
        raise ShapeError(what, f"expected {dtype} data (format '{fmt}'), got a buffer of "
                         f"format '{view.format}'")
    if view.nbytes != 4 * count:
        raise ShapeError(what, f"expected {count} elements = {4 * count} bytes (shape "
                         f"{list(shape)}), got {view.nbytes} bytes")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def from_bytes(data: Any, shape: Sequence[int], dtype: str) -> Any:
    """Host array for raw bytes: numpy when available, else a memoryview cast to `shape`."""
    fmt, np_name = _FORMATS[dtype]
    count = prod(shape)
    np = numpy_or_none()
    if np is not None:
        arr = np.frombuffer(bytes(data[: 4 * count]) if not isinstance(data, bytes) else
                            data[: 4 * count], dtype=np_name).reshape(tuple(shape)).copy()
        return arr.astype(bool) if dtype == "bool" else arr
    view = memoryview(bytes(data[: 4 * count])).cast(fmt)
    return view.cast("B").cast(fmt, list(shape)) if len(shape) != 1 else view  # 0-d too


def scalar_bytes(value: float, dtype: str) -> bytes:
    import struct
    return struct.pack("<f" if dtype == "f32" else "<i", value)
