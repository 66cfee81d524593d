"""Checkpoints in the safetensors format (f32 tensors), without numpy.

Layout: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape,
data_offsets: [start, end]}} (offsets relative to the data blob), then the blob.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from math import prod
from typing import Any

from .hostdata import from_bytes, numpy_or_none

_SKIPPED_INT_DTYPES = {"I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL"}


def _shape_of(value: Any) -> list[int]:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return [int(d) for d in shape]
    view = memoryview(value)
    return list(view.shape) if view.ndim else []


def save_safetensors(params: Mapping[str, Any], metadata: Mapping[str, str] | None = None
                     ) -> bytes:
    """Serialize {name: f32 array or buffer} to safetensors bytes (names sorted)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    np = numpy_or_none()
    for name in sorted(params):
        value = params[name]
        if np is not None and isinstance(value, np.ndarray):
            if value.dtype != np.float32:
                raise TypeError(f"save_safetensors: '{name}' is {value.dtype}; only float32 "
                                "tensors are supported")
            data = np.ascontiguousarray(value).tobytes()
        else:
            view = memoryview(value)
            if view.format.lstrip("@=<") != "f":
                raise TypeError(f"save_safetensors: '{name}' has buffer format "
                                f"'{view.format}'; only f32 is supported")
            data = view.tobytes()
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


def load_safetensors(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Parse safetensors bytes into {name: f32 array} (numpy arrays when numpy imports).

    Integer and bool tensors are skipped (:func:`load_safetensors_with_skipped` lists them);
    any other dtype than F32 raises."""
    tensors, _ = load_safetensors_with_skipped(data)
    return tensors


def load_safetensors_with_skipped(data: bytes | bytearray | memoryview
                                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """Like :func:`load_safetensors`, also returning {name: dtype} of skipped int tensors."""
    buf = memoryview(data).cast("B")
    if len(buf) < 8:
        raise ValueError(f"safetensors: buffer too small ({len(buf)} bytes)")
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise ValueError(f"safetensors: header length {n} exceeds buffer ({len(buf)} bytes)")
    try:
        header = json.loads(bytes(buf[8: 8 + n]))
    except ValueError as e:
        raise ValueError(f"safetensors: header is not valid JSON ({e})") from None
    blob = buf[8 + n:]
    tensors: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = entry["dtype"], [int(d) for d in entry["shape"]]
        start, end = entry["data_offsets"]
        if not 0 <= start <= end <= len(blob):
            raise ValueError(f"safetensors: '{name}' offsets [{start}, {end}] outside the "
                             f"data ({len(blob)} bytes)")
        if dtype in _SKIPPED_INT_DTYPES:
            skipped[name] = dtype
            continue
        if dtype != "F32":
            raise ValueError(f"safetensors: '{name}' has dtype {dtype}; tensorgrad is "
                             "f32-only")
        if end - start != 4 * prod(shape):
            raise ValueError(f"safetensors: '{name}' byte length {end - start} does not "
                             f"match shape {shape} ({4 * prod(shape)} bytes)")
        tensors[name] = from_bytes(bytes(blob[start:end]), shape, "f32")
    return tensors, skipped
