"""Checkpoints in the safetensors format (f32 tensors), without numpy.

Layout: u64 little-endian header length N, N bytes of UTF-8 JSON {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}} (offsets relative to the data
blob), then the blob. Loading checks everything the reference ``safetensors`` library checks
(and a little more, see :func:`load_safetensors`); every malformed file raises
:class:`~tensorgrad.errors.SafetensorsError` naming the tensor and the rule it breaks.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any, NoReturn

from .errors import SafetensorsError
from .hostdata import from_bytes, numpy_or_none

MAX_HEADER_BYTES = 100_000_000  # the reference library's limit
_MAX_USIZE = 2**64 - 1  # dims, offsets and sizes are u64 in the reference library
_FIELDS = ("dtype", "shape", "data_offsets")
# Every dtype the reference library knows, with its size in bits.
_DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
    "I64": 64, "U64": 64}
_SKIPPED_INT_DTYPES = {"I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL"}


def _show(value: Any, limit: int = 80) -> str:
    """A short repr of a user value for a message (JSON spelling for JSON values)."""
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    if isinstance(value, str):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(rule: str, name: str | None = None) -> NoReturn:
    raise SafetensorsError(f"safetensors: {rule}" if name is None else
                           f"safetensors: {_show(name)} {rule}")


def _is_unicode(text: str) -> bool:
    """False for a str holding a lone surrogate (JSON's "\\ud800"): not encodable as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---- saving ----------------------------------------------------------------------------------

def _shape_of(value: Any) -> list[int]:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return [int(d) for d in shape]
    view = memoryview(value)
    return list(view.shape or ()) if view.ndim else []


def _check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise SafetensorsError(f"save_safetensors: tensor name {name!r} has type "
                               f"{type(name).__name__}; names must be str")
    if name == "__metadata__":
        raise SafetensorsError("save_safetensors: '__metadata__' is reserved for the header's "
                               "metadata and cannot name a tensor")
    if not _is_unicode(name):
        raise SafetensorsError(f"save_safetensors: tensor name {name!r} holds a lone "
                               "surrogate; names must be valid Unicode (UTF-8)")
    return name


def _check_metadata(metadata: Any) -> dict[str, str]:
    if not isinstance(metadata, Mapping):
        raise SafetensorsError("save_safetensors: metadata must be a mapping of str to str, "
                               f"got {type(metadata).__name__}")
    for key, value in metadata.items():
        for what, text in (("key", key), ("value", value)):
            if not isinstance(text, str):
                raise SafetensorsError(f"save_safetensors: metadata {what} {text!r} (of key "
                                       f"{key!r}) has type {type(text).__name__}; metadata "
                                       "keys and values must be str")
            if not _is_unicode(text):
                raise SafetensorsError(f"save_safetensors: metadata {what} {text!r} holds a "
                                       "lone surrogate; it must be valid Unicode (UTF-8)")
    return dict(metadata)


def _f32_bytes(name: str, value: Any) -> bytes:
    np = numpy_or_none()
    if np is not None and isinstance(value, np.ndarray):
        if value.dtype != np.float32:
            raise TypeError(f"save_safetensors: '{name}' is {value.dtype}; only float32 "
                            "tensors are supported")
        return np.ascontiguousarray(value).tobytes()
    view = memoryview(value)
    if view.format.lstrip("@=<") != "f":
        raise TypeError(f"save_safetensors: '{name}' has buffer format "
                        f"'{view.format}'; only f32 is supported")
    return view.tobytes()


def save_safetensors(params: Mapping[str, Any], metadata: Mapping[str, str] | None = None
                     ) -> bytes:
    """Serialize {name: f32 array or buffer} to safetensors bytes (names sorted).

    Every name must be a str that is valid Unicode and not ``"__metadata__"`` (the header
    key of the metadata); `metadata` must map str to str. Anything else raises
    :class:`~tensorgrad.errors.SafetensorsError` rather than writing a file that does not
    load back as saved. Values that are not f32 raise TypeError. The header is padded with
    spaces to keep the data 8-byte aligned, as the reference library does."""
    header: dict[str, Any] = {}
    if metadata is not None and (checked := _check_metadata(metadata)):
        header["__metadata__"] = checked
    names = [_check_name(name) for name in params]
    blobs = []
    offset = 0
    for name in sorted(names):
        value = params[name]
        data = _f32_bytes(name, value)
        shape = _shape_of(value)
        if 4 * prod(shape) != len(data):
            shape = [len(data) // 4]
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the blob 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


# ---- loading: the header ---------------------------------------------------------------------

class _Object(dict[str, Any]):
    """A JSON object, remembering the keys it repeated (json keeps the last silently)."""

    repeated: list[str]


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    seen: set[str] = set()
    obj.repeated = []
    for k, _ in pairs:
        if k in seen:
            obj.repeated.append(k)
        seen.add(k)
    return obj


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _int(text: str) -> int | float:
    return -0.0 if text == "-0" else int(text)  # "-0" is a float in strict JSON parsers


def _header_json(buf: memoryview) -> tuple[Any, int]:
    """The decoded JSON header and its length N."""
    if len(buf) < 8:
        _fail(f"buffer too small ({len(buf)} bytes): a file starts with an 8-byte header "
              "length")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > MAX_HEADER_BYTES:
        _fail(f"header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if 8 + n > len(buf):
        _fail(f"header length {n} exceeds buffer ({len(buf)} bytes)")
    try:
        text = bytes(buf[8: 8 + n]).decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(f"header is not valid UTF-8 ({e})")
    try:
        header = json.loads(text, object_pairs_hook=_object, parse_int=_int,
                            parse_constant=_no_constant)
    except RecursionError:
        _fail("header is not valid JSON (nested too deeply)")
    except ValueError as e:
        _fail(f"header is not valid JSON ({e})")
    return header, n


def _check_keys(obj: _Object, where: str, name: str | None = None) -> None:
    if obj.repeated:
        _fail(f"{where} repeats the key {_show(obj.repeated[0])} (each key must appear once)",
              name)


def _check_metadata_entry(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, _Object):
        _fail(f"__metadata__ must be an object of strings, got {_show(value)}")
    _check_keys(value, "__metadata__")
    for key, text in value.items():
        if not isinstance(text, str):
            _fail(f"__metadata__ value of {_show(key)} must be a string, got {_show(text)}")
        for part in (key, text):
            if not _is_unicode(part):
                _fail(f"__metadata__ entry {_show(key)} is not valid Unicode (a lone "
                      "surrogate escape)")


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: str
    shape: list[int]
    begin: int
    end: int


def _is_u64(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _MAX_USIZE  # bool is not an int here


def _nbytes(name: str, dtype: str, shape: list[int]) -> int:
    """Bytes of a dtype x shape tensor, overflowing where the reference library's u64 does."""
    count = 1
    for d in shape:
        count *= d
        if count > _MAX_USIZE:
            _fail(f"shape {shape}: its element count overflows 64 bits", name)
    bits = count * _DTYPE_BITS[dtype]
    if bits > _MAX_USIZE:
        _fail(f"shape {shape} of {dtype}: its size overflows 64 bits", name)
    if bits % 8:
        _fail(f"shape {shape} of {dtype} is {bits} bits, not a whole number of bytes", name)
    return bits // 8


def _entry(name: str, value: Any) -> _Entry:
    if not _is_unicode(name):
        _fail("is not a valid tensor name (a lone surrogate escape)", name)
    if not isinstance(value, _Object):
        _fail(f"must be an object {{dtype, shape, data_offsets}}, got {_show(value)}", name)
    _check_keys(value, "entry", name)
    missing = [f for f in _FIELDS if f not in value]
    if missing:
        _fail(f"lacks field {_show(missing[0])}: a tensor has dtype, shape and data_offsets",
              name)
    extra = [f for f in value if f not in _FIELDS]
    if extra:
        _fail(f"has unknown field {_show(extra[0])}: a tensor has exactly dtype, shape and "
              "data_offsets", name)
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPE_BITS:
        _fail(f"has unknown dtype {_show(dtype)} (known: {', '.join(_DTYPE_BITS)})", name)
    if not isinstance(shape, list) or not all(_is_u64(d) for d in shape):
        _fail(f"shape must be a list of non-negative integers, got {_show(shape)}", name)
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_u64(o) for o in offsets)):
        _fail("data_offsets must be [begin, end], two non-negative integers, got "
              f"{_show(offsets)}", name)
    begin, end = offsets
    if begin > end:
        _fail(f"data_offsets [{begin}, {end}] end before they begin", name)
    nbytes = _nbytes(name, dtype, shape)
    if end - begin != nbytes:
        _fail(f"byte length {end - begin} does not match {dtype} shape {shape} ({nbytes} "
              f"bytes; data_offsets [{begin}, {end}])", name)
    return _Entry(name, dtype, shape, begin, end)


def _check_layout(entries: list[_Entry], blob_len: int) -> None:
    """The tensors' byte ranges, sorted by offset, tile the data exactly: no hole, no
    overlap, nothing after the last one."""
    pos, prev = 0, None
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        if e.begin != pos:
            where = f"[{e.begin}, {e.end}]"
            if e.begin > pos:
                _fail(f"data_offsets {where} leave a hole: the data before it ends at {pos}",
                      e.name)
            assert prev is not None  # e.begin < pos: a tensor came before it
            _fail(f"data_offsets {where} overlap tensor {_show(prev.name)} "
                  f"[{prev.begin}, {prev.end}]", e.name)
        pos, prev = e.end, e
        if pos > blob_len:
            _fail(f"offsets [{e.begin}, {e.end}] outside the data ({blob_len} bytes): the "
                  "file is truncated", e.name)
    if pos < blob_len:
        after = "the header" if prev is None else f"the data of tensor {_show(prev.name)}"
        extra = blob_len - pos
        _fail(f"{extra} trailing byte{'s' * (extra != 1)} after {after}: the tensors must "
              "cover the data exactly")


def _parse(data: bytes | bytearray | memoryview) -> tuple[list[_Entry], memoryview]:
    """The checked tensor entries (in header order) and the data blob."""
    try:
        buf = memoryview(data).cast("B")
    except TypeError:
        raise TypeError("load_safetensors: expected bytes, bytearray or a contiguous "
                        f"memoryview, got {type(data).__name__}") from None
    header, n = _header_json(buf)
    if not isinstance(header, _Object):
        _fail(f"header must be a JSON object, got {_show(header)}")
    _check_keys(header, "header")
    entries = []
    for name, value in header.items():
        if name == "__metadata__":
            _check_metadata_entry(value)
        else:
            entries.append(_entry(name, value))
    blob = buf[8 + n:]
    _check_layout(entries, len(blob))
    return entries, blob


# ---- loading ---------------------------------------------------------------------------------

def _host_array(e: _Entry, blob: memoryview) -> Any:
    try:
        return from_bytes(bytes(blob[e.begin:e.end]), e.shape, "f32")
    # e.g. 65 dims or a 2**63 dim for numpy; a zero-size N-d shape for a memoryview
    except (ValueError, TypeError, OverflowError, MemoryError) as err:
        _fail(f"shape {e.shape} cannot be held in a host array ({err})", e.name)


def load_safetensors(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Parse safetensors bytes into {name: f32 array} (numpy arrays when numpy imports).

    A file is accepted only if the reference ``safetensors`` library accepts it: the 8-byte
    header length at most 100 MB and within the file; the header UTF-8 JSON (surrounding
    whitespace allowed), an object whose ``"__metadata__"`` (optional, may be null) maps
    strings to strings and whose every other key names a tensor {dtype, shape,
    data_offsets}; dtype one of the reference's (F32, F16, BF16, I64, ..., F4);
    shape a list of non-negative integers (not bools, floats or -0); data_offsets
    [begin, end] with begin <= end and end - begin == dtype size x prod(shape), with no
    64-bit overflow; the tensors, sorted by offset, cover the data exactly: no hole, no
    overlap, no trailing byte (zero-size tensors may share an offset). Stricter than the
    reference, so that nothing is silently lost: a key repeated anywhere, a field other
    than those three, a tensor entry written as a JSON array, or an F32 shape no host
    array can hold (numpy: more than 64 dims) is refused.
    Integer and bool tensors are skipped (:func:`load_safetensors_with_skipped` lists
    them); any other dtype than F32 is refused. The metadata is checked, not returned.

    Every refusal raises :class:`~tensorgrad.errors.SafetensorsError` (a ValueError)
    naming the tensor, when there is one, and the rule broken."""
    tensors, _ = load_safetensors_with_skipped(data)
    return tensors


def load_safetensors_with_skipped(data: bytes | bytearray | memoryview
                                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """Like :func:`load_safetensors`, also returning {name: dtype} of skipped int tensors."""
    entries, blob = _parse(data)
    for e in entries:
        if e.dtype != "F32" and e.dtype not in _SKIPPED_INT_DTYPES:
            _fail(f"has dtype {e.dtype}; tensorgrad is f32-only (integer and bool tensors "
                  "are skipped, other dtypes refused)", e.name)
    tensors: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for e in entries:
        if e.dtype == "F32":
            tensors[e.name] = _host_array(e, blob)
        else:
            skipped[e.name] = e.dtype
    return tensors, skipped
