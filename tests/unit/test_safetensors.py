"""Checkpoints: bit-exact round trips and clear errors on malformed files."""

from __future__ import annotations

import array
import json
import struct

import numpy as np
import pytest

from tensorgrad.safetensors import load_safetensors, load_safetensors_with_skipped, save_safetensors


def _raw(header: dict, blob: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + blob


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
