"""The public async API (`tg.compile`, `Training`, `attach`, `compile_forward`) on a native
WebGPU device: results, input validation, params, optimizer state, LR, forwards, model
replacement (forwards onwards: test_api_graphs.py).

Models are tiny (a 2-8-1 MLP, a 12-layer width-8 MLP for >100 kernels) so this stays fast on
a CPU Vulkan driver. Coroutines run with ``asyncio.run`` (see conftest.py).
"""

from __future__ import annotations

import array
import math
import re
from typing import Any

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad import hostdata
from tensorgrad.update import STEP_CHAIN
from tests.models import TinyMLP, grad_ids
from tests.native.api_helpers import (
    B,
    bits,
    compile_tiny,
    data,
    mse_captured,
    np_mlp,
    predict,
    ref_values,
    run,
)

# ---- results ------------------------------------------------------------------------------

def test_step_returns_completed_with_loss_and_captures(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device, loss=mse_captured)
        p0 = await train.download_params()
        d = data()
        result = await train.step(**d)
        assert result.kind == "completed"
        assert isinstance(result, tg.Completed)
        match result:
            case tg.Completed(loss=loss, captures=caps):
                pass
            case _:
                pytest.fail(f"not completed: {result}")
        assert isinstance(loss, float) and math.isfinite(loss)
        assert caps.names() == ["err", "pred"]
        assert isinstance(caps["pred"], np.ndarray) and caps["pred"].shape == (B, 1)
        assert caps["pred"].dtype == np.float32
        # the loss and captures are the values at the params before the update
        want_pred = np_mlp(p0, d["x"])
        np.testing.assert_allclose(caps["pred"], want_pred, rtol=1e-5, atol=1e-6)
        want_loss = float(np.mean((want_pred - d["y"]) ** 2))
        assert math.isclose(loss, want_loss, rel_tol=1e-5)
        assert float(caps["err"]) == loss
        with pytest.raises(KeyError, match="pred"):
            caps["nope"]
        assert train.step_count == 1
        assert train.output_shape == ()
        assert train.param_names == ["l1.W", "l1.b", "l2.W", "l2.b"]
        assert train.param_shapes == {n: tuple(np.shape(v)) for n, v in p0.items()}
        assert train.param_count == sum(int(np.size(v)) for v in p0.values())
        assert train.kernel_count == len(train.kernels) > 0
        assert all("@compute" in k for k in train.kernels)
        assert train.peak_bytes > 0
        train.destroy()

    run(go())


def test_result_kinds() -> None:
    assert tg.Completed(loss=1.0).kind == "completed"
    assert tg.Aborted().kind == "aborted"
    failed = tg.Failed(ValueError("boom"))
    assert failed.kind == "failed" and failed.message == "boom"
    for r, want in ((tg.Completed(loss=2.0), "c"), (tg.Aborted(), "a"), (failed, "f")):
        match r:
            case tg.Completed(loss=v):
                got = "c"
                assert v == 2.0
            case tg.Aborted():
                got = "a"
            case tg.Failed(error=e):
                got = "f"
                assert str(e) == "boom"
        assert got == want


# ---- inputs -------------------------------------------------------------------------------

def test_inputs_as_numpy_array_memoryview_bytes(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device, optimizer=tg.optim.SGD(lr=0.0))
        d = data()
        x, y = d["x"], d["y"]
        forms = {
            "numpy": (x, y),
            "array": (array.array("f", x.ravel().tolist()), array.array("f", y.ravel().tolist())),
            "memoryview": (memoryview(x), memoryview(y.ravel())),
            "bytes": (x.tobytes(), bytearray(y.tobytes())),
            "float64 numpy (converted)": (x.astype(np.float64), y.astype(np.float64)),
            "flat numpy": (x.ravel(), y.ravel()),
        }
        losses = {}
        for name, (xv, yv) in forms.items():
            r = await train.step(x=xv, y=yv)
            assert r.kind == "completed", f"{name}: {r}"
            losses[name] = r.loss
        assert len(set(losses.values())) == 1, losses  # lr=0: same params, same data
        assert train.step_count == len(forms)
        train.destroy()

    run(go())


BAD_INPUTS = {
    "too few rows": (lambda d: {"x": d["x"][:3], "y": d["y"]}, ["input 'x'", "8 elements"]),
    "too many bytes": (lambda d: {"x": d["x"].tobytes() + b"\0\0\0\0", "y": d["y"]},
                       ["input 'x'", "32 bytes"]),
    "short array.array": (lambda d: {"x": d["x"], "y": array.array("f", [1.0, 2.0])},
                          ["input 'y'", "4 elements"]),
    "int numpy for f32": (lambda d: {"x": d["x"].astype(np.int32), "y": d["y"]},
                          ["input 'x'", "f32", "int32"]),
    "int array for f32": (lambda d: {"x": array.array("i", range(8)), "y": d["y"]},
                          ["input 'x'", "f32"]),
    "missing": (lambda d: {"x": d["x"]}, ["missing", "'y'", "y: (4, 1)"]),
    "extra": (lambda d: {**d, "z": d["y"]}, ["unexpected", "'z'"]),
    "not a buffer": (lambda d: {"x": object(), "y": d["y"]}, ["input 'x'", "object"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_fail_without_advancing(gpu_device, case: str) -> None:
    make, needles = BAD_INPUTS[case]

    async def go() -> None:
        train = await compile_tiny(gpu_device)
        d = data()
        first = await train.step(**d)
        p1 = bits(await train.download_params())
        r = await train.step(**make(d))
        assert r.kind == "failed", r
        for needle in needles:
            assert needle in r.message, f"{needle!r} not in {r.message!r}"
        assert train.step_count == 1
        assert bits(await train.download_params()) == p1  # nothing ran
        # the next good step is step 2 exactly as if the failure never happened
        twin = await compile_tiny(gpu_device)
        await twin.step(**d)
        assert (await train.step(**d)).loss == (await twin.step(**d)).loss
        assert first.loss != 0
        train.destroy()
        twin.destroy()

    run(go())


def test_i32_input_rejects_float_data(gpu_device) -> None:
    def loss(m: tg.Module, idx: tg.Tensor) -> tg.Tensor:
        return tg.mean(tg.embedding(m.table, idx))

    class Table(tg.Module):
        def __init__(self) -> None:
            self.table = self.param((5, 3))

    async def go() -> None:
        train = await tg.compile(model=Table(), loss=loss, inputs={"idx": ((4,), "i32")},
                                 optimizer=tg.optim.SGD(lr=0.1), seed=1, device=gpu_device)
        ok = await train.step(idx=np.array([0, 1, 2, 4], np.int32))
        assert ok.kind == "completed"
        bad = await train.step(idx=np.array([0.0, 1, 2, 4], np.float32))
        assert bad.kind == "failed" and "input 'idx'" in bad.message and "i32" in bad.message
        assert train.step_count == 1
        train.destroy()

    run(go())


# ---- non-finite losses -----------------------------------------------------------------------

def test_diverging_training_fails_with_a_message(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device, optimizer=tg.optim.SGD(lr=1e30))
        d = data()
        kinds = []
        for _ in range(4):
            r = await train.step(**d)
            kinds.append(r.kind)
            if r.kind == "failed":
                assert isinstance(r.error, FloatingPointError)
                assert "loss is" in r.message and ("nan" in r.message or "inf" in r.message)
                assert "diverged" in r.message
                break
        assert kinds[0] == "completed" and kinds[-1] == "failed", kinds
        train.destroy()

    run(go())


def test_log_of_negative_fails(gpu_device) -> None:
    def loss(m: TinyMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        return tg.mean(tg.log(tg.square(m(x)) * 0.0 - 1.0 + y * 0.0))

    async def go() -> None:
        train = await compile_tiny(gpu_device, loss=loss)
        r = await train.step(**data())
        assert r.kind == "failed" and "nan" in r.message, r
        train.destroy()

    run(go())


async def _state(train: tg.Training) -> dict[str, bytes]:
    """The bytes of every param and optimizer state buffer (not the step guard's chain
    flag, which records whether the last step was applied)."""
    exe = train._exe
    states = [n for n in exe.graph.states if n != STEP_CHAIN]
    values = await exe.read([exe.graph.states[n].id for n in states])
    return {**bits(await train.download_params()),
            **{f"state:{n}": np.asarray(v).tobytes() for n, v in zip(states, values)}}


@pytest.mark.parametrize("optimizer", [tg.optim.Adam(lr=1e-2), tg.optim.AdamW(lr=1e-2),
                                       tg.optim.SGD(lr=1e-2, momentum=0.9),
                                       tg.optim.Adam(lr=1e-2, clip_grad_norm=1.0)],
                         ids=["adam", "adamw", "sgd-momentum", "adam-clip"])
def test_a_nan_step_changes_nothing_and_training_continues(gpu_device, optimizer) -> None:
    async def go() -> None:
        good, bad = data(1), data(1)
        bad["x"][2, 1] = np.nan
        # the reference: two good steps
        ref = await compile_tiny(gpu_device, optimizer=optimizer)
        want = [await ref.step(**good), await ref.step(**data(2))]
        want_state = await _state(ref)
        ref.destroy()
        # the same two good steps with a NaN step between them
        train = await compile_tiny(gpu_device, optimizer=optimizer)
        assert (await train.step(**good)).kind == "completed"
        before = await _state(train)
        r = await train.step(**bad)
        assert r.kind == "failed" and isinstance(r.error, FloatingPointError), r
        assert r.message.startswith("loss is nan at step 2: the update was skipped, params "
                                    "and optimizer state are unchanged; input 'x' holds nan "
                                    "at flat index 5"), r.message
        assert await _state(train) == before  # bit for bit: params, moments, velocity
        assert train.step_count == 1
        again = await train.step(**data(2))
        assert again.kind == "completed" and again.loss == want[1].loss
        assert await _state(train) == want_state
        train.destroy()

    run(go())


def test_a_finite_loss_with_an_infinite_gradient_is_skipped(gpu_device) -> None:
    def loss(m: TinyMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        # sin(sin(1e38 a) 1e38) is bounded, its gradient ~1e76 overflows to inf (an overflow,
        # which no shader compiler folds away, unlike inf - inf or inf * 0)
        a = m(x)
        return tg.mean(tg.sin(tg.sin(a * 1e38) * 1e38)) + tg.mean(tg.square(a - y))

    async def go() -> None:
        train = await compile_tiny(gpu_device, loss=loss)
        before = await _state(train)
        r = await train.step(**data())
        assert r.kind == "failed", r
        assert "the loss is finite" in r.message and "but a gradient is not at step 1" in \
            r.message and "params and optimizer state are unchanged" in r.message, r.message
        assert await _state(train) == before and train.step_count == 0
        train.destroy()

    run(go())


SKIPPED = r": the update was skipped, params and optimizer state are unchanged; lower the " \
    r"learning rate \(or clip gradients with clip_grad_norm\)"
PARAM_INF = r"param 'l[12]\.[Wb]' would become -?inf at flat index \d+"


@pytest.mark.parametrize("optimizer, scale, arena, want", [
    (tg.optim.SGD(lr=1e30), 1e6, True,
     rf"^the update would make params non-finite at step 1 \({PARAM_INF}\){SKIPPED}"),
    (tg.optim.SGD(lr=1e30, momentum=0.9, normalize_grads="l2.*"), 1e6, False,
     rf"^the update would make params non-finite at step 1 \({PARAM_INF}\){SKIPPED}"),
    (tg.optim.Adam(lr=1e39), 1.0, True,
     rf"^the update would make params non-finite at step 1 \({PARAM_INF}\){SKIPPED}"),
    (tg.optim.AdamW(lr=1e39, weight_decay=0.1, normalize_grads="l2.*"), 1.0, False,
     rf"^the update would make params non-finite at step 1 \({PARAM_INF}\){SKIPPED}"),
    (tg.optim.Adam(lr=1e-3), 1e12, True,
     (r"^the update would make the optimizer state non-finite at step 1 \(Adam's second moment "
      rf"v of param 'l[12]\.[Wb]' would become inf at flat index \d+\){SKIPPED}")),
], ids=["sgd-arena", "sgd-momentum-per-param", "adam-arena", "adamw-per-param",
        "adam-state-arena"])
def test_an_update_that_would_make_params_non_finite_is_skipped(gpu_device, optimizer, scale,
                                                                 arena, want) -> None:
    """The loss and the gradients are finite, but the update would overflow (a huge learning
    rate, or a gradient whose square overflows Adam's v): the step fails, params and optimizer
    state stay bit for bit, and training goes on once the learning rate is sane."""
    async def go() -> None:
        train = await compile_tiny(gpu_device, optimizer=optimizer)
        assert (train._opt.layout is not None) == arena
        before = await _state(train)
        big = {k: v * np.float32(scale) for k, v in data().items()}
        r = await train.step(**big)
        assert r.kind == "failed" and isinstance(r.error, FloatingPointError), r
        assert re.search(want, r.message), r.message
        assert await _state(train) == before and train.step_count == 0
        await train.set_lr(1e-3)
        assert (await train.step(**data())).kind == "completed"
        assert await _state(train) != before
        train.destroy()

    run(go())


# ---- outputs without numpy -------------------------------------------------------------------

def test_outputs_are_numpy_arrays(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device, loss=mse_captured)
        await train.step(**data())
        params = await train.download_params()
        grads = await train.download_param_grads()
        for v in (*params.values(), *grads.values()):
            assert isinstance(v, np.ndarray) and v.dtype == np.float32
        assert params["l1.W"].shape == (2, 8) and grads["l2.b"].shape == (1,)
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
        out = (await fwd.run(x=data(batch=3)["x"])).output
        assert isinstance(out, np.ndarray) and out.shape == (3, 1)
        train.destroy()

    run(go())


def test_outputs_without_numpy_are_shaped_memoryviews(gpu_device, monkeypatch) -> None:
    async def go() -> tuple[Any, ...]:
        train = await compile_tiny(gpu_device, loss=mse_captured)
        d = data()
        xs = array.array("f", d["x"].ravel().tolist())
        ys = array.array("f", d["y"].ravel().tolist())
        r = await train.step(x=xs, y=ys)
        params = await train.download_params()
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
        out = (await fwd.run(x=xs)).output
        arg = await train.attach(forward=lambda m, x: tg.argmax(m(x), 0),
                                 inputs={"x": (None, 2)}, output="i32")
        idx = (await arg.run(x=xs)).output
        train.destroy()
        return r, params, out, idx

    with_np = run(go())
    monkeypatch.setattr(hostdata, "numpy_or_none", lambda: None)
    r, params, out, idx = run(go())
    assert r.kind == "completed" and isinstance(r.loss, float)
    assert r.loss == with_np[0].loss
    pred = r.captures["pred"]
    assert isinstance(pred, memoryview) and pred.format == "f" and pred.shape == (B, 1)
    assert pred.tolist() == with_np[0].captures["pred"].tolist()
    err = r.captures["err"]  # a 0-d capture is a 0-d memoryview, like numpy's 0-d array
    assert isinstance(err, memoryview) and err.shape == () and err.tolist() == r.loss
    assert with_np[0].captures["err"].shape == ()
    assert isinstance(params["l1.W"], memoryview) and params["l1.W"].shape == (2, 8)
    assert params["l1.b"].shape == (8,)
    for k, v in params.items():
        assert v.tobytes() == with_np[1][k].tobytes()
    assert isinstance(out, memoryview) and out.shape == (B, 1) and out.format == "f"
    assert out.tolist() == with_np[2].tolist()
    assert isinstance(idx, memoryview) and idx.format == "i" and idx.shape == (1,)
    assert idx.tolist() == with_np[3].tolist()


# ---- params -------------------------------------------------------------------------------

def test_upload_params_strict_and_atomic(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        before = await train.download_params()
        rng = np.random.default_rng(5)
        fresh = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in before.items()}

        with pytest.raises(KeyError, match=r"unknown param\(s\) \['l9.W'\].*l1.W"):
            await train.upload_params({**fresh, "l9.W": fresh["l1.W"]})
        with pytest.raises(KeyError, match=r"missing param\(s\) \['l1.b', 'l2.W'\]"):
            await train.upload_params({"l1.W": fresh["l1.W"], "l2.b": fresh["l2.b"]})
        with pytest.raises(tg.ShapeError, match=r"'l2.W'.*expected 8 elements"):
            await train.upload_params({**fresh, "l2.W": np.zeros(7, np.float32)})
        with pytest.raises(tg.ShapeError, match=r"'l1.b'.*f32"):
            await train.upload_params({**fresh, "l1.b": np.zeros(8, np.int32)})
        # every failure above had valid entries for other params: none was written
        assert bits(await train.download_params()) == bits(before)

        await train.upload_params({"l1.b": fresh["l1.b"]}, partial=True)
        now = await train.download_params()
        assert now["l1.b"].tobytes() == fresh["l1.b"].tobytes()
        assert now["l1.W"].tobytes() == before["l1.W"].tobytes()
        with pytest.raises(KeyError, match="unknown"):
            await train.upload_params({"nope": fresh["l1.b"]}, partial=True)
        train.destroy()

    run(go())


def test_download_params_round_trip_bit_exact(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        rng = np.random.default_rng(6)
        vals = {k: rng.standard_normal(s).astype(np.float32)
                for k, s in (("l1.W", (2, 8)), ("l1.b", (8,)), ("l2.W", (8, 1)), ("l2.b", (1,)))}
        vals["l1.b"][:4] = np.array([-0.0, 1e-45, np.float32(3.4e38), -1e-38], np.float32)
        await train.upload_params(vals)
        got = await train.download_params()
        assert list(got) == train.param_names
        assert bits(got) == bits(vals)
        # list/array.array uploads too
        await train.upload_params({"l2.b": [0.25]}, partial=True)
        assert (await train.download_params())["l2.b"].tolist() == [0.25]
        train.destroy()

    run(go())


def test_param_grads_match_reference_interpreter(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        zero = await train.download_param_grads()
        assert all(not np.any(v) for v in zero.values())  # zeros before any step
        d = data(7)
        for step in (1, 2):
            p = await train.download_params()
            r = await train.step(**d)
            grads = await train.download_param_grads()
            values = ref_values(train, {**p, **d}, t=step)
            assert math.isclose(r.loss, float(values[train.ir.outputs[0]]), rel_tol=1e-5)
            assert set(grads) == set(train.param_names)
            for name, gid in grad_ids(train).items():
                np.testing.assert_allclose(grads[name], values[gid], rtol=1e-4, atol=1e-6,
                                           err_msg=f"step {step} grad of {name}")
                assert np.any(grads[name]), name
        train.destroy()

    run(go())


# ---- reset / optimizer state ----------------------------------------------------------------

def test_reset_reproduces_initial_params_and_first_step(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device, seed=11)
        p0 = await train.download_params()
        init = TinyMLP().init_params(11)
        for k, v in p0.items():
            assert np.asarray(init[k], np.float32).tobytes() == v.tobytes()
        d = data(1)
        losses = [(await train.step(**d)).loss for _ in range(3)]
        p3 = await train.download_params()
        assert bits(p3) != bits(p0)
        await train.reset()
        assert train.step_count == 0
        assert bits(await train.download_params()) == bits(p0)
        again = [(await train.step(**d)).loss for _ in range(3)]
        assert again == losses  # optimizer state zeroed, t restarted
        assert bits(await train.download_params()) == bits(p3)
        train.destroy()

    run(go())


def test_reset_optimizer_state_only(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device, seed=12)
        d = data(2)
        for _ in range(3):
            await train.step(**d)
        p3 = await train.download_params()
        await train.reset_optimizer_state()
        assert train.step_count == 0
        assert bits(await train.download_params()) == bits(p3)  # params kept
        # a fresh Adam from p3 gives the same next step bit for bit
        fresh = await compile_tiny(gpu_device, seed=99)
        await fresh.upload_params(p3)
        a, b = await train.step(**d), await fresh.step(**d)
        assert a.loss == b.loss
        assert bits(await train.download_params()) == bits(await fresh.download_params())
        # reset(params=False) is the same operation
        await train.step(**d)
        await train.reset(params=False)
        assert train.step_count == 0
        train.destroy()
        fresh.destroy()

    run(go())


# ---- learning rate -----------------------------------------------------------------------

async def _sgd_lr_used(train: tg.Training, d: dict[str, Any]) -> float:
    """The LR the last SGD step applied: (p_before - p_after) / grad."""
    before = await train.download_params()
    r = await train.step(**d)
    assert r.kind == "completed"
    after = await train.download_params()
    grads = await train.download_param_grads()
    ratios = []
    for k in before:
        g = grads[k].astype(np.float64).ravel()
        delta = (before[k].astype(np.float64) - after[k].astype(np.float64)).ravel()
        ok = np.abs(g) > 1e-2
        ratios.extend((delta[ok] / g[ok]).tolist())
    assert len(ratios) >= 4
    return float(np.median(ratios))


def test_set_lr_schedule_rebases_to_next_step(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device, optimizer=tg.optim.SGD(lr=0.05))
        d = data(3)
        assert math.isclose(await _sgd_lr_used(train, d), 0.05, rel_tol=1e-3)
        for _ in range(2):
            await train.step(**d)
        assert train.step_count == 3
        await train.set_lr(tg.lr.linear(peak=0.1, final=0.0, steps=10))
        # rebased: the next step (4) is the schedule's step 1 -> 0.09, then 0.08
        assert math.isclose(await _sgd_lr_used(train, d), 0.09, rel_tol=1e-3)
        assert math.isclose(await _sgd_lr_used(train, d), 0.08, rel_tol=1e-3)
        # an explicit start_step is kept: step 6 is its step 6 -> 0.04
        await train.set_lr(tg.lr.linear(peak=0.1, final=0.0, steps=10, start_step=0))
        assert math.isclose(await _sgd_lr_used(train, d), 0.04, rel_tol=1e-3)
        await train.set_lr(0.02)
        assert math.isclose(await _sgd_lr_used(train, d), 0.02, rel_tol=1e-3)
        assert train.step_count == 7
        train.destroy()

    run(go())


def test_a_reset_restarts_a_schedule_given_to_set_lr(gpu_device) -> None:
    """reset() and reset_optimizer_state() restart the step count, and a schedule given to
    set_lr restarts with it, as a schedule given at compile does (it used to stay at its
    first value until the count passed the step set_lr was called at)."""
    async def go() -> None:
        train = await compile_tiny(gpu_device, optimizer=tg.optim.SGD(lr=0.2))
        d = data(3)
        for _ in range(4):
            await train.step(**d)
        await train.set_lr(tg.lr.linear(peak=0.1, final=0.0, steps=4))
        assert math.isclose(await _sgd_lr_used(train, d), 0.075, rel_tol=1e-3)
        for reset in (train.reset_optimizer_state, train.reset):
            await reset()
            assert train.step_count == 0
            used = [await _sgd_lr_used(train, d) for _ in range(4)]
            assert used == pytest.approx([0.075, 0.05, 0.025, 0.0], abs=1e-4), used
        train.destroy()

    run(go())


def test_adamw_decay_follows_set_lr(gpu_device) -> None:
    """Upstream baked ``1 - lr*wd`` into the kernel for a numeric LR, so set_lr changed the
    Adam step but not the decay. Here the trajectory must follow the new LR in both."""
    wd, eps, b1, b2 = 0.5, 1e-8, 0.9, 0.999
    lrs = [0.01, 0.01, 0.05, 0.05, 0.002]

    async def go() -> None:
        opt = tg.optim.AdamW(lr=lrs[0], weight_decay=wd, eps=eps)
        train = await compile_tiny(gpu_device, optimizer=opt, seed=21)
        decays = {k: s.decay for k, s in TinyMLP().named_params().items()}
        assert decays == {"l1.W": True, "l1.b": False, "l2.W": True, "l2.b": False}
        d = data(4)
        p = {k: v.astype(np.float64) for k, v in (await train.download_params()).items()}
        baked = {k: v.copy() for k, v in p.items()}
        m = {k: np.zeros_like(v) for k, v in p.items()}
        v2 = {k: np.zeros_like(v) for k, v in p.items()}
        for t, lr in enumerate(lrs, start=1):
            if t > 1 and lr != lrs[t - 2]:
                await train.set_lr(lr)
            assert (await train.step(**d)).kind == "completed"
            g = {k: x.astype(np.float64) for k, x in (await train.download_param_grads()).items()}
            got = await train.download_params()
            lrt = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            for k in list(p):
                m[k] = b1 * m[k] + (1 - b1) * g[k]
                v2[k] = b2 * v2[k] + (1 - b2) * g[k] ** 2
                step = lrt * m[k] / (np.sqrt(v2[k]) + eps)
                s = 1 - lr * wd if decays[k] else 1.0
                s_baked = 1 - lrs[0] * wd if decays[k] else 1.0
                p[k] = s * p[k] - step
                baked[k] = s_baked * baked[k] - step
                np.testing.assert_allclose(got[k], p[k], rtol=1e-5, atol=1e-6,
                                           err_msg=f"step {t} (lr {lr}) param {k}")
        # the baked-decay trajectory is measurably different (so the check above is sharp)
        diff = max(float(np.max(np.abs(p[k] - baked[k]))) for k in ("l1.W", "l2.W"))
        assert diff > 1e-3
        train.destroy()

    run(go())


