"""The public async API on a native WebGPU device, part two: attached forwards and
`compile_forward`, model replacement and destroy, checkpoints, compile-time errors, chunked
dispatch and buffer reuse (results, inputs, params, state and LR: test_api.py).

Models are tiny (a 2-8-1 MLP, a 12-layer width-8 MLP for >100 kernels) so this stays fast on
a CPU Vulkan driver. Coroutines run with ``asyncio.run`` (see conftest.py).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad import compiler, runtime
from tensorgrad.errors import DeviceLimitError, ShaderCompileError
from tensorgrad.gpu.interface import DeviceLimits
from tensorgrad.plan import ARENA_KINDS, plan_buffers
from tests.models import DeepMLP, TinyMLP, grad_ids, updated_params
from tests.native.api_helpers import (
    B,
    bits,
    compile_tiny,
    data,
    mse,
    np_mlp,
    predict,
    ref_values,
    run,
)

# ---- attached forwards ---------------------------------------------------------------------

def test_a_destroyed_attached_forward_is_let_go(gpu_device) -> None:
    """A training that attaches and destroys forwards (one per UI interaction, say) holds
    none of them afterwards (it kept every one: host memory grew with each); destroying the
    training destroys those still attached."""
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        x = data(5, batch=3)["x"]
        for _ in range(5):
            fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
            assert (await fwd.run(x=x)).kind == "completed"
            fwd.destroy()
        kept = await train.attach(forward=predict, inputs={"x": (None, 2)})
        assert repr(train).endswith(" 1 attached forward>"), repr(train)
        train.destroy()
        assert (await kept.run(x=x)).kind == "aborted"

    run(go())


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


def test_replace_model_then_destroy_builds_nothing(gpu_device) -> None:
    """destroy() called while a replace_model waits its turn: the rebuild raises AbortError
    instead of building a graph on the destroyed handle (its buffers and program leaked)."""
    async def go() -> None:
        before = gpu_device.live_objects()
        train = await compile_tiny(gpu_device)
        pending = train.replace_model(TinyMLP(hidden=4), seed=2)
        train.destroy()
        with pytest.raises(tg.errors.AbortError, match="replace_model: the training was "
                           "destroyed before the new model was built"):
            await pending
        after = gpu_device.live_objects()
        assert (after["buffers"], after["programs"]) == (before["buffers"], before["programs"])

    run(go())


def test_output_shape_before_a_rebuild_leaves_no_executable_on_the_old_params(
        gpu_device) -> None:
    """output_shape (it compiles, outside the call queue) asked between replace_model and
    its rebuild compiles for the model still in place; the runs after the rebuild use the new
    params. (The old params' executable stayed cached: its next run submitted a destroyed
    buffer, which wgpu-native answers by aborting the process.)"""
    async def go() -> None:
        train = await compile_tiny(gpu_device)
        fwd = await train.attach(forward=predict, inputs={"x": (None, 2)})
        xs = data(17, batch=3)["x"]
        pending = train.replace_model(TinyMLP(hidden=5), seed=3)
        assert fwd.output_shape(x=xs) == (3, 1)  # the model in place: the old one
        await pending
        out = await fwd.run(x=xs)
        assert out.kind == "completed", out
        p = await train.download_params()
        assert p["l1.W"].shape == (2, 5)
        np.testing.assert_allclose(out.output, np_mlp(p, xs), rtol=1e-5, atol=1e-6)
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

    def broken(graph, target, ops, views=frozenset()):
        kernels = real(graph, target, ops, views)
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

    def broken(graph, target, ops, views=frozenset()):
        kernels = real_emit(graph, target, ops, views)
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
        assert kernels > 2 * 32  # at least three chunks at the largest chunk size below
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
        assert all(len(b.nodes) == 1 for b in flat_plan.buffers if b.kind not in ARENA_KINDS)
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
        assert train.kernel_count > 64
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
        updated = updated_params(train, values)
        assert set(updated) == set(train.param_names)
        for name, gid in grad_ids(train).items():
            g = values[gid]
            ok = np.abs(g) > 1e-4 * np.max(np.abs(g))
            np.testing.assert_allclose(new[name][ok], updated[name][ok], rtol=1e-5,
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
