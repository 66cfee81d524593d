"""The catalogue of bad inputs, native layer: what a running training or forward does with
bad data, bad calls and bad timing, on the real device. Every row names what the user did
and what they get: a Failed result (step/run never raise) or an exception, with its message.
Nothing a user passed in is silently changed or lost, and nothing hangs."""

from __future__ import annotations

import array
import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.errors import DeviceLimitError, ShapeError
from tests.models import TinyMLP
from tests.native.api_helpers import B, compile_tiny, data, predict, run


class Tokens(tg.Module):
    """Embedding(5, 4) → Linear(4, 3) → cross entropy against i32 targets; a gather of the
    logits by `pick` (take_along_axis) as a second loss term."""

    def __init__(self) -> None:
        self.emb = tg.Embedding(5, 4)
        self.out = tg.Linear(4, 3)


def token_loss(m: Tokens, ids: tg.Tensor, target: tg.Tensor, pick: tg.Tensor) -> tg.Tensor:
    logits = m.out(m.emb(ids))                                     # [4, 3]
    picked = tg.take_along_axis(logits, tg.reshape(pick, (4, 1)), axis=-1)
    return tg.cross_entropy(logits, target) + tg.mean(picked)


TOKEN_INPUTS = {"ids": ((4,), "i32"), "target": ((4,), "i32"), "pick": ((4,), "i32")}


def tokens(ids=(0, 1, 2, 4), target=(0, 1, 2, 1), pick=(0, 2, 1, 0)) -> dict[str, Any]:
    return {"ids": np.array(ids, np.int32), "target": np.array(target, np.int32),
            "pick": np.array(pick, np.int32)}


def with_(**changes: Any) -> dict[str, Any]:
    d = data()
    d.update(changes)
    return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class Bad:
    what: str
    act: Callable[[tg.Training], Awaitable[Any]]   # the user's call on a fresh training
    error: type[BaseException]
    message: str                                   # a regex searched in the message
    raises: bool = False                           # raised (else: step/run returned Failed)
    model: str = "mlp"


def step(**inputs: Any) -> Callable[[tg.Training], Awaitable[Any]]:
    return lambda t: t.step(**inputs)


def run_forward(**inputs: Any) -> Callable[[tg.Training], Awaitable[Any]]:
    async def act(t: tg.Training) -> Any:
        forward = await t.attach(forward=predict, inputs={"x": (None, 2)})
        return await forward.run(**inputs)
    return act


def upload(params: Callable[[dict[str, Any]], dict[str, Any]], partial: bool = False
           ) -> Callable[[tg.Training], Awaitable[Any]]:
    async def act(t: tg.Training) -> Any:
        return await t.upload_params(params(await t.download_params()), partial=partial)
    return act


def after_destroy(call: Callable[[tg.Training], Any]) -> Callable[[tg.Training], Awaitable[Any]]:
    async def act(t: tg.Training) -> Any:
        t.destroy()
        return await call(t)
    return act


def attach_unknown_param(t: tg.Training) -> Awaitable[Any]:
    async def act() -> Any:
        forward = await t.attach(forward=lambda m, x: x @ m.extra.W, inputs={"x": (None, 2)})
        return await forward.run(x=np.zeros((1, 2), np.float32))
    return act()


X, Y = data()["x"], data()["y"]
NAN_X = X.copy()
NAN_X[1, 0] = np.nan
INF_Y = Y.copy()
INF_Y[3, 0] = -np.inf

CATALOGUE = [
    Bad("an input of a name not declared", step(x=X, z=Y), ShapeError,
        r"^step: inputs missing \['y'\] \(declared as y: \(4, 1\)\), unexpected \['z'\]; "
        r"declared inputs are \['x', 'y'\]"),
    Bad("a missing input", step(x=X), ShapeError, r"^step: inputs missing \['y'\]"),
    Bad("an extra input", step(x=X, y=Y, w=Y), ShapeError, r"^step: inputs unexpected \['w'\]"),
    Bad("an input of the wrong size", step(x=X[:3], y=Y), ShapeError,
        r"^input 'x': expected 8 elements \(shape \[4, 2\]\), got 6 \(shape \[3, 2\]\)"),
    Bad("an empty array", step(x=np.zeros(0, np.float32), y=Y), ShapeError,
        r"^input 'x': expected 8 elements \(shape \[4, 2\]\), got 0 \(shape \[0\]\)"),
    Bad("a list of the wrong length", step(x=[1.0, 2.0], y=Y), ShapeError,
        r"^input 'x': expected 8 elements = 32 bytes \(shape \[4, 2\]\), got 8 bytes"),
    Bad("a string as data", step(x="0.5", y=Y), ShapeError,
        r"^input 'x': expected a numpy array or a buffer of f32, got str"),
    Bad("a dict as data", step(x={"a": 1}, y=Y), ShapeError,
        r"^input 'x': expected a numpy array or a buffer of f32, got dict"),
    Bad("int data for an f32 input", step(x=np.ones((4, 2), np.int32), y=Y), ShapeError,
        r"^input 'x': expected f32 data, got a numpy array of int32"),
    Bad("an i32 buffer for an f32 input", step(x=memoryview(np.ones(8, np.int32)), y=Y),
        ShapeError, r"^input 'x': expected f32 data \(format 'f'\), got a buffer of format 'i'"),
    Bad("int8 data for an f32 input (4 int8s an f32's bytes: once read as raw bytes)",
        step(x=array.array("b", X.tobytes()), y=Y), ShapeError,
        r"^input 'x': expected f32 data \(format 'f'\), got a buffer of format 'b'"),
    Bad("a 2-D int8 view for an f32 input",
        step(x=memoryview(np.frombuffer(X.tobytes(), np.int8).reshape(4, 8)), y=Y),
        ShapeError, r"^input 'x': expected f32 data \(format 'f'\), got a buffer of format 'b'"),
    Bad("int8 ids for an i32 input",
        lambda t: t.step(**{**tokens(), "ids": array.array("b", [3, 0, 0, 0] * 4)}),
        ShapeError, r"^input 'ids': expected i32 data \(format 'i'\), got a buffer of format "
        r"'b'", model="tokens"),
    Bad("a NaN in the data", step(x=NAN_X, y=Y), FloatingPointError,
        r"at step 1: the update was skipped, params and optimizer state are unchanged; "
        r"input 'x' holds nan at flat index 2"),
    Bad("an Inf in the data", step(x=X, y=INF_Y), FloatingPointError,
        r"^loss is inf at step 1: the update was skipped, params and optimizer state are "
        r"unchanged; input 'y' holds -inf at flat index 3"),
    Bad("float data for an i32 input", lambda t: t.step(**{**tokens(), "ids": np.zeros(4)}),
        ShapeError, r"^input 'ids': expected i32 data, got a numpy array of float64",
        model="tokens"),
    Bad("a float list for an i32 input", lambda t: t.step(**{**tokens(), "ids": [0.5] * 4}),
        ShapeError, r"^input 'ids': expected 4 i32 numbers, got float 0\.5 at flat index 0 "
        r"\(an int is needed\)", model="tokens"),
    Bad("a list value beyond i32", lambda t: t.step(**{**tokens(), "ids": [0, 1, 2**31, 2]}),
        ShapeError, r"^input 'ids': holds 2147483648 at flat index 2, outside the i32 range "
        r"-2147483648\.\.2147483647", model="tokens"),
    Bad("a string in an f32 list", step(x=[0.5] * 7 + ["a"], y=Y), ShapeError,
        r"^input 'x': expected 8 f32 numbers, got str 'a' at flat index 7 \(a number is "
        r"needed\)"),
    Bad("a transposed input of the right size", step(x=X.T.copy(), y=Y), ShapeError,
        r"^input 'x': got \[2, 4\], the transpose of \[4, 2\]: pass x\.T"),
    Bad("an input of another shape of the right size", step(x=X, y=Y.reshape(2, 2)),
        ShapeError, r"^input 'y': got data of shape \[2, 2\] for shape \[4, 1\]: the element "
        r"counts agree but the layouts differ"),
    Bad("a transposed 2-D memoryview", step(x=memoryview(X.T.copy()), y=Y), ShapeError,
        r"^input 'x': got \[2, 4\], the transpose of \[4, 2\]"),
    Bad("a nested list of another shape", step(x=X.reshape(8, 1).tolist(), y=Y), ShapeError,
        r"^input 'x': got data of shape \[8, 1\] for shape \[4, 2\]"),
    Bad("a ragged nested list", step(x=[[0.5, 0.5]] * 3 + [[0.5]], y=Y), ShapeError,
        r"^input 'x': a ragged nested list: at depth 1, item 3 has 1 items where item 0 has 2 "
        r"items; nested lists must be rectangular"),
    Bad("a transposed forward input", run_forward(x=np.zeros((2, 3), np.float32)), ShapeError,
        r"^input 'x': got \[2, 3\], the transpose of \[3, 2\]"),
    Bad("int64 ids that do not fit i32",
        lambda t: t.step(**{**tokens(), "ids": np.array([0, 1, 2, 2**40])}), ShapeError,
        r"^input 'ids': a int64 array with values 0\.\.1099511627776 does not fit i32",
        model="tokens"),
    Bad("an embedding id past the vocabulary", step(**tokens(ids=(0, 1, 5, 2))), ShapeError,
        r"^input 'ids': holds 5 at flat index 2, outside 0\.\.4 as embedding\(vocab=5\) at .* "
        r"needs", model="tokens"),
    Bad("a negative embedding id", step(**tokens(ids=(-1, 1, 2, 2))), ShapeError,
        r"^input 'ids': holds -1 at flat index 0, outside 0\.\.4", model="tokens"),
    Bad("a cross-entropy target out of range", step(**tokens(target=(0, 3, 1, 1))), ShapeError,
        r"^input 'target': holds 3 at flat index 1, outside 0\.\.2", model="tokens"),
    Bad("a cross-entropy target of -1 (its ignore_index is -100)",
        step(**tokens(target=(0, 1, -1, -100))), ShapeError,
        r"^input 'target': holds -1 at flat index 2, outside 0\.\.2 or -100 as "
        r"one_hot\(depth=3, ignore_index=-100\) at .*test_bad_inputs\.py:\d+ in token_loss needs",
        model="tokens"),
    Bad("every cross-entropy target ignored (-100)", step(**tokens(target=(-100,) * 4)),
        FloatingPointError,
        r"^loss is nan at step 1: the update was skipped, params and optimizer state are "
        r"unchanged; input 'target' holds only -100, the ignore_index of one_hot\(depth=3, "
        r"ignore_index=-100\) at .*test_bad_inputs\.py:\d+ in token_loss: a 'mean' over no counted target "
        r"is 0/0 = nan, as in PyTorch \(give each batch a target that is not ignored, or use "
        r"reduction='sum'\)$", model="tokens"),
    Bad("a take_along_axis index out of range", step(**tokens(pick=(0, 0, 0, 7))), ShapeError,
        r"^input 'pick': holds 7 at flat index 3, outside 0\.\.2", model="tokens"),
    Bad("a forward input of a size no None dim resolves", run_forward(x=np.zeros(5, np.float32)),
        ShapeError, r"^inputs: input 'x' has 5 elements, which is not a positive multiple of 2"),
    Bad("a forward run without its input", run_forward(), ShapeError,
        r"^run: inputs missing \['x'\]"),
    Bad("a forward that uses a param the model lacks", attach_unknown_param, AttributeError,
        r"'TinyMLP' object has no attribute 'extra'"),
    Bad("uploading an unknown param", upload(lambda p: {**p, "l3.W": p["l1.W"]}), KeyError,
        r"upload_params: unknown param\(s\) \['l3\.W'\]; the model has \['l1\.W', 'l1\.b', "
        r"'l2\.W', 'l2\.b'\]", raises=True),
    Bad("uploading some params without partial=True",
        upload(lambda p: {"l1.W": p["l1.W"]}), KeyError,
        r"upload_params: missing param\(s\) \['l1\.b', 'l2\.W', 'l2\.b'\] \(pass partial=True",
        raises=True),
    Bad("uploading a param of the wrong shape",
        upload(lambda p: {"l1.W": np.zeros((3, 8), np.float32)}, partial=True), ShapeError,
        r"^upload_params 'l1\.W': expected 16 elements \(shape \[2, 8\]\), got 24",
        raises=True),
    Bad("uploading a weight in PyTorch's [out, in] layout",
        upload(lambda p: {"l1.W": p["l1.W"].T.copy()}, partial=True), ShapeError,
        r"^upload_params 'l1\.W': got \[8, 2\], the transpose of \[2, 8\]: pass w\.T \(a "
        r"PyTorch Linear weight is \[out, in\]; tensorgrad's Linear weight is \[in, out\]\)",
        raises=True),
    Bad("uploading a param of another shape of the right size",
        upload(lambda p: {"l1.W": p["l1.W"].reshape(4, 4)}, partial=True), ShapeError,
        r"^upload_params 'l1\.W': got data of shape \[4, 4\] for shape \[2, 8\]",
        raises=True),
    Bad("uploading int data as a param",
        upload(lambda p: {"l1.b": np.zeros(8, np.int64)}, partial=True), ShapeError,
        r"^upload_params 'l1\.b': expected f32 data, got a numpy array of int64", raises=True),
    Bad("a negative learning rate", lambda t: t.set_lr(-0.5), ValueError,
        r"^lr must be >= 0 \(a learning rate\), got -0\.5", raises=True),
    Bad("a NaN learning rate", lambda t: t.set_lr(float("nan")), ValueError,
        r"^lr must be finite, got nan", raises=True),
    Bad("a learning rate that is not a number", lambda t: t.set_lr("fast"), TypeError,
        r"^lr must be a number, got 'fast'", raises=True),
    Bad("uploading after destroy", after_destroy(upload(lambda p: p)), RuntimeError,
        r"^this training handle was destroyed", raises=True),
    Bad("downloading after destroy", after_destroy(lambda t: t.download_params()),
        RuntimeError, r"^this training handle was destroyed", raises=True),
    Bad("set_lr after destroy", after_destroy(lambda t: t.set_lr(0.1)), RuntimeError,
        r"^this training handle was destroyed", raises=True),
    Bad("replace_model after destroy", after_destroy(lambda t: t.replace_model(TinyMLP())),
        RuntimeError, r"^this training handle was destroyed", raises=True),
]


async def _fresh(device: Any, model: str) -> tg.Training:
    if model == "tokens":
        return await tg.compile(model=Tokens(), loss=token_loss, inputs=TOKEN_INPUTS,
                                optimizer=tg.optim.Adam(lr=1e-2), seed=0, device=device)
    return await compile_tiny(device)


@pytest.mark.parametrize("bad", CATALOGUE, ids=[b.what for b in CATALOGUE])
def test_bad_input_is_a_clear_error(gpu_device, bad: Bad) -> None:
    async def go() -> None:
        train = await _fresh(gpu_device, bad.model)
        before = await train.download_params()
        if bad.raises:
            with pytest.raises(bad.error, match=bad.message):
                await bad.act(train)
        else:
            result = await bad.act(train)
            assert isinstance(result, tg.Failed), result
            assert isinstance(result.error, bad.error), repr(result.error)
            assert result.kind == "failed"
            assert re.search(bad.message, result.message), result.message
        if not train._destroyed:
            # nothing changed, and the training goes on
            after = await train.download_params()
            assert all(np.array_equal(after[n], before[n]) for n in before)
            assert train.step_count == 0
            good = tokens() if bad.model == "tokens" else data()
            assert (await train.step(**good)).kind == "completed"
            train.destroy()

    run(go())


def test_the_catalogue_is_long_enough() -> None:
    assert len(CATALOGUE) >= 30


# ---- the data as the user passed it ----------------------------------------------------------

def test_strided_and_float64_inputs_give_exactly_the_contiguous_f32_result(gpu_device) -> None:
    async def go() -> None:
        d = data()
        wide = np.zeros((4, 6), np.float32)
        wide[:, ::3] = d["x"]                            # a strided view, not contiguous
        view = wide[:, ::3]
        assert not view.flags.c_contiguous
        results = []
        for x in (d["x"], view, d["x"].astype(np.float64)):
            train = await compile_tiny(gpu_device)
            results.append((await train.step(x=x, y=d["y"])).loss)
            train.destroy()
        assert results[0] == results[1] == results[2], results

    run(go())


def test_raw_bytes_give_a_forward_the_elements_of_the_input_s_dtype(gpu_device) -> None:
    """bytes, bytearray and byte views hold one f32 (or i32) every 4 bytes, for a forward's
    None dims, its fixed shapes and output_shape as for a step (they were counted as one
    element a byte: a None dim resolved 4x too large, a fixed shape refused)."""
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        wild = await train.attach(forward=predict, inputs={"x": (None, 2)})
        fixed = await tg.compile_forward(model=TinyMLP(), forward=predict, inputs={"x": (B, 2)},
                                         seed=3, device=gpu_device)
        x = data()["x"]
        for forward in (wild, fixed):
            want = (await forward.run(x=x)).output
            for raw in (x.tobytes(), bytearray(x.tobytes()), memoryview(x.tobytes())):
                assert forward.output_shape(x=raw) == (B, 1)
                got = await forward.run(x=raw)
                assert got.kind == "completed", got
                assert np.array_equal(got.output, want)
        fixed.destroy()
        train.destroy()

    run(go())


def test_numpy_scalars_are_read_as_the_numbers_they_hold() -> None:
    """A numpy scalar is a 0-d array: converted as one (a float for f32, an int that fits for
    i32), never read as its raw bytes."""
    import struct

    from tensorgrad.hostdata import to_bytes

    for value in (np.float64(2.5), np.float32(2.5), np.float16(2.5)):
        assert bytes(to_bytes("input 's'", value, (), "f32")) == struct.pack("<f", 2.5)
    for value in (np.int64(3), np.uint8(3), np.int16(3), np.int32(3)):
        assert bytes(to_bytes("input 'k'", value, (), "i32")) == struct.pack("<i", 3)
    with pytest.raises(ShapeError, match=r"^input 'k': a int64 array with values "
                       r"1099511627776\.\.1099511627776 does not fit i32"):
        to_bytes("input 'k'", np.int64(2**40), (), "i32")
    with pytest.raises(ShapeError, match=r"^input 's': expected f32 data, got a numpy array "
                       r"of int64"):
        to_bytes("input 's'", np.int64(3), (), "f32")


def test_the_page_client_converts_numpy_data_as_the_native_api_does() -> None:
    """The page client (tensorgrad.web.client, Pyodide on the page) converts NumPy arrays
    with hostdata.numpy_as before it sends them as typed arrays: int64 / uint32 ids out of
    i32's range are refused there, never wrapped (the worker only sees the Int32Array)."""
    from tensorgrad.hostdata import numpy_as
    from tensorgrad.web import client

    assert client.numpy_as is numpy_as
    for bad in (np.array([0, 2**32 + 3]), np.array([3_000_000_000], np.uint32),
                np.array([-2**31 - 1])):
        with pytest.raises(ShapeError, match=r"^step input 'ids': a (u?int\d+) array with "
                           r"values .* does not fit i32"):
            numpy_as("step input 'ids'", bad, "i32")
    ok = numpy_as("x", np.array([1, 2**31 - 1], np.uint32), "i32")
    assert ok.dtype == np.int32 and ok.tolist() == [1, 2**31 - 1]


def test_flat_nested_and_shaped_data_of_the_declared_layout_give_the_same_step(gpu_device
                                                                                ) -> None:
    """Flat data of the right size is read row-major, whatever its container; nested lists
    and arrays of the declared shape are accepted; [N] data fits an [N, 1] input."""
    async def go() -> None:
        d = data()
        ways = [{"x": d["x"], "y": d["y"]},
                {"x": d["x"].reshape(-1), "y": d["y"].reshape(-1)},     # flat arrays
                {"x": d["x"].tolist(), "y": d["y"].reshape(-1).tolist()},  # nested / flat lists
                {"x": memoryview(d["x"]), "y": bytes(d["y"])}]          # a 2-D view, raw bytes
        losses = []
        for way in ways:
            train = await compile_tiny(gpu_device)
            result = await train.step(**way)
            assert result.kind == "completed", result
            losses.append(result.loss)
            train.destroy()
        assert len(set(losses)) == 1, losses

    run(go())


def test_a_standalone_forward_checks_uploaded_shapes(gpu_device) -> None:
    async def go() -> None:
        forward = await tg.compile_forward(model=TinyMLP(), forward=predict,
                                           inputs={"x": (None, 2)}, device=gpu_device, seed=0)
        params = await forward.download_params()
        with pytest.raises(ShapeError, match=r"^upload_params 'l2\.W': got \[1, 8\], the "
                           r"transpose of \[8, 1\]: pass w\.T"):
            forward.upload_params({"l2.W": params["l2.W"].T.copy()}, partial=True)
        await forward.upload_params({"l2.W": params["l2.W"].reshape(-1)}, partial=True)
        out = await forward.run(x=np.ones((1, 2), np.float32))
        assert out.kind == "completed" and out.output.shape == (1, 1), out
        forward.destroy()

    run(go())


# ---- timing: calls that overlap ----------------------------------------------------------------

def test_concurrent_steps_run_one_after_another(gpu_device) -> None:
    async def go() -> None:
        batches = [data(s) for s in range(6)]
        train = await compile_tiny(gpu_device)
        together = await asyncio.gather(*(train.step(**b) for b in batches))
        train.destroy()
        train = await compile_tiny(gpu_device)
        one_by_one = [await train.step(**b) for b in batches]
        train.destroy()
        assert [r.loss for r in together] == [r.loss for r in one_by_one]

    run(go())


def test_replace_model_during_a_step_aborts_it_and_nothing_hangs(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        pending = [train.step(**data(s)) for s in range(3)]
        await asyncio.wait_for(train.replace_model(TinyMLP(hidden=5), seed=1), 30)
        results = await asyncio.wait_for(asyncio.gather(*pending), 30)
        assert all(r.kind == "aborted" for r in results), results
        assert train.param_shapes["l1.W"] == (2, 5)
        assert (await train.step(**data())).kind == "completed"
        train.destroy()

    run(go())


def test_steps_after_destroy_are_aborted_never_hang(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        pending = train.step(**data())
        train.destroy()
        assert (await asyncio.wait_for(pending, 30)).kind in ("aborted", "completed")
        assert await asyncio.wait_for(train.step(**data()), 30) == tg.Aborted()

    run(go())


def test_a_tensor_over_the_device_limit_fails_at_compile(gpu_device) -> None:
    big = gpu_device.limits.max_storage_buffer_binding_size // 4 + 1

    def loss(m: TinyMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        return tg.mean(m(x)) + tg.mean(y)

    async def go() -> None:
        with pytest.raises(DeviceLimitError, match=r"input 'y' f32\[\d+\] needs [\d,]+ bytes, "
                           r"more than the device's max_storage_buffer_binding_size"):
            await tg.compile(model=TinyMLP(), loss=loss, inputs={"x": (B, 2), "y": (big,)},
                             optimizer=tg.optim.Adam(lr=0.1), device=gpu_device)

    run(go())


def test_a_none_dim_in_compile_names_the_public_calls_that_take_one(gpu_device) -> None:
    """tg.compile needs concrete shapes; its error shows the forward calls that take a None
    dim, with the user's own declaration (it named the private resolve_shapes before), and
    the call it shows works."""
    async def go() -> None:
        with pytest.raises(ShapeError, match=re.escape(
                "compile: input 'x' has an unresolved None dim in [None, 2]: training inputs "
                "must be fully concrete (a training step is compiled for one shape: declare "
                "the batch size you train with). None dims are for inference graphs, which "
                "resolve them from the data and compile once per size: predict = await "
                "train.attach(forward=..., inputs={'x': (None, 2)}) shares the training's "
                "params, or await tg.compile_forward(model=..., forward=..., "
                "inputs={'x': (None, 2)})")):
            await tg.compile(model=TinyMLP(), loss=lambda m, x, y: tg.mean(m(x) - y),
                             inputs={"x": (None, 2), "y": (B, 1)},
                             optimizer=tg.optim.Adam(lr=0.1), device=gpu_device)
        train = await compile_tiny(gpu_device)
        forward = await train.attach(forward=predict, inputs={"x": (None, 2)})
        for n in (1, 7):
            result = await forward.run(x=np.zeros((n, 2), np.float32))
            assert result.kind == "completed" and result.output.shape == (n, 1), result
        train.destroy()

    run(go())


class Wide(tg.Module):
    """`count` params of `n` values each (randn-initialised: making them is not free)."""

    def __init__(self, n: int, count: int = 1) -> None:
        self.ws = [self.param((n,)) for _ in range(count)]

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return x * tg.sum(self.ws[0])


@pytest.mark.parametrize("case", ["a param over one binding", "params over one buffer"])
def test_compile_forward_checks_device_limits_before_it_allocates(gpu_device, case) -> None:
    """tg.compile_forward refuses what tg.compile refuses, with the same error, before the
    param store creates (or fills) a buffer."""
    limits = gpu_device.limits
    if case == "a param over one binding":
        model = Wide(limits.max_storage_buffer_binding_size // 4 + 1)
        want = (r"^param: param 'ws\.0' f32\[\d+\] needs [\d,]+ bytes, more than the device's "
                r"max_storage_buffer_binding_size of [\d,]+ bytes")
    else:
        per = min(limits.max_storage_buffer_binding_size, limits.max_buffer_size) // 4
        model = Wide(per, count=limits.max_buffer_size // (4 * per) + 1)
        want = (r"^param: the param arena \(\d+ f32 params, [\d,]+ values\) needs [\d,]+ bytes, "
                r"more than the device's max_buffer_size of [\d,]+ bytes")

    async def go() -> None:
        created = gpu_device.counts["buffers created"]
        t0 = time.perf_counter()
        with pytest.raises(DeviceLimitError, match=want):
            await tg.compile_forward(model=model, forward=lambda m, x: m(x),
                                     inputs={"x": (2,)}, device=gpu_device, seed=0)
        assert time.perf_counter() - t0 < 0.5
        assert gpu_device.counts["buffers created"] == created
        if case == "a param over one binding":  # tg.compile says the same
            with pytest.raises(DeviceLimitError, match=want.replace("^param: ", "")):
                await tg.compile(model=model, loss=lambda m, x: tg.mean(m(x)),
                                 inputs={"x": (2,)}, optimizer=tg.optim.SGD(lr=0.1),
                                 device=gpu_device)

    run(go())


@pytest.mark.parametrize("how", ["NativeDevice.destroy()", "the wgpu device's destroy()"])
def test_a_lost_device_fails_every_call_by_name_and_a_new_device_works(monkeypatch, how
                                                                        ) -> None:
    """The native twin of the browser's test: once the device is lost, steps fail and the
    other calls raise tg.DeviceLostError (not wgpu's GPUValidationError), and tg.compile
    asks for a new default device."""
    from tensorgrad import api
    from tensorgrad.gpu.native import request_native_device

    async def go() -> None:
        device = await request_native_device()
        monkeypatch.setattr(api, "_default_device", device)
        train = await compile_tiny(None)
        assert train.device is device and (await train.step(**data())).kind == "completed"
        if how == "NativeDevice.destroy()":
            device.destroy()
            reason = r"destroyed"
        else:
            device.device.destroy()
            reason = r"wgpu: .*device is lost"
        lost = await train.step(**data())
        assert isinstance(lost, tg.Failed) and isinstance(lost.error, tg.DeviceLostError), lost
        assert re.match(rf"the GPU device was lost \({reason}\); its graphs cannot run any more: "
                        r"compile again \(tg\.compile asks for a new default device\)",
                        lost.message), lost.message
        assert device.lost
        for call in (train.download_params, lambda: train.upload_params(
                {"l1.b": np.zeros(8, np.float32)}, partial=True),
                     lambda: compile_tiny(device)):
            with pytest.raises(tg.DeviceLostError, match=r"^the GPU device was lost"):
                await call()
        train.destroy()  # freeing on a lost device raises nothing
        fresh = await compile_tiny(None)  # a new default device
        assert fresh.device is not device and (await fresh.step(**data())).kind == "completed"
        fresh.destroy()
        fresh.device.destroy()

    run(go())
