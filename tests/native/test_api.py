"""The public async API (`tg.compile`, `Training`, `attach`, `compile_forward`) on a native
WebGPU device: results, input validation, params, optimizer state, LR, forwards, model
replacement, checkpoints, compile-time errors, chunking and buffer reuse.

Models are tiny (a 2-8-1 MLP, a 12-layer width-8 MLP for >100 kernels) so this stays fast on
a CPU Vulkan driver. Coroutines run with ``asyncio.run`` (see conftest.py).
"""

from __future__ import annotations

import array
import asyncio
import math
from typing import Any

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad import compiler, hostdata, runtime
from tensorgrad.errors import DeviceLimitError, ShaderCompileError
from tensorgrad.gpu.interface import DeviceLimits
from tensorgrad.plan import plan_buffers
from tests.models import DeepMLP, TinyMLP, grad_ids, param_writebacks, reference_values

B = 4
INPUTS = {"x": (B, 2), "y": (B, 1)}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def mse(m: TinyMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(m(x) - y))


def mse_captured(m: TinyMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    pred = tg.capture("pred", m(x))
    err = tg.capture("err", tg.mean(tg.square(pred - y)))
    return err


def predict(m: TinyMLP, x: tg.Tensor) -> tg.Tensor:
    return m(x)


def data(seed: int = 0, batch: int = B) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 2)).astype(np.float32),
            "y": rng.standard_normal((batch, 1)).astype(np.float32)}


def np_mlp(p: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """TinyMLP in numpy (float64) from downloaded params."""
    w1, b1 = np.asarray(p["l1.W"], np.float64), np.asarray(p["l1.b"], np.float64)
    w2, b2 = np.asarray(p["l2.W"], np.float64), np.asarray(p["l2.b"], np.float64)
    return np.maximum(x.astype(np.float64) @ w1 + b1, 0.0) @ w2 + b2


async def compile_tiny(device: Any, loss: Any = mse, optimizer: Any = None, seed: int = 3,
                       model: tg.Module | None = None, **kw: Any) -> tg.Training:
    return await tg.compile(model=model or TinyMLP(), loss=loss, inputs=INPUTS,
                            optimizer=optimizer or tg.optim.Adam(lr=1e-2), seed=seed,
                            device=device, **kw)


def ref_values(train: tg.Training, feeds: dict[str, Any], t: int = 1) -> list[Any]:
    return reference_values(train, feeds, t)


def bits(params: dict[str, Any]) -> dict[str, bytes]:
    return {k: np.asarray(v).tobytes() for k, v in params.items()}


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


# ---- attached forwards ---------------------------------------------------------------------

def test_attach_shares_params_with_training(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
        assert fwd.param_names == train.param_names
        xs = data(5, batch=7)["x"]
        out0 = (await fwd.run(x=xs)).output
        np.testing.assert_allclose(out0, np_mlp(await train.download_params(), xs),
                                   rtol=1e-5, atol=1e-6)
        d = data(6)
        for _ in range(5):
            await train.step(**d)
        r = await fwd.run(x=xs)
        assert r.kind == "completed" and r.output.shape == (7, 1)
        assert not np.array_equal(r.output, out0)
        np.testing.assert_allclose(r.output, np_mlp(await train.download_params(), xs),
                                   rtol=1e-5, atol=1e-6)
        # uploads through the forward land in the training's params
        p = await train.download_params()
        p["l2.b"] = np.array([3.0], np.float32)
        await fwd.upload_params(p)
        assert (await train.download_params())["l2.b"].tolist() == [3.0]
        assert bits(await fwd.download_params()) == bits(p)
        train.destroy()

    run(go())


def test_attach_compiles_per_size_with_lru_eviction(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)}, max_cached_shapes=2)
        assert len(fwd._cache) == 0  # lazy: nothing compiled at attach
        xs = {n: data(n, batch=n)["x"] for n in (1, 2, 3)}
        e1 = fwd.graph_for(x=xs[1])
        assert fwd.graph_for(x=xs[1]) is e1  # cached
        assert fwd.output_shape(x=xs[1]) == (1, 1)
        e2 = fwd.graph_for(x=xs[2])
        assert e2 is not e1 and fwd.output_shape(x=xs[2]) == (2, 1)
        fwd.graph_for(x=xs[1])  # touch 1: 2 is now least recently used
        e3 = fwd.graph_for(x=xs[3])
        assert len(fwd._cache) == 2
        assert e2.destroyed and not e1.destroyed and not e3.destroyed
        assert fwd.graph_for(x=xs[2]) is not e2  # recompiled
        assert e1.destroyed  # and 1 went out
        for n, x in xs.items():
            r = await fwd.run(x=x)
            assert r.kind == "completed" and r.output.shape == (n, 1)
            np.testing.assert_allclose(r.output, np_mlp(await train.download_params(), x),
                                       rtol=1e-5, atol=1e-6)
        train.destroy()

    run(go())


def test_attach_wildcard_errors(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
        r = await fwd.run(x=np.zeros(5, np.float32))
        assert r.kind == "failed" and "input 'x'" in r.message and "multiple of 2" in r.message
        r = await fwd.run(x=np.zeros(0, np.float32))
        assert r.kind == "failed"
        r = await fwd.run()
        assert r.kind == "failed" and "'x'" in r.message
        r = await fwd.run(x=np.zeros(4, np.float32), z=np.zeros(4, np.float32))
        assert r.kind == "failed" and "'z'" in r.message
        r = await fwd.run(x=np.zeros(4, np.int32))
        assert r.kind == "failed" and "f32" in r.message
        two = await train.attach(forward=lambda m, x, w: m(x) * w,
                                 inputs={"x": (None, 2), "w": (None, 1)})
        r = await two.run(x=np.zeros(6, np.float32), w=np.zeros(2, np.float32))
        assert r.kind == "failed" and "disagree" in r.message
        r = await two.run(x=np.zeros(6, np.float32), w=np.ones(3, np.float32))
        assert r.kind == "completed" and r.output.shape == (3, 1)
        train.destroy()

    run(go())


def test_attach_output_dtype(gpu_device) -> None:
    def argmax_fwd(m: TinyMLP, x: tg.Tensor) -> tg.Tensor:
        return tg.argmax(m(x), 0)  # index of the largest output over the batch: i32 [1]

    async def go() -> None:
        model = TinyMLP(n_out=3)
        train = await tg.compile(model=model, loss=lambda m, x, y: tg.mean(tg.square(m(x))),
                                 inputs={"x": (B, 2), "y": (B, 1)},
                                 optimizer=tg.optim.Adam(lr=1e-2), seed=5, device=gpu_device)
        xs = data(8, batch=6)["x"]
        cls = await train.attach(forward=lambda m, x: tg.argmax(m(x), -1),
                                 inputs={"x": (None, 2)}, output="i32")
        r = await cls.run(x=xs)
        assert r.kind == "completed" and r.output.dtype == np.int32 and r.output.shape == (6,)
        want = np.argmax(np_mlp(await train.download_params(), xs), -1)
        assert r.output.tolist() == want.tolist()
        wrong = await train.attach(forward=argmax_fwd, inputs={"x": (None, 2)})  # f32 declared
        r = await wrong.run(x=xs)
        assert r.kind == "failed" and "i32" in r.message and "'f32'" in r.message
        wrong2 = await train.attach(forward=predict, inputs={"x": (None, 2)}, output="i32")
        r = await wrong2.run(x=xs)
        assert r.kind == "failed" and "f32" in r.message
        with pytest.raises(tg.ShapeError, match="output"):
            await train.attach(forward=predict, inputs={"x": (None, 2)}, output="f16")
        train.destroy()

    run(go())


def test_compile_forward_standalone(gpu_device) -> None:
    async def go() -> None:
        fwd = await tg.compile_forward(model=TinyMLP(), forward=predict,
                                       inputs={"x": (None, 2)}, seed=17, device=gpu_device)
        p = await fwd.download_params()
        init = TinyMLP().init_params(17)
        assert bits(p) == {k: np.asarray(v, np.float32).tobytes() for k, v in init.items()}
        xs = data(9, batch=5)["x"]
        r = await fwd.run(x=xs)
        np.testing.assert_allclose(r.output, np_mlp(p, xs), rtol=1e-5, atol=1e-6)
        rng = np.random.default_rng(9)
        new = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in p.items()}
        await fwd.upload_params(new)
        r = await fwd.run(x=xs)
        np.testing.assert_allclose(r.output, np_mlp(new, xs), rtol=1e-5, atol=1e-5)
        with pytest.raises(KeyError, match="missing"):
            await fwd.upload_params({"l1.W": new["l1.W"]})
        fwd.destroy()
        assert (await fwd.run(x=xs)).kind == "aborted"

    run(go())


# ---- replace_model / destroy ---------------------------------------------------------------

def test_replace_model(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
        xs = data(10, batch=3)["x"]
        assert (await fwd.run(x=xs)).output.shape == (3, 1)
        d = data(11)
        for _ in range(2):
            await train.step(**d)

        class Wider(tg.Module):
            def __init__(self) -> None:
                self.l1 = tg.Linear(2, 5)
                self.l2 = tg.Linear(5, 1)
                self.extra = self.param((1,), init=tg.init.ones())

            def forward(self, x: tg.Tensor) -> tg.Tensor:
                return self.l2(tg.relu(self.l1(x))) * self.extra

        await train.replace_model(Wider(), seed=8)
        assert train.param_names == ["l1.W", "l1.b", "l2.W", "l2.b", "extra"]
        assert train.step_count == 0
        p = await train.download_params()
        assert p["l1.W"].shape == (2, 5) and p["extra"].tolist() == [1.0]
        assert bits(p) == {k: np.asarray(v, np.float32).tobytes()
                           for k, v in Wider().init_params(8).items()}
        r = await train.step(**d)
        assert r.kind == "completed"
        # the attached forward retraced against the new model
        out = await fwd.run(x=xs)
        p = await train.download_params()
        want = np_mlp(p, xs) * p["extra"][0]
        np.testing.assert_allclose(out.output, want, rtol=1e-5, atol=1e-6)
        assert fwd.param_names == train.param_names
        train.destroy()

    run(go())


def test_replace_model_aborts_calls_in_flight(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
        d = data(12)
        # called before replace_model, still pending after it. (Whether a call has reached
        # the device by then depends on timing: one that already completed is Completed.)
        task = asyncio.create_task(train.step(**d))
        ftask = asyncio.create_task(fwd.run(x=d["x"]))
        await train.replace_model(TinyMLP(hidden=4), seed=2)
        assert await task == tg.Aborted()
        assert await ftask == tg.Aborted()
        # created before replace_model but not started yet: also Aborted, and the new model's
        # fresh state is untouched by it
        task = asyncio.create_task(train.step(**d))
        await train.replace_model(TinyMLP(hidden=3), seed=2)
        assert (await task).kind == "aborted"
        assert train.step_count == 0
        assert bits(await train.download_params()) == {
            k: np.asarray(v, np.float32).tobytes() for k, v in TinyMLP(hidden=3).init_params(2).items()}
        assert (await train.step(**d)).kind == "completed"
        train.destroy()

    run(go())


def test_failed_replace_model_keeps_the_old_model(gpu_device) -> None:
    class Broken(tg.Module):
        def __init__(self) -> None:
            self.l1 = tg.Linear(3, 4)  # x is [B, 2]: the matmul cannot trace

        def forward(self, x: tg.Tensor) -> tg.Tensor:
            return self.l1(x)

    async def go() -> None:
        train = await compile_tiny(gpu_device)
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
        d = data(16)
        await train.step(**d)
        p1 = bits(await train.download_params())
        with pytest.raises(tg.ShapeError):
            await train.replace_model(Broken())
        assert train.param_names == ["l1.W", "l1.b", "l2.W", "l2.b"]
        assert train.step_count == 1
        assert bits(await train.download_params()) == p1
        assert (await train.step(**d)).kind == "completed"
        r = await fwd.run(x=d["x"])
        assert r.kind == "completed"
        np.testing.assert_allclose(r.output, np_mlp(await train.download_params(), d["x"]),
                                   rtol=1e-5, atol=1e-6)
        train.destroy()

    run(go())


def test_concurrent_steps_run_in_call_order(gpu_device) -> None:
    async def go() -> None:
        batches = [data(20 + i) for i in range(4)]
        seq = await compile_tiny(gpu_device, seed=5)
        want = [(await seq.step(**b)).loss for b in batches]
        par = await compile_tiny(gpu_device, seed=5)
        results = await asyncio.gather(*(par.step(**b) for b in batches))
        assert [r.loss for r in results] == want
        assert par.step_count == 4
        assert bits(await par.download_params()) == bits(await seq.download_params())
        seq.destroy()
        par.destroy()

    run(go())


def test_destroy_then_calls_abort(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
        d = data(13)
        assert (await train.step(**d)).kind == "completed"
        task = asyncio.create_task(train.step(**d))  # called before destroy, pending after
        train.destroy()
        assert (await task).kind == "aborted"
        assert await train.step(**d) == tg.Aborted()
        assert (await fwd.run(x=d["x"])).kind == "aborted"
        with pytest.raises(RuntimeError, match="destroyed"):
            await train.download_params()
        train.destroy()  # idempotent

    run(go())


# ---- checkpoints ----------------------------------------------------------------------------

def test_safetensors_round_trip(gpu_device) -> None:
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        d = data(14)
        for _ in range(3):
            await train.step(**d)
        saved = await train.download_params()
        blob = tg.save_safetensors(saved)
        other = await compile_tiny(gpu_device, seed=77)
        assert bits(await other.download_params()) != bits(saved)
        loaded = tg.load_safetensors(blob)
        assert {k: v.shape for k, v in loaded.items()} == {k: v.shape for k, v in saved.items()}
        await other.upload_params(loaded)
        assert bits(await other.download_params()) == bits(saved)
        # the loss of a step is computed at the params before its update: same params,
        # same loss, whatever the optimizer state
        assert (await other.step(**d)).loss == (await train.step(**d)).loss
        train.destroy()
        other.destroy()

    run(go())


# ---- compile-time errors -------------------------------------------------------------------

def test_oversize_tensor_is_a_compile_error(gpu_device) -> None:
    limit = gpu_device.limits.max_storage_buffer_binding_size
    rows = 256
    width = limit // (4 * rows) + 1  # one activation [rows, width] just over the limit

    class Wide(tg.Module):
        def __init__(self) -> None:
            self.up = tg.Linear(1, width)

        def forward(self, x: tg.Tensor) -> tg.Tensor:
            return tg.mean(self.up(x))

    async def go() -> None:
        with pytest.raises(DeviceLimitError) as info:
            await tg.compile(model=Wide(), loss=lambda m, x: m(x), inputs={"x": (rows, 1)},
                             optimizer=tg.optim.SGD(lr=0.1), device=gpu_device)
        msg = str(info.value)
        assert f"[{rows}, {width}]" in msg and "max_storage_buffer_binding_size" in msg
        assert "matmul" in msg or "add" in msg

    run(go())


def test_plan_limits_name_the_tensor() -> None:
    small = DeviceLimits(max_storage_buffer_binding_size=1024, max_buffer_size=4096)
    tr = tg.trace(TinyMLP(n_in=2, hidden=8), mse, {"x": (300, 2), "y": (300, 1)}, seed=0)
    with pytest.raises(DeviceLimitError) as info:
        plan_buffers(tr.graph, grads=tr.grads, limits=small)
    msg = str(info.value)
    assert "input 'x'" in msg and "2,400 bytes" in msg and "1,024" in msg
    tr = tg.trace(TinyMLP(n_in=2, hidden=200), mse, {"x": (2, 2), "y": (2, 1)}, seed=0)
    with pytest.raises(DeviceLimitError, match=r"\[2, 200\].*1,600 bytes"):
        plan_buffers(tr.graph, grads=tr.grads, limits=DeviceLimits(
            max_storage_buffer_binding_size=1599, max_buffer_size=10**6))
    plan_buffers(tr.graph, grads=tr.grads, limits=DeviceLimits(
        max_storage_buffer_binding_size=1600, max_buffer_size=1600))


def test_shader_compile_error_names_the_op(gpu_device, monkeypatch) -> None:
    real = compiler.emit_graph

    def broken(graph, target, ops):
        kernels = real(graph, target, ops)
        i = next(n.id for n in graph.nodes if n.op == "matmul")
        k = kernels[i]
        kernels[i] = type(k)(k.wgsl.replace("fn main", "fn main_oops_broken_("), k.threads,
                             k.workgroup_size, k.label)
        return kernels

    monkeypatch.setattr(compiler, "emit_graph", broken)

    async def go() -> None:
        with pytest.raises(ShaderCompileError) as info:
            await compile_tiny(gpu_device)
        err = info.value
        assert err.label == "matmul"
        msg = str(err)
        assert "kernel 'matmul'" in msg
        assert "   1 | " in msg and "main_oops_broken_" in msg  # numbered WGSL
        assert err.messages

    run(go())
    monkeypatch.undo()

    async def after() -> None:  # a failed compile poisons nothing
        train = await compile_tiny(gpu_device)
        assert (await train.step(**data())).kind == "completed"
        train.destroy()

    run(after())


def test_failed_compile_frees_its_buffers(gpu_device, monkeypatch) -> None:
    live: set[int] = set()
    real_create, real_destroy = gpu_device.create_buffer, gpu_device.destroy_buffer

    def create(size: int, label: str = "") -> Any:
        buf = real_create(size, label)
        live.add(id(buf))
        return buf

    def destroy(buf: Any) -> None:
        live.discard(id(buf))
        real_destroy(buf)

    monkeypatch.setattr(gpu_device, "create_buffer", create)
    monkeypatch.setattr(gpu_device, "destroy_buffer", destroy)
    real_emit = compiler.emit_graph

    def broken(graph, target, ops):
        kernels = real_emit(graph, target, ops)
        i = next(n.id for n in graph.nodes if n.op == "matmul")
        kernels[i] = type(kernels[i])("fn main( {", kernels[i].threads, 256, "matmul")
        return kernels

    monkeypatch.setattr(compiler, "emit_graph", broken)

    async def go() -> None:
        with pytest.raises(ShaderCompileError):
            await compile_tiny(gpu_device)

    run(go())
    assert not live, f"{len(live)} GPU buffers leaked by a failed compile"


def test_device_create_kernel_rejects_bad_wgsl(gpu_device) -> None:
    cache = runtime.pipeline_cache(gpu_device)
    with pytest.raises(ShaderCompileError, match="kernel 'my_op'") as info:
        cache.get("@compute @workgroup_size(1) fn main() { let x: f32 = 1u; }", "my_op")
    assert "   1 | @compute" in str(info.value)


# ---- chunked dispatch ------------------------------------------------------------------------

def deep_loss(m: DeepMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(m(x) - y))


DEEP_INPUTS = {"x": (16, 8), "y": (16, 8)}


def deep_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(15)
    return {"x": rng.standard_normal((16, 8)).astype(np.float32),
            "y": rng.standard_normal((16, 8)).astype(np.float32)}


async def _deep_run(device: Any, steps: int = 3, **kw: Any) -> tuple[list[float], dict, Any]:
    train = await tg.compile(model=DeepMLP(), loss=deep_loss, inputs=DEEP_INPUTS,
                             optimizer=tg.optim.Adam(lr=1e-2), seed=31, device=device, **kw)
    d = deep_data()
    losses = []
    for _ in range(steps):
        r = await train.step(**d)
        assert r.kind == "completed", r
        losses.append(r.loss)
    params = bits(await train.download_params())
    info = (train.kernel_count, train.peak_bytes, train._exe.plan)
    train.destroy()
    return losses, params, info


def test_chunked_dispatch_is_bit_exact(gpu_device) -> None:
    async def go() -> None:
        base_losses, base_params, (kernels, _, _) = await _deep_run(gpu_device, chunk_size=0)
        assert kernels > 100
        for cs in (1, 7, 32):
            losses, params, _ = await _deep_run(gpu_device, chunk_size=cs)
            assert losses == base_losses, f"chunk_size={cs}"
            assert params == base_params, f"chunk_size={cs}"
        with pytest.raises(ValueError, match="chunk_size"):
            await tg.compile(model=DeepMLP(), loss=deep_loss, inputs=DEEP_INPUTS,
                             optimizer=tg.optim.Adam(lr=1e-2), device=gpu_device, chunk_size=-1)

    run(go())


# ---- buffer reuse ----------------------------------------------------------------------------

def _plan_without_reuse(graph, **kw):
    return plan_buffers(graph, reuse=False, **kw)


def test_liveness_reuse_changes_no_result(gpu_device, monkeypatch) -> None:
    async def go() -> None:
        losses, params, (_, peak, plan) = await _deep_run(gpu_device, chunk_size=0)
        assert any(len(b.nodes) > 1 for b in plan.buffers), "no buffer is reused"
        monkeypatch.setattr(compiler, "plan_buffers", _plan_without_reuse)
        flat_losses, flat_params, (_, flat_peak, flat_plan) = await _deep_run(gpu_device,
                                                                             chunk_size=0)
        monkeypatch.undo()
        assert all(len(b.nodes) == 1 for b in flat_plan.buffers)
        assert peak < flat_peak, (peak, flat_peak)
        assert flat_peak == plan.unpooled_bytes
        assert losses == flat_losses
        assert params == flat_params

    run(go())


def assert_scaled_close(name: str, got: Any, want: Any, rel: float = 1e-5) -> None:
    """max |got - want| <= rel * max |want| (float32 GPU vs float32 reference)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(got - want)))
    assert scale > 0 and err <= rel * scale, f"{name}: max error {err:.3g}, scale {scale:.3g}"


def test_deep_model_matches_reference_interpreter(gpu_device) -> None:
    async def go() -> None:
        train = await tg.compile(model=DeepMLP(), loss=deep_loss, inputs=DEEP_INPUTS,
                                 optimizer=tg.optim.Adam(lr=1e-2), seed=31, device=gpu_device)
        assert train.kernel_count > 100
        d = deep_data()
        p = await train.download_params()
        r = await train.step(**d)
        values = ref_values(train, {**p, **d})
        assert math.isclose(r.loss, float(values[train.ir.outputs[0]]), rel_tol=1e-5)
        grads = await train.download_param_grads()
        for name, gid in grad_ids(train).items():
            assert_scaled_close(f"grad of {name}", grads[name], values[gid], 1e-5)
        # the updated params are the reference's writeback sources (Adam's first step is
        # ~lr*sign(g): skip entries whose gradient is too small for its sign to be robust)
        new = await train.download_params()
        updated = param_writebacks(train)
        assert set(updated) == set(train.param_names)
        for name, gid in grad_ids(train).items():
            g = values[gid]
            ok = np.abs(g) > 1e-4 * np.max(np.abs(g))
            np.testing.assert_allclose(new[name][ok], values[updated[name]][ok], rtol=1e-5,
                                       atol=1e-6, err_msg=name)
        train.destroy()

    run(go())


# ---- tanh near 0: WGSL's builtin tanh has only absolute accuracy there on lavapipe
# (tanh(1e-12) = 2.98e-8); tensorgrad's kernel must keep relative accuracy.


class _Nothing(tg.Module):
    def __init__(self) -> None:
        self.unused = self.param((1,))


def test_tanh_is_accurate_near_zero(gpu_device) -> None:
    xs = np.array([1e-12, -1e-9, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.5], np.float32)

    async def go() -> np.ndarray:
        f = await tg.compile_forward(model=_Nothing(), forward=lambda m, x: tg.tanh(x),
                                     inputs={"x": (len(xs),)}, seed=1, device=gpu_device)
        out = (await f.run(x=xs)).output
        f.destroy()
        return out

    out = run(go())
    np.testing.assert_allclose(out, np.tanh(xs.astype(np.float64)), rtol=1e-5, atol=0)


def test_deep_default_init_grads_match_reference(gpu_device) -> None:
    async def go() -> None:
        train = await tg.compile(model=DeepMLP(scale=0.02), loss=deep_loss,
                                 inputs=DEEP_INPUTS, optimizer=tg.optim.Adam(lr=1e-2),
                                 seed=31, device=gpu_device)
        d = deep_data()
        p = await train.download_params()
        await train.step(**d)
        values = ref_values(train, {**p, **d})
        grads = await train.download_param_grads()
        for name, gid in grad_ids(train).items():
            assert_scaled_close(f"grad of {name}", grads[name], values[gid], 1e-3)
        train.destroy()

    run(go())
