"""The catalogue of bad inputs, CPython layer: mistakes found while tracing and compiling (no
GPU needed) and bad checkpoint files. Each row names what the user did, the exception and
the message they get; runtime mistakes are in tests/native/test_bad_inputs.py and
browser-only ones in tests/browser/test_bad_inputs.py."""

from __future__ import annotations

import asyncio
import json
import struct
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.compiler import Options, Request, compile_graph
from tensorgrad.errors import ShapeError, TraceError


class MLP(tg.Module):
    def __init__(self) -> None:
        self.l1 = tg.Linear(2, 4)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l1(x)


class NoParams(tg.Module):
    pass


class Top(tg.Module):  # a top-level param 'w' (an input can clash with it)
    def __init__(self) -> None:
        self.w = self.param((2,))


class GrowsInForward(tg.Module):
    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return x @ self.param((2, 2))


def mse(m: tg.Module, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(m(x) - y))


INPUTS = {"x": (3, 2), "y": (3, 4)}


def training(model: tg.Module, loss: Callable[..., Any] = mse, inputs: Any = INPUTS,
             optimizer: Any = None) -> Callable[[], Any]:
    """Compile through the optimizer stage (no device needed)."""
    return lambda: compile_graph(
        Request("training", model, loss, inputs, optimizer=optimizer or tg.optim.SGD(lr=0.1)),
        Options(), until="optimizer")


def compiling(**changes: Any) -> Callable[[], Any]:
    """The user's ``await tg.compile(...)`` with these arguments changed (it fails before it
    asks for a device)."""
    kwargs = {"model": MLP(), "loss": mse, "inputs": INPUTS, "optimizer": tg.optim.SGD(lr=0.1),
              **changes}
    return lambda: asyncio.run(tg.compile(**kwargs))


def forward_compiling(**changes: Any) -> Callable[[], Any]:
    kwargs = {"model": MLP(), "forward": lambda m, x: m(x), "inputs": {"x": (None, 2)},
              **changes}
    return lambda: asyncio.run(tg.compile_forward(**kwargs))


class Weighted(tg.Module):
    """One param of three values with the given init."""

    def __init__(self, init: Any, dtype: str = "f32") -> None:
        self.w = self.param((3,), init=init, dtype=dtype)


class Layers(tg.Module):
    """Layers in a list that (by mistake) contains itself, or a dict that does."""

    def __init__(self, container: str) -> None:
        self.first = tg.Linear(2, 4)
        if container == "list":
            self.layers = [tg.Linear(4, 4)]
            self.layers.append(self.layers)
        else:
            self.blocks = {"a": {"fc": tg.Linear(4, 4)}}
            self.blocks["a"]["again"] = self.blocks


def safetensors_file(header: Any, blob: bytes = b"", raw_header: bytes | None = None) -> bytes:
    head = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + blob


GOOD = tg.save_safetensors({"w": np.arange(6, dtype=np.float32).reshape(2, 3)})


@dataclass(frozen=True)
class Bad:
    what: str
    call: Callable[[], Any]
    error: type[BaseException]
    message: str  # a regex searched in str(error)


def unscalar_loss(m, x, y):
    return tg.square(m(x) - y)


def int_loss(m, x, y):
    return tg.argmax(tg.reshape(m(x), (12,)), -1)


def indexing_loss(m, x, y):
    return tg.mean(m(x)[0])


def wrong_signature(m, x, z):
    return tg.mean(m(x))


CATALOGUE = [
    Bad("a loss that is not a scalar", training(MLP(), unscalar_loss), ShapeError,
        r"^loss: the loss function must return a scalar \(0-d\) tensor, got f32\[3, 4\]; "
        r"reduce it with tg\.mean or tg\.sum"),
    Bad("an integer loss", training(MLP(), int_loss), ShapeError,
        r"^loss: the loss must be f32, got i32\[\]"),
    Bad("indexing a tensor with []", training(MLP(), indexing_loss), TypeError,
        r"^a traced Tensor cannot be indexed with \[\] \(got \[0\] on shape \[3, 4\]\): use "
        r"tg\.narrow"),
    Bad("a model with no params", training(NoParams(), lambda m, x, y: tg.mean(x - 1.0)),
        TraceError, r"^compile: the model has no f32 params, so there is nothing to train "
        r"\(its params: none\)"),
    Bad("a param created in forward", training(GrowsInForward(), lambda m, x, y: tg.mean(m(x))),
        TraceError, r"GrowsInForward\.param\(\[2, 2\]\) was called while tracing: params must "
        r"be declared in __init__"),
    Bad("a zero-size dim", training(MLP(), inputs={"x": (0, 2), "y": (3, 4)}), ShapeError,
        r"^trace: input 'x': dims must be positive ints, got \[0, 2\]"),
    Bad("a None dim in a training input", training(MLP(), inputs={"x": (None, 2), "y": (3, 4)}),
        ShapeError, r"^trace: input 'x' has an unresolved None dim in \[None, 2\]: training "
        r"inputs must be fully concrete"),
    Bad("an unknown input dtype", training(MLP(), inputs={"x": ((3, 2), "f16"), "y": (3, 4)}),
        ShapeError, r"^trace: input 'x': dtype must be 'f32' or 'i32', got 'f16'"),
    Bad("an input name that is no identifier", training(MLP(), inputs={"x-1": (3, 2)}),
        ShapeError, r"^trace: input name 'x-1' must be a Python identifier"),
    Bad("inputs that are not a dict", training(MLP(), inputs=[(3, 2)]), ShapeError,
        r"^trace: inputs must be a dict \{name: shape\}"),
    Bad("compile's inputs as a string", compiling(inputs="x"), ShapeError,
        r"^compile: inputs must be a dict \{name: shape\} or \{name: \(shape, dtype\)\}, e\.g\. "
        r"\{'x': \(32, 784\), 'y': \(\(32,\), 'i32'\)\}; got str 'x'"),
    Bad("compile's inputs as a number", compiling(inputs=3), ShapeError,
        r"^compile: inputs must be a dict \{name: shape\}.*; got int 3"),
    Bad("compile's inputs as None", compiling(inputs=None), ShapeError,
        r"^compile: inputs must be a dict \{name: shape\}.*; got NoneType None"),
    Bad("compile_forward's inputs as a string", forward_compiling(inputs="x"), ShapeError,
        r"^compile_forward: inputs must be a dict \{name: shape\}.*; got str 'x'"),
    Bad("a seed that is a string", compiling(seed="abc"), TypeError,
        r"^seed must be an int \(32-bit\), got 'abc' \(str\); pass an int, or None for a "
        r"random seed"),
    Bad("a seed that is a float", compiling(seed=2.5), TypeError,
        r"^seed must be an int \(32-bit\), got 2\.5 \(float\)"),
    Bad("a seed that is a bool", compiling(seed=True), TypeError,
        r"^seed must be an int \(32-bit\), got True \(bool\)"),
    Bad("compile_forward with a string seed", forward_compiling(seed="7"), TypeError,
        r"^seed must be an int \(32-bit\), got '7' \(str\)"),
    Bad("a NaN in a literal init", lambda: Weighted(tg.init.literal([1.0, float("nan"), 2.0])),
        ShapeError, r"^Weighted\.param: init\.literal holds nan at flat index 1, which is not a "
        r"finite f32 \(\|v\| <= 3\.402823e\+38\); params must start finite \(a non-finite "
        r"param makes every loss NaN, whatever the learning rate\)\n  at .*test_bad_inputs\.py"),
    Bad("a literal init beyond f32", lambda: Weighted(tg.init.literal([0.0, 1e39, 0.0])),
        ShapeError, r"^Weighted\.param: init\.literal holds 1e\+39 at flat index 1, which is "
        r"not a finite f32"),
    Bad("an infinite randn scale", lambda: tg.Linear(2, 4, init=tg.init.randn(float("inf"))),
        ShapeError, r"^Linear\.param: init\.randn\(scale=inf\) makes non-finite values \(the "
        r"scale must be finite\); params must start finite.*\n  at .*test_bad_inputs\.py"),
    Bad("a randn scale whose values overflow f32", lambda: Weighted(tg.init.randn(1e38)),
        ShapeError, r"^Weighted\.param: init\.randn\(scale=1e\+38\) makes values up to "
        r"6\.79e\+38, beyond f32's range \(3\.4e\+38\): they would be inf"),
    Bad("a NaN kaiming gain", lambda: Weighted(tg.init.kaiming(float("nan"))), ShapeError,
        r"^Weighted\.param: init\.kaiming\(gain=nan\) makes non-finite values"),
    Bad("a fractional literal for an i32 param",
        lambda: Weighted(tg.init.literal([1.5, 0, 0]), dtype="i32"), ShapeError,
        r"^Weighted\.param: init\.literal holds 1\.5 at flat index 0, which is not an i32 "
        r"\(a whole number in -2147483648\.\.2147483647\)\n  at "),
    Bad("a non-finite init spec at compile (a ParamSpec made by hand)",
        lambda: tg.init.init_params([tg.init.ParamSpec("enc.w", (4,),
                                                       init=tg.init.Randn(float("nan")))], 0),
        ShapeError, r"^param 'enc\.w': init\.randn\(scale=nan\) makes non-finite values"),
    Bad("a list of layers that contains itself", lambda: Layers("list").param_names(),
        ValueError, r"^Layers: 'layers\.1' is the list 'layers' again, which contains itself: "
        r"a reference cycle through lists, tuples and dicts has no finite param names"),
    Bad("a dict of layers that contains itself", training(Layers("dict")), ValueError,
        r"^Layers: 'blocks\.a\.again' is the dict 'blocks' again, which contains itself"),
    Bad("exporting with a weight in PyTorch's [out, in] layout",
        lambda: tg.export.torch(MLP(), inputs={"x": (None, 2)}, params={
            "l1.W": np.zeros((4, 2), np.float32), "l1.b": np.zeros(4, np.float32)}),
        ShapeError, r"^param 'l1\.W': got \[4, 2\], the transpose of \[2, 4\]: pass w\.T \(a "
        r"PyTorch Linear weight is \[out, in\]; tensorgrad's Linear weight is \[in, out\]\)"),
    Bad("input names that do not match the loss", training(MLP(), wrong_signature),
        TraceError, r"input name mismatch: the loss function wrong_signature\(m, x, z\) is "
        r"called as \(model, x=\.\.\., y=\.\.\.\), but it requires \['z'\]"),
    Bad("an input named like a param",
        training(Top(), lambda m, w: tg.mean(w), inputs={"w": (2,)}), TraceError,
        r"^input 'w' has the same name as a param; rename the input"),
    Bad("a shape mismatch inside the model", training(MLP(), inputs={"x": (3, 5), "y": (3, 4)}),
        ShapeError, r"^matmul: .*\[3, 5\].*\[2, 4\]"),
    Bad("an optimizer that is not a config", training(MLP(), optimizer="adam"), TypeError,
        r"^append_optimizer: expected an optim\.Adam, AdamW or SGD config, got str"),
    Bad("a negative learning rate", lambda: tg.optim.Adam(lr=-0.1), ValueError,
        r"^Adam: lr must be >= 0 \(a learning rate\), got -0\.1"),
    Bad("a NaN learning rate", lambda: tg.optim.SGD(lr=float("nan")), ValueError,
        r"^SGD: lr must be finite, got nan"),
    Bad("a schedule with a negative peak", lambda: tg.lr.linear(-1.0, 0.0, 10), ValueError,
        r"^lr\.linear: peak must be >= 0 \(a learning rate\), got -1\.0"),
    Bad("an optimizer as plain data of an unknown kind",
        lambda: tg.optim.from_dict({"kind": "lamb", "lr": 0.1}), ValueError,
        r"^unknown optimizer kind 'lamb' \(known: \['adam', 'adamw', 'sgd'\]\)"),
    Bad("a truncated safetensors file", lambda: tg.load_safetensors(GOOD[:-5]), ValueError,
        r"^safetensors: 'w' offsets \[0, 24\] outside the"),
    Bad("a safetensors file shorter than its length field", lambda: tg.load_safetensors(b"\0" * 4),
        ValueError, r"^safetensors: buffer too small \(4 bytes\)"),
    Bad("a safetensors header longer than the file",
        lambda: tg.load_safetensors(struct.pack("<Q", 10**6) + b"{}"), ValueError,
        r"^safetensors: header length 1000000 exceeds buffer \(10 bytes\)"),
    Bad("a safetensors header that is not JSON",
        lambda: tg.load_safetensors(safetensors_file(None, raw_header=b"{nope")), ValueError,
        r"^safetensors: header is not valid JSON"),
    Bad("a safetensors file of f16 weights",
        lambda: tg.load_safetensors(safetensors_file(
            {"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4)),
        ValueError, r"^safetensors: 'w' has dtype F16; tensorgrad is"),
    Bad("a safetensors shape that does not match its bytes",
        lambda: tg.load_safetensors(safetensors_file(
            {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)),
        ValueError, r"^safetensors: 'w' byte length 8 does not"),
    Bad("saving f64 weights", lambda: tg.save_safetensors({"w": np.zeros(2)}), TypeError,
        r"^save_safetensors: 'w' is float64; only float32"),
]
@pytest.mark.parametrize("bad", CATALOGUE, ids=[b.what for b in CATALOGUE])
def test_bad_input_is_a_clear_error(bad: Bad) -> None:
    with pytest.raises(bad.error, match=bad.message):
        bad.call()


def test_a_python_error_in_the_model_points_at_the_users_line() -> None:
    class Broken(tg.Module):
        def __init__(self) -> None:
            self.l = tg.Linear(2, 4)

        def forward(self, x: tg.Tensor) -> tg.Tensor:
            return self.l(x) + undefined_name  # noqa: F821 - the user's bug

    with pytest.raises(NameError) as info:
        training(Broken())()
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert last.filename == __file__ and last.name == "forward"
    assert "undefined_name" in last.line


def test_the_catalogue_is_long_enough() -> None:
    assert len(CATALOGUE) >= 20
