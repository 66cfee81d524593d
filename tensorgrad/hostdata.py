"""Host-side tensor data without requiring numpy.

Inputs may be numpy arrays, any buffer (`array.array`, `memoryview`, `bytes`) or (nested)
lists of the right size and dtype; outputs are numpy arrays when numpy imports, else
memoryviews cast to shape.

The shape rule (:func:`check_layout`, applied by :func:`to_bytes`, which every entry point's
host data goes through): data that carries a shape of 2 or more dims (a numpy array, a
multi-dimensional memoryview, a nested list, any object with a ``.shape``) must have the
declared shape exactly; flat data (1-D arrays and buffers, flat lists, bytes) of the right
size is read in row-major order; a single value fits a one-element shape. So a transposed
array of the right size is an error, never silently misread.

I32 data that indexes a one-hot or a row gather is checked against what each use allows
(:class:`IndexBound`, :func:`first_rejected`); the compiler finds the uses
(:func:`tensorgrad.ops.index.input_index_bounds`) and the runtime checks each step's data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, cast

from .errors import ShapeError

if TYPE_CHECKING:
    from typing import TypeAlias

    from numpy.typing import NDArray
    from typing_extensions import Buffer

    from .ir import DType

    # Host data for one tensor, as step, run and upload_params take it: a numpy array, any
    # other buffer (array.array, memoryview, bytes) or a (nested) list or tuple of numbers,
    # in the declared shape or flat in row-major order (see the module docstring).
    HostData: TypeAlias = Buffer | Sequence[Any]
    # What a read gives back for one tensor: a numpy array when numpy imports, else a
    # memoryview cast to the tensor's shape.
    HostArray: TypeAlias = NDArray[Any] | memoryview[Any]
    # One input of a step or run as the user gives it: host data, or a Python number for an
    # input of one element.
    InputData: TypeAlias = HostData | float

_FORMATS: dict[str, tuple[Literal["f", "i", "I"], str]] = {
    "f32": ("f", "float32"), "i32": ("i", "int32"), "bool": ("I", "uint32")}
_RANGES = {"f32": "-3.4e38..3.4e38", "i32": "-2147483648..2147483647", "bool": "0..4294967295"}
_NUMPY: Any = None
# Buffer formats read as raw bytes (bytes, bytearray, array('B'), a byte view): the data's
# element type is the declared one. A signed byte format ('b', int8 data) is typed data.
RAW_FORMATS = ("B", "c")


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


def _is_int(d: object) -> TypeGuard[int]:
    return isinstance(d, int) and not isinstance(d, bool)


def _nested(what: str, value: list[Any] | tuple[Any, ...]
            ) -> tuple[tuple[int, ...], list[Any]]:
    """The shape and the flat items of a (possibly nested) list: at each depth every item
    must be a list of one length, or every item a number (ShapeError otherwise)."""
    shape: list[int] = []
    level: list[Any] = [value]
    while level and isinstance(level[0], (list, tuple)):
        width = len(level[0])
        for k, row in enumerate(level):
            if not isinstance(row, (list, tuple)) or len(row) != width:
                got = (f"has {len(row)} items" if isinstance(row, (list, tuple)) else
                       f"is the number {row!r}")
                raise ShapeError(what, f"a ragged nested list: at depth {len(shape)}, item {k} "
                                 f"{got} where item 0 has {width} items; nested lists must "
                                 "be rectangular")
        shape.append(width)
        level = [v for row in level for v in row]
    bad = next((k for k, v in enumerate(level) if isinstance(v, (list, tuple))), None)
    if bad is not None:
        raise ShapeError(what, f"a ragged nested list: at depth {len(shape)}, item {bad} is a "
                         "list where item 0 is a number; nested lists must be rectangular")
    return tuple(shape), level


def carried_shape(value: Any) -> tuple[int, ...] | None:
    """The shape host data carries: a numpy array's or any object's `.shape` (a tuple of
    ints), a memoryview's, a nested list's; None for data without one (bytes, array.array,
    a raw byte view)."""
    if isinstance(value, (list, tuple)):
        try:
            return _nested("data", value)[0]
        except ShapeError:
            return None
    if isinstance(value, memoryview) and value.format in RAW_FORMATS:
        return None  # raw bytes: no element shape
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and all(_is_int(d) for d in shape):
        return shape
    return None


def check_layout(what: str, carried: Sequence[int] | None, shape: Sequence[int | None],
                 param: bool = False) -> None:
    """The host-data shape rule, for data of the right element count: data carrying 2 or more
    dims must have the declared `shape` exactly (a None dim of `shape` matches any size);
    flat data (no shape or 1-D) and a single value for a one-element shape pass. ShapeError
    naming `what`, both shapes and, for a transpose, how to pass it (`param`: a weight, with
    PyTorch's layout in the hint)."""
    if carried is None or len(carried) <= 1:
        return
    carried = tuple(carried)
    if prod(carried) == 1 and None not in shape and prod(shape) == 1:  # type: ignore[arg-type]
        return
    if len(carried) == len(shape) and all(d is None or d == c for d, c in zip(shape, carried)):
        return
    want = list(shape)
    if len(shape) == 2 and None not in shape and carried == (shape[1], shape[0]):
        hint = ("pass w.T (a PyTorch Linear weight is [out, in]; tensorgrad's Linear weight "
                "is [in, out])" if param else "pass x.T if it is laid out the other way")
        raise ShapeError(what, f"got {list(carried)}, the transpose of {want}: {hint}")
    raise ShapeError(what, f"got data of shape {list(carried)} for shape {want}: the element "
                     "counts agree but the layouts differ, so the values would be misread; "
                     f"pass data of shape {want} (or flat data in that row-major order)")


def flat_list(what: str, value: list[Any] | tuple[Any, ...], shape: Sequence[int | None],
              param: bool = False) -> list[Any]:
    """The items of a (nested) list, its shape checked by :func:`check_layout` when its
    element count fits `shape` (a wrong count is the caller's size error)."""
    carried, items = _nested(what, value)
    if None in shape or len(items) == prod(shape):  # type: ignore[arg-type]
        check_layout(what, carried, shape, param)
    return items


def check_host_shape(what: str, value: Any, shape: Sequence[int | None],
                     param: bool = False) -> None:
    """:func:`check_layout` for any host data whose element count fits `shape` (a None dim
    matches any size): for callers that send the data on flat, such as the page client."""
    carried = _nested(what, value)[0] if isinstance(value, (list, tuple)) else \
        carried_shape(value)
    if carried is None or len(carried) <= 1:
        return
    if None in shape or prod(carried) == prod(shape):  # type: ignore[arg-type]
        check_layout(what, carried, shape, param)


def element_count(value: Any) -> int:
    """How many elements host data holds (a nested list's items, a buffer's items; raw bytes
    hold one element per 4 bytes, the size of every host dtype)."""
    if isinstance(value, (int, float)):
        return 1
    size = getattr(value, "size", None)
    if _is_int(size):  # numpy arrays and scalars
        return size
    if isinstance(value, (list, tuple)):
        try:
            return len(_nested("data", value)[1])
        except ShapeError:
            return len(value)
    try:
        view = memoryview(value)
    except TypeError:
        return len(value)
    return view.nbytes // (4 if view.format in RAW_FORMATS else max(1, view.itemsize))


def list_array(what: str, items: list[Any], fmt: str, dtype: str, count: int) -> Any:
    """An array.array of the list's numbers; ShapeError naming the first item that is not a
    number of `dtype`, or that does not fit it."""
    import array
    try:
        return array.array(fmt, items)
    except (TypeError, OverflowError) as e:
        for k, v in enumerate(items):
            try:
                array.array(fmt, [v])
            except OverflowError:
                raise ShapeError(what, f"holds {v!r} at flat index {k}, outside the {dtype} "
                                 f"range {_RANGES[dtype]}") from None
            except TypeError:
                wanted = "an int" if dtype != "f32" else "a number"
                raise ShapeError(what, f"expected {count} {dtype} numbers, got "
                                 f"{type(v).__name__} {v!r} at flat index {k} ({wanted} is "
                                 "needed)") from None
        raise ShapeError(what, f"expected {count} {dtype} numbers, got {e}") from None


def numpy_as(what: str, value: Any, dtype: DType) -> Any:
    """A numpy array (or numpy scalar) as an array of `dtype`'s host type: converted where
    the kind fits (floats to f32; ints, uints and bools to i32 or bool, i32 range-checked),
    else ShapeError naming `what`. Nothing is silently wrapped or reinterpreted."""
    np = numpy_or_none()
    value = np.asarray(value)
    np_name = _FORMATS[dtype][1]
    if value.dtype == np.dtype(np_name):
        return value
    kind = value.dtype.kind
    ok = (dtype == "f32" and kind == "f") or (dtype in ("i32", "bool") and kind in "iub")
    if not ok:
        raise ShapeError(what, f"expected {dtype} data, got a numpy array of {value.dtype}")
    if dtype == "i32" and kind in "iu" and value.size:
        lo, hi = int(value.min()), int(value.max())
        if lo < -2**31 or hi >= 2**31:
            raise ShapeError(what, f"a {value.dtype} array with values {lo}..{hi} "
                             "does not fit i32 (-2147483648..2147483647)")
    return value.astype(np_name)


def is_numpy(value: Any) -> bool:
    """Whether `value` is a numpy array or a numpy scalar (numpy imported or not)."""
    np = numpy_or_none()
    return np is not None and isinstance(value, (np.ndarray, np.generic))


def _numpy_bytes(what: str, value: Any, shape: Sequence[int], dtype: DType,
                 param: bool) -> memoryview:
    """:func:`to_bytes` of a numpy array: its dtype converted where the kind fits."""
    np = numpy_or_none()
    count = prod(shape)
    value = numpy_as(what, value, dtype)
    if value.size != count:
        raise ShapeError(what, f"expected {count} elements (shape {list(shape)}), got "
                         f"{value.size} (shape {list(value.shape)})")
    check_layout(what, value.shape, shape, param)
    return memoryview(np.ascontiguousarray(value)).cast("B")


def to_bytes(what: str, value: HostData, shape: Sequence[int], dtype: DType,
             param: bool = False) -> memoryview:
    """Validate host data for a tensor of `shape`/`dtype` and view it as raw bytes.

    Every entry point's host data comes through here. Raises ShapeError naming `what` (e.g.
    "input 'x'") with the expected and actual size, and applies the shape rule of
    :func:`check_layout`: data carrying 2 or more dims must have `shape` exactly, flat data of
    the right size passes. `param`: `value` is a weight (the transpose hint names PyTorch's
    Linear layout)."""
    fmt = _FORMATS[dtype][0]
    count = prod(shape)
    if is_numpy(value):
        return _numpy_bytes(what, value, shape, dtype, param)
    if isinstance(value, (list, tuple)):
        value = list_array(what, flat_list(what, value, shape, param), fmt, dtype, count)
    carried = carried_shape(value)
    try:
        view = memoryview(cast("Buffer", value))
    except TypeError:
        raise ShapeError(what, f"expected a numpy array or a buffer of {dtype}, got "
                         f"{type(value).__name__}") from None
    if view.format not in RAW_FORMATS and view.format.lstrip("@=<") != fmt and \
            not (dtype == "i32" and view.format.lstrip("@=<") in ("l",) and view.itemsize == 4):
        raise ShapeError(what, f"expected {dtype} data (format '{fmt}'), got a buffer of "
                         f"format '{view.format}'")
    if view.nbytes != 4 * count:
        items = f" ({view.nbytes // 4} elements)" if view.nbytes % 4 == 0 else ""
        raise ShapeError(what, f"expected {count} elements = {4 * count} bytes (shape "
                         f"{list(shape)}), got {view.nbytes} bytes{items}")
    check_layout(what, carried, shape, param)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def from_bytes(data: bytes | memoryview, shape: Sequence[int], dtype: DType) -> HostArray:
    """Host array for raw bytes: numpy when available, else a memoryview cast to `shape`.
    f16 bytes (a mixed-precision tensor the library reads back) come back as f32 values."""
    if dtype == "f16":
        return _from_f16(data, shape)
    fmt, np_name = _FORMATS[dtype]
    count = prod(shape)
    np = numpy_or_none()
    if np is not None:
        arr = np.frombuffer(bytes(data[: 4 * count]) if not isinstance(data, bytes) else
                            data[: 4 * count], dtype=np_name).reshape(tuple(shape)).copy()
        return arr.astype(bool) if dtype == "bool" else arr
    view = memoryview(bytes(data[: 4 * count])).cast(fmt)
    return view.cast("B").cast(fmt, list(shape)) if len(shape) != 1 else view  # 0-d too


def _from_f16(data: bytes | memoryview, shape: Sequence[int]) -> HostArray:
    """f16 bytes as f32 values: a numpy float32 array, else a memoryview of f32s."""
    import struct

    count = prod(shape)
    np = numpy_or_none()
    if np is not None:
        half = np.frombuffer(bytes(data[: 2 * count]), dtype=np.float16)
        return half.astype(np.float32).reshape(tuple(shape))
    values = struct.unpack(f"<{count}e", bytes(data[: 2 * count]))
    view = memoryview(struct.pack(f"<{count}f", *values)).cast("f")
    return view.cast("B").cast("f", list(shape)) if len(shape) != 1 else view


def scalar_bytes(value: float, dtype: DType) -> bytes:
    """The bytes of one 0-d value the library makes itself (an optimizer's per-step scalar,
    the PRNG seed), packed directly, without the checks of :func:`to_bytes`: a float past
    the f32 range becomes ±inf, as :func:`to_bytes` converts one."""
    import array
    return array.array(_FORMATS[dtype][0], [value]).tobytes()


# ---- index checks: i32 host data that indexes a one-hot or a row gather -----------------

@dataclass(frozen=True)
class IndexBound:
    """What one op reading i32 indices allows them to hold: 0..bound - 1, and `sentinel`
    (None: no such value) that the op gives a meaning of its own (a one-hot's ignore_index:
    a zero row on purpose). `what`: the op and its user line, for messages."""

    bound: int
    what: str
    sentinel: int | None = None

    def allows(self, value: int) -> bool:
        return 0 <= value < self.bound or value == self.sentinel

    def expected(self) -> str:
        """The allowed values in words: '0..4', or '0..4 or -100' with a sentinel."""
        extra = self.sentinel is not None and not 0 <= self.sentinel < self.bound
        return f"0..{self.bound - 1}" + (f" or {self.sentinel}" if extra else "")


def first_rejected(values: Sequence[int], uses: Sequence[IndexBound]
                   ) -> tuple[int, int, IndexBound] | None:
    """(flat index, value, the use that rejects it) for the first of `values` that one of
    `uses` does not allow; None when all are allowed. One pass over the values when all lie
    in 0..bound - 1 of every use, else one over their distinct values first."""
    if not values or (0 <= min(values) and max(values) < min(u.bound for u in uses)):
        return None
    rejecting: dict[int, IndexBound] = {}
    for v in set(values):
        use = next((u for u in uses if not u.allows(v)), None)
        if use is not None:
            rejecting[v] = use
    if not rejecting:
        return None
    k, v = next((k, v) for k, v in enumerate(values) if v in rejecting)
    return k, v, rejecting[v]


def sentinel_only(values: Sequence[int], uses: Sequence[IndexBound]) -> IndexBound | None:
    """The use whose sentinel every one of `values` is (all of cross_entropy's targets
    ignored), or None."""
    if not values:
        return None
    first = values[0]
    use = next((u for u in uses if u.sentinel is not None and u.sentinel == first), None)
    if use is None or min(values) != first or max(values) != first:
        return None
    return use
