"""Checkpoints: bit-exact round trips, and a loader exactly as strict as the reference
``safetensors`` library (differential tests against it, byte-built files and a fuzz test)."""

from __future__ import annotations

import array
import json
import os
import re
import struct
import tempfile
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorgrad as tg
from tensorgrad.safetensors import load_safetensors, load_safetensors_with_skipped, save_safetensors


def _raw(header: dict, blob: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + blob


def _file(header: bytes, blob: bytes = b"") -> bytes:
    """A file from its header text exactly as given (length prefix, header, data)."""
    return struct.pack("<Q", len(header)) + header + blob


def _reference(data: bytes) -> dict[str, tuple[str, list[int], bytes]]:
    """{name: (dtype, shape, raw bytes)} as the reference library reads `data` (it raises
    safetensors.SafetensorError on a malformed file)."""
    return {name: (v["dtype"], list(v["shape"]), bytes(v["data"]))
            for name, v in safetensors.deserialize(data)}


def _reference_file_rejects(data: bytes) -> bool:
    """Whether safe_open (the reference's file reader) refuses `data` too."""
    with tempfile.NamedTemporaryFile(suffix=".safetensors", delete=False) as f:
        f.write(data)
    try:
        with safetensors.safe_open(f.name, "np") as handle:
            list(handle.keys())
        return False
    except safetensors.SafetensorError:
        return True
    finally:
        os.unlink(f.name)


def test_round_trip_is_bit_exact() -> None:
    rng = np.random.default_rng(0)
    params = {"blocks.0.W": rng.standard_normal((3, 4)).astype(np.float32),
              "b": np.array([np.float32(1e-38), -0.0, np.inf, 3.5], np.float32),
              "scalar": np.array(2.5, np.float32)}
    out = load_safetensors(save_safetensors(params))
    assert set(out) == set(params)
    for k, v in params.items():
        assert out[k].shape == v.shape
        assert out[k].tobytes() == v.tobytes()


def test_buffers_without_numpy_types() -> None:
    out = load_safetensors(save_safetensors({"x": array.array("f", [1.0, 2.0, 3.0])}))
    np.testing.assert_array_equal(out["x"], [1.0, 2.0, 3.0])


def test_metadata_ignored_and_ints_skipped() -> None:
    blob = struct.pack("<3f", 1, 2, 3) + struct.pack("<q", 7)
    data = _raw({"__metadata__": {"format": "pt"},
                 "w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                 "step": {"dtype": "I64", "shape": [], "data_offsets": [12, 20]}}, blob)
    tensors, skipped = load_safetensors_with_skipped(data)
    assert list(tensors) == ["w"] and skipped == {"step": "I64"}
    np.testing.assert_array_equal(tensors["w"], [1, 2, 3])


@pytest.mark.parametrize("data, match", [
    (b"\x01\x02", "too small"),
    (struct.pack("<Q", 1000) + b"{}", "exceeds buffer"),
    (_raw({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}, bytes(4)), "f32-only"),
    (_raw({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8)),
     "byte length"),
    (_raw({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}, bytes(4)),
     "outside the data"),
    (struct.pack("<Q", 3) + b"{x]", "not valid JSON"),
])
def test_malformed(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_safetensors(data)


def test_rejects_non_f32() -> None:
    with pytest.raises(TypeError, match="only float32"):
        save_safetensors({"x": np.zeros(3, np.float64)})


# ---- files the reference library refuses: tensorgrad refuses each with SafetensorsError -------

W = b'"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'  # a good tensor entry, 4 bytes


def _one(entry: bytes, blob: bytes = bytes(4)) -> bytes:
    """A file whose header holds the single tensor 'w' with `entry` as its JSON value."""
    return _file(b'{"w":' + entry + b"}", blob)


REJECTED = [  # (what, file, regex of tensorgrad's message)
    ("a hole between tensors",
     _file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
           b'"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', bytes(12)),
     r"^safetensors: 'b' data_offsets \[8, 12\] leave a hole: the data before it ends at 4$"),
    ("a hole before the first tensor",
     _one(b'{"dtype":"F32","shape":[1],"data_offsets":[4,8]}', bytes(8)),
     r"^safetensors: 'w' data_offsets \[4, 8\] leave a hole"),
    ("overlapping tensors",
     _file(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
           b'"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)),
     r"^safetensors: 'b' data_offsets \[4, 8\] overlap tensor 'a' \[0, 8\]"),
    ("two tensors on the same bytes",
     _file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
           b'"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4)),
     r"^safetensors: 'b' data_offsets \[0, 4\] overlap tensor 'a' \[0, 4\]"),
    ("trailing bytes after the last tensor", _file(b"{" + W + b"}", bytes(5)),
     r"^safetensors: 1 trailing byte after the data of tensor 'w': the tensors must cover"),
    ("data but no tensor", _file(b"{}", bytes(4)),
     r"^safetensors: 4 trailing bytes after the header"),
    ("a bool dim", _one(b'{"dtype":"F32","shape":[true],"data_offsets":[0,4]}'),
     r"^safetensors: 'w' shape must be a list of non-negative integers, got \[true\]$"),
    ("a float dim", _one(b'{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}'),
     r"^safetensors: 'w' shape must be a list of non-negative integers, got \[1\.0\]$"),
    ("a dim written -0", _one(b'{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}', b""),
     r"^safetensors: 'w' shape must be .* got \[-0\.0\]$"),
    ("a string dim", _one(b'{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}'),
     r"^safetensors: 'w' shape must be .* got \[\"1\"\]$"),
    ("a shape that is not a list", _one(b'{"dtype":"F32","shape":4,"data_offsets":[0,4]}'),
     r"^safetensors: 'w' shape must be a list .* got 4$"),
    ("a null shape", _one(b'{"dtype":"F32","shape":null,"data_offsets":[0,4]}'),
     r"^safetensors: 'w' shape must be a list .* got null$"),
    ("a dim of 2**64", _one(b'{"dtype":"F32","shape":[18446744073709551616,0],'
                            b'"data_offsets":[0,0]}', b""),
     r"^safetensors: 'w' shape must be a list of non-negative integers"),
    ("three data_offsets", _one(b'{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}'),
     (r"^safetensors: 'w' data_offsets must be \[begin, end\], two non-negative integers, "
     r"got \[0, 4, 4\]$")),
    ("data_offsets as an object",
     _one(b'{"dtype":"F32","shape":[1],"data_offsets":{"begin":0,"end":4}}'),
     r"^safetensors: 'w' data_offsets must be \[begin, end\]"),
    ("a float offset", _one(b'{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}'),
     r"^safetensors: 'w' data_offsets must be .* got \[0, 4\.0\]$"),
    ("data_offsets that end before they begin",
     _one(b'{"dtype":"F32","shape":[1],"data_offsets":[4,0]}'),
     r"^safetensors: 'w' data_offsets \[4, 0\] end before they begin"),
    ("a byte length that is not dtype size x shape",
     _file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}}', bytes(8)),
     r"^safetensors: 'a' byte length 8 does not match F32 shape \[1\] \(4 bytes"),
    ("a skipped int tensor of the wrong length",
     _file(b'{"n":{"dtype":"I64","shape":[],"data_offsets":[0,4]}}', bytes(4)),
     r"^safetensors: 'n' byte length 4 does not match I64 shape \[\] \(8 bytes"),
    ("sub-byte F4 elements that do not fill a byte",
     _one(b'{"dtype":"F4","shape":[3],"data_offsets":[0,1]}', bytes(1)),
     r"^safetensors: 'w' shape \[3\] of F4 is 12 bits, not a whole number of bytes$"),
    ("an element count past 64 bits",
     _one(b'{"dtype":"F32","shape":[9223372036854775808,9223372036854775808,0],'
          b'"data_offsets":[0,0]}', b""),
     (r"^safetensors: 'w' shape \[9223372036854775808, 9223372036854775808, 0\]: its element "
     r"count overflows 64 bits$")),
    ("a byte size past 64 bits",
     _one(b'{"dtype":"F32","shape":[576460752303423488],"data_offsets":[0,0]}', b""),
     r"^safetensors: 'w' shape \[576460752303423488\] of F32: its size overflows 64 bits$"),
    ("a lower-case dtype", _one(b'{"dtype":"f32","shape":[1],"data_offsets":[0,4]}'),
     r"^safetensors: 'w' has unknown dtype 'f32' \(known: BOOL, F4, .*F32"),
    ("a dtype that is not a string", _one(b'{"dtype":32,"shape":[1],"data_offsets":[0,4]}'),
     r"^safetensors: 'w' has unknown dtype 32 "),
    ("an entry without dtype", _one(b'{"shape":[1],"data_offsets":[0,4]}'),
     r"^safetensors: 'w' lacks field 'dtype': a tensor has dtype, shape and data_offsets$"),
    ("an entry without data_offsets", _one(b'{"dtype":"F32","shape":[1]}'),
     r"^safetensors: 'w' lacks field 'data_offsets'"),
    ("a field given twice", _one(b'{"dtype":"F32","dtype":"F32","shape":[1],'
                                 b'"data_offsets":[0,4]}'),
     r"^safetensors: 'w' entry repeats the key 'dtype' \(each key must appear once\)$"),
    ("an entry that is a number", _one(b"7"),
     r"^safetensors: 'w' must be an object \{dtype, shape, data_offsets\}, got 7$"),
    ("a tensor named __metadata__",
     _file(b'{"__metadata__":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4)),
     r"^safetensors: __metadata__ value of 'shape' must be a string, got \[1\]$"),
    ("__metadata__ given twice", _file(b'{"__metadata__":{},"__metadata__":{}}'),
     r"^safetensors: header repeats the key '__metadata__'"),
    ("a metadata value that is a number", _file(b'{"__metadata__":{"epoch":3}}'),
     r"^safetensors: __metadata__ value of 'epoch' must be a string, got 3$"),
    ("metadata that is a string", _file(b'{"__metadata__":"pt"}'),
     r"^safetensors: __metadata__ must be an object of strings, got 'pt'$"),
    ("a tensor name with a lone surrogate escape",
     _file(b'{"\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4)),
     r"^safetensors: '\\ud800' is not a valid tensor name \(a lone surrogate escape\)$"),
    ("a metadata value with a lone surrogate escape",
     _file(b'{"__metadata__":{"k":"\\udc00"}}'),
     r"^safetensors: __metadata__ entry 'k' is not valid Unicode"),
    ("a header that is a JSON array", _file(b"[]"),
     r"^safetensors: header must be a JSON object, got \[\]$"),
    ("a header that is null", _file(b"null"),
     r"^safetensors: header must be a JSON object, got null$"),
    ("a NaN in the header", _file(b'{"__metadata__":{"a":NaN}}'),
     r"^safetensors: header is not valid JSON \(NaN is not JSON\)$"),
    ("a UTF-8 byte order mark", _file(b"\xef\xbb\xbf{}"),
     r"^safetensors: header is not valid JSON"),
    ("a header that is not UTF-8", _file(b'{"\xff":1}'),
     r"^safetensors: header is not valid UTF-8 \("),
    ("a NUL byte after the header's JSON", _file(b"{}\x00"),
     r"^safetensors: header is not valid JSON \(Extra data"),
    ("an empty header", _file(b""), r"^safetensors: header is not valid JSON \(Expecting value"),
    ("JSON nested 100000 deep", _file(b"[" * 100_000 + b"]" * 100_000),
     r"^safetensors: header is not valid JSON \(nested too deeply\)$"),
    ("a header length past the 100 MB limit", struct.pack("<Q", 100_000_001) + b"{}",
     r"^safetensors: header length 100000001 exceeds the limit of 100000000 bytes$"),
    ("a header length of 2**64-1", struct.pack("<Q", 2**64 - 1) + b"{}",
     r"^safetensors: header length 18446744073709551615 exceeds the limit"),
]


@pytest.mark.parametrize("data, match", [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED])
def test_reference_rejects_and_so_does_tensorgrad(data: bytes, match: str) -> None:
    with pytest.raises(safetensors.SafetensorError):
        _reference(data)
    assert _reference_file_rejects(data)
    with pytest.raises(tg.SafetensorsError, match=match):
        load_safetensors_with_skipped(data)


# ---- files the reference reads but tensorgrad refuses, by a documented rule ----------------

STRICTER = [  # (what, file, regex): each would lose or misread something if accepted
    ("a tensor name given twice (the reference keeps the last)",
     _file(b"{" + W + b"," + W + b"}", bytes(4)),
     r"^safetensors: header repeats the key 'w' \(each key must appear once\)$"),
    ("a metadata key given twice", _file(b'{"__metadata__":{"a":"1","a":"2"}}'),
     r"^safetensors: __metadata__ repeats the key 'a'"),
    ("a field the format does not have (the reference ignores it)",
     _one(b'{"dtype":"F32","shape":[1],"data_offsets":[0,4],"scale":2}'),
     (r"^safetensors: 'w' has unknown field 'scale': a tensor has exactly dtype, shape and "
     r"data_offsets$")),
    ("an entry written as a JSON array (the reference reads it by position)",
     _one(b'["F32",[1],[0,4]]'),
     (r"^safetensors: 'w' must be an object \{dtype, shape, data_offsets\}, got "
     r"\[\"F32\", \[1\], \[0, 4\]\]$")),
    ("an F32 tensor no host array can hold (65 dims)",
     _one(b'{"dtype":"F32","shape":[' + b",".join([b"1"] * 65) + b'],"data_offsets":[0,4]}'),
     r"^safetensors: 'w' shape \[1, 1, .* cannot be held in a host array"),
    ("an F4 tensor", _one(b'{"dtype":"F4","shape":[2],"data_offsets":[0,1]}', bytes(1)),
     r"^safetensors: 'w' has dtype F4; tensorgrad is f32-only"),
]


@pytest.mark.parametrize("data, match", [c[1:] for c in STRICTER], ids=[c[0] for c in STRICTER])
def test_stricter_than_the_reference_where_documented(data: bytes, match: str) -> None:
    _reference(data)  # reads it
    with pytest.raises(tg.SafetensorsError, match=match):
        load_safetensors_with_skipped(data)


# ---- files both read: tensorgrad reads what the reference reads -------------------------------

ACCEPTED = [
    ("no tensors", _file(b"{}")),
    ("whitespace around the header's JSON", _file(b" \n{" + W + b"}\t\r  ", bytes(4))),
    ("null metadata", _file(b'{"__metadata__":null,' + W + b"}", bytes(4))),
    ("an empty tensor name", _file(b'{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
                                   bytes(8))),
    ("zero-size tensors sharing an offset",
     _file(b'{"a":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},'
           b'"b":{"dtype":"I64","shape":[0],"data_offsets":[4,4]},' + W + b"}", bytes(4))),
    ("a 0-d tensor", _one(b'{"dtype":"F32","shape":[],"data_offsets":[0,4]}')),
    ("unaligned offsets after a skipped U8 tensor",
     _file(b'{"m":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]},'
           b'"w":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}}', b"\x01\x00\x00\x80\x3f")),
    ("escaped names, fields and dtypes",
     _file(b'{"\\u0077\\ud83d\\ude00\\u0000":{"\\u0064type":"F\\u0033\\u0032",'
           b'"shape":[1],"data_offsets":[0,4]}}', struct.pack("<f", 1.5))),
    ("entries out of offset order", _file(
        b'{"z":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},'
        b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', struct.pack("<2f", 1, 2))),
    ("a zero-size tensor with a 2**63 dim after its 0",
     _one(b'{"dtype":"I32","shape":[0,9223372036854775808,9223372036854775808],'
          b'"data_offsets":[0,0]}', b"")),
]


def _assert_same_as_reference(data: bytes) -> None:
    """tensorgrad loads from `data` exactly the F32 tensors (names, shapes, bytes) and the
    skipped int/bool tensors that the reference reads."""
    ref = _reference(data)
    tensors, skipped = load_safetensors_with_skipped(data)
    assert skipped == {n: dt for n, (dt, _, _) in ref.items() if dt != "F32"}
    assert set(tensors) == {n for n, (dt, _, _) in ref.items() if dt == "F32"}
    for name, arr in tensors.items():
        _, shape, raw = ref[name]
        assert list(arr.shape) == shape and arr.dtype == np.float32
        assert arr.tobytes() == raw, name


@pytest.mark.parametrize("data", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_reads_what_the_reference_reads(data: bytes) -> None:
    _assert_same_as_reference(data)


def test_reference_writer_files_load() -> None:
    rng = np.random.default_rng(1)
    data = safetensors.numpy.save(
        {"w": rng.standard_normal((2, 3)).astype(np.float32), "step": np.array(5, np.int64),
         "mask": np.array([True, False]), "empty": np.zeros((0, 4), np.float32)},
        metadata={"format": "np"})
    _assert_same_as_reference(data)
    assert sorted(load_safetensors(data)) == ["empty", "w"]


def test_saved_files_load_in_the_reference_with_their_metadata() -> None:
    params = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "": np.float32([1]),
              "é/😀": np.zeros((0, 2), np.float32)}
    data = save_safetensors(params, metadata={"format": "pt", "note": "ünï"})
    out = safetensors.numpy.load(data)
    assert {k: v.tobytes() for k, v in out.items()} == {k: v.tobytes() for k, v in params.items()}
    path = tempfile.mktemp(suffix=".safetensors")
    with open(path, "wb") as f:
        f.write(data)
    try:
        with safetensors.safe_open(path, "np") as handle:
            assert handle.metadata() == {"format": "pt", "note": "ünï"}
    finally:
        os.unlink(path)


# ---- saving refuses what could not load back as given -----------------------------------------

F = np.zeros(2, np.float32)
SAVE_REFUSED = [
    ("a tensor named __metadata__", {"__metadata__": F}, None,
     r"^save_safetensors: '__metadata__' is reserved for the header's metadata"),
    ("an int name", {1: F}, None,
     r"^save_safetensors: tensor name 1 has type int; names must be str$"),
    ("a name with a lone surrogate", {"w\ud800": F}, None,
     r"^save_safetensors: tensor name 'w\\ud800' holds a lone surrogate"),
    ("a metadata value that is an int", {"w": F}, {"epoch": 3},
     (r"^save_safetensors: metadata value 3 \(of key 'epoch'\) has type int; metadata keys and "
     r"values must be str$")),
    ("a metadata key that is an int", {"w": F}, {3: "x"},
     r"^save_safetensors: metadata key 3 \(of key 3\) has type int"),
    ("a metadata value with a lone surrogate", {"w": F}, {"k": "\udc00"},
     r"^save_safetensors: metadata value '\\udc00' holds a lone surrogate"),
    ("metadata that is a list", {"w": F}, [("k", "v")],
     r"^save_safetensors: metadata must be a mapping of str to str, got list$"),
]


@pytest.mark.parametrize("params, metadata, match", [c[1:] for c in SAVE_REFUSED],
                         ids=[c[0] for c in SAVE_REFUSED])
def test_save_refuses_what_would_not_round_trip(params: Any, metadata: Any, match: str) -> None:
    with pytest.raises(tg.SafetensorsError, match=match):
        save_safetensors(params, metadata=metadata)


# ---- fuzz: mutated valid files ----------------------------------------------------------------

# The only messages tensorgrad may refuse a file the reference reads with (the rules above).
_STRICTER_RULES = re.compile(r"repeats the key|has unknown field|must be an object \{dtype|"
                             r"tensorgrad is f32-only|cannot be held in a host array")
_NP = {"F32": np.float32, "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_, "F16": np.float16}
_TOKENS = ["-0", "0", "1", "3", "4", "8", "12", "1.0", "1e0", "true", "null", '""', '"F32"',
           '"I64"', '"F4"', '"f32"', "[]", "{}", "[0,4]", "[4,0]", '"__metadata__"', '"w"',
           "18446744073709551615", "18446744073709551616", "NaN", '"\\ud800"', ",", ":", "",
           '"extra":1,', '"shape":[1],', "[[[[1]]]]", "-1", " "]
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|[][{}:,]|true|null')


_SPECS = st.lists(st.tuples(st.text("wab.é0_", max_size=3),
                            st.sampled_from(["F32", "F32", "F32", "I64", "U8", "BOOL", "F16"]),
                            st.lists(st.integers(0, 3), max_size=3)),
                  max_size=4, unique_by=lambda spec: spec[0])
_METADATA = st.none() | st.dictionaries(st.text("kv", max_size=2), st.text("xy", max_size=2),
                                        max_size=2)


@st.composite
def _valid_file(draw: st.DrawFn) -> bytes:
    """A file written by the reference library or by tensorgrad (F32 only), with random bits
    as the tensors' values."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tensors = {name: np.frombuffer(rng.bytes(np.dtype(_NP[dtype]).itemsize * int(np.prod(shape))),
                                   np.uint8 if dtype == "BOOL" else _NP[dtype]
                                   ).astype(_NP[dtype]).reshape(shape)
               for name, dtype, shape in draw(_SPECS)}
    metadata = draw(_METADATA)
    if draw(st.booleans()) and all(t.dtype == np.float32 for t in tensors.values()):
        return save_safetensors(tensors, metadata=metadata)
    return safetensors.numpy.save(tensors, metadata=metadata)


def _mutate(data: bytes, draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["flip", "truncate", "extend", "token", "token", "token",
                                 "duplicate"]))
    n = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else len(data)
    if not data:
        return draw(st.binary(max_size=16))
    if kind in ("token", "duplicate") and 8 + n > len(data):
        kind = "flip"  # no whole header left to edit
    if kind == "flip":
        bit = draw(st.integers(0, 8 * len(data) - 1))
        return data[: bit // 8] + bytes([data[bit // 8] ^ (1 << bit % 8)]) + data[bit // 8 + 1:]
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "extend":
        return data + draw(st.binary(min_size=1, max_size=8))
    header, blob = data[8: 8 + n], data[8 + n:]
    tokens = list(_TOKEN.finditer(header))
    if not tokens:
        return data
    if kind == "token":  # replace one JSON token of the header, keeping the length right
        t = draw(st.sampled_from(tokens))
        new = draw(st.sampled_from(_TOKENS)).encode()
        header = header[: t.start()] + new + header[t.end():]
    else:  # repeat a stretch of the header (a key, a pair, an entry)
        i, j = sorted(draw(st.lists(st.integers(0, len(header)), min_size=2, max_size=2)))
        header = header[:j] + header[i:j] + header[j:]
    return _file(header, blob)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_agrees_with_the_reference(data: st.DataObject) -> None:
    """On mutated valid files tensorgrad either reads what the reference reads, or raises
    SafetensorsError: always where the reference refuses, and otherwise only by one of the
    documented stricter rules. Never another exception type."""
    blob = data.draw(_valid_file())
    for _ in range(data.draw(st.integers(1, 3))):
        blob = _mutate(blob, data.draw)
    try:
        _reference(blob)
    except safetensors.SafetensorError:
        with pytest.raises(tg.SafetensorsError):
            load_safetensors_with_skipped(blob)
        return
    try:
        _assert_same_as_reference(blob)
    except tg.SafetensorsError as e:
        assert _STRICTER_RULES.search(str(e)), f"refused a file the reference reads: {e}"
