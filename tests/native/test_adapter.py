"""The native adapter (tensorgrad.gpu.native) against the GPUDevice contract, on a real device."""

from __future__ import annotations

import asyncio
import copy
import os

import numpy as np
import pytest

from tensorgrad.codegen.kernel import Target
from tensorgrad.errors import ShaderCompileError
from tensorgrad.gpu.interface import WANTED_FEATURES, AdapterInfo, Copy, Dispatch
from tensorgrad.gpu.native import NativeDevice

ADD = """
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&c)) { c[g.x] = a[g.x] + b[g.x]; }
}
"""

# y = 0.5 * x + k, k baked in per kernel, so the order of dispatches shows in the result.
AFFINE = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&y)) { y[g.x] = 0.5 * x[g.x] + K; }
}
"""

FILL = """
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&y)) { y[g.x] = VALUE; }
}
"""

# One thread per element over a 2D grid of workgroups: linear id = x + y * (groups in x).
IOTA_2D = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 64u + lid;
    if (i < arrayLength(&out)) { out[i] = i * 3u + 1u; }
}
"""


def run(coro):
    return asyncio.run(coro)


def f32(data) -> np.ndarray:
    return np.frombuffer(bytes(data), np.float32)


def split_workgroups(n: int, max_per_dim: int) -> tuple[int, int, int]:
    """`n` workgroups as an (x, y, 1) grid within the per-dimension limit."""
    if n <= max_per_dim:
        return (n, 1, 1)
    y = -(-n // max_per_dim)
    return (-(-n // y), y, 1)


def test_limits_and_description(gpu_device: NativeDevice) -> None:
    lim = gpu_device.limits
    assert 0 < lim.max_buffer_size <= 2_147_483_644
    assert 0 < lim.max_storage_buffer_binding_size <= lim.max_buffer_size
    assert lim.max_storage_buffers_per_shader_stage >= 8
    assert lim.max_compute_invocations_per_workgroup >= 256
    assert lim.max_compute_workgroups_per_dimension >= 65_535
    assert gpu_device.description


def test_device_reports_its_kind_and_features(gpu_device: NativeDevice) -> None:
    info = gpu_device.info
    cpu = str(gpu_device.adapter_info.get("adapter_type", "")).lower() == "cpu"
    assert info.software == cpu
    assert info.features <= set(WANTED_FEATURES)
    # only what the device enabled is reported: WGSL may then use it
    enabled = {"subgroups" if f == "subgroup" else f for f in gpu_device.device.features}
    assert info.features == enabled & set(WANTED_FEATURES)
    # code generation reads the kind: software targets never emit barrier-heavy tiles
    target = Target.for_device(gpu_device.limits, info)
    assert target.software == info.software and target.features == info.features


def test_add_arrays(gpu_device: NativeDevice) -> None:
    dev = gpu_device
    n = 1000  # not a multiple of the workgroup size
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    bufs = [dev.create_buffer(4 * n, name) for name in "abc"]
    kernel = dev.create_kernel(ADD, "add")
    program = dev.create_program([Dispatch(kernel, tuple(bufs), (16, 1, 1), "add")], 0)
    (out,) = run(dev.execute(program, [(bufs[0], a), (bufs[1], b)], [(bufs[2], 4 * n)]))
    np.testing.assert_array_equal(f32(out), a + b)
    # Same program, new inputs: bind groups made once stay valid.
    (out,) = run(dev.execute(program, [(bufs[0], b), (bufs[1], b)], [(bufs[2], 4 * n)]))
    np.testing.assert_array_equal(f32(out), b + b)
    for buf in bufs:
        dev.destroy_buffer(buf)


def test_dispatch_2d_past_the_x_limit(gpu_device: NativeDevice) -> None:
    dev = gpu_device
    max_x = dev.limits.max_compute_workgroups_per_dimension
    groups = max_x + 4465  # more workgroups than one dimension allows
    n = groups * 64 - 5
    grid = split_workgroups(groups, max_x)
    assert grid[1] > 1 and grid[0] <= max_x
    out = dev.create_buffer(4 * n, "iota")
    program = dev.create_program([Dispatch(dev.create_kernel(IOTA_2D, "iota"), (out,), grid)], 0)
    (data,) = run(dev.execute(program, [], [(out, 4 * n)]))
    got = np.frombuffer(bytes(data), np.uint32)
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.uint32) * 3 + 1)
    with pytest.raises(ValueError, match="workgroups"):
        dev.create_program([Dispatch(dev.create_kernel(IOTA_2D, "iota"), (out,),
                                     (max_x + 1, 1, 1), "too-wide")], 0)
    dev.destroy_buffer(out)


def _long_program(dev: NativeDevice, chunk_size: int, n: int, steps: int = 120):
    """`steps` affine dispatches ping-ponging between two buffers (a different constant every
    7), with a snapshot copy into `history` every 10 steps."""
    kernels = [dev.create_kernel(AFFINE.replace("K", f"{k}.0"), f"affine{k}") for k in range(7)]
    bufs = [dev.create_buffer(4 * n, f"x{i}") for i in range(2)]
    history = dev.create_buffer(4 * n * (steps // 10), "history")
    program_steps: list[Dispatch | Copy] = []
    for i in range(steps):
        src, dst = bufs[i % 2], bufs[(i + 1) % 2]
        program_steps.append(Dispatch(kernels[i % 7], (src, dst), (-(-n // 64), 1, 1), f"s{i}"))
        if i % 10 == 9:
            program_steps.append(Copy(dst, history, 4 * n, dst_offset=4 * n * (i // 10)))
    program = dev.create_program(program_steps, chunk_size)
    return program, bufs, history


@pytest.mark.parametrize("chunk_size", [0, 1, 7, 32])
def test_long_program_same_result_for_any_chunking(gpu_device: NativeDevice,
                                                   chunk_size: int) -> None:
    dev, n, steps = gpu_device, 300, 120
    x0 = np.linspace(-50, 50, n, dtype=np.float32)
    program, bufs, history = _long_program(dev, chunk_size, n, steps)
    assert program.n_dispatches == steps
    expected_chunks = 1 if chunk_size == 0 else -(-steps // chunk_size)
    assert len(program.chunks) == expected_chunks
    final, hist = run(dev.execute(program, [(bufs[0], x0)],
                                  [(bufs[steps % 2], 4 * n), (history, 4 * n * (steps // 10))]))
    # Reference in float64: the GPU may fuse 0.5 * x + k, so compare with a tolerance.
    x, want_hist = x0.astype(np.float64), []
    for i in range(steps):
        x = 0.5 * x + (i % 7)
        if i % 10 == 9:
            want_hist.append(x.copy())
    np.testing.assert_allclose(f32(final), x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(f32(hist).reshape(-1, n), np.array(want_hist), rtol=1e-6,
                               atol=1e-6)
    # Bit-identical across chunkings: compare with the unchunked run.
    if chunk_size:
        base, base_bufs, base_hist = _long_program(dev, 0, n, steps)
        ref_final, ref_hist = run(dev.execute(
            base, [(base_bufs[0], x0)],
            [(base_bufs[steps % 2], 4 * n), (base_hist, 4 * n * (steps // 10))]))
        assert bytes(final) == bytes(ref_final)
        assert bytes(hist) == bytes(ref_hist)


def test_raw_and_wrapped_encoding_give_the_same_result(gpu_device: NativeDevice,
                                                       monkeypatch) -> None:
    """Dispatches encoded through wgpu-native's entry points on prepared handles (the
    default) and through wgpu-py's methods (TENSORGRAD_SAFE_ENCODE=1) compute the same."""
    dev, n, steps = gpu_device, 200, 60
    assert dev._raw is not None, "wgpu-py's internals moved: the fast encoder is off"
    x0 = np.arange(n, dtype=np.float32)
    results = []
    for raw in (dev._raw, None):
        monkeypatch.setattr(dev, "_raw", raw)
        program, bufs, _ = _long_program(dev, 7, n, steps)
        (out,) = run(dev.execute(program, [(bufs[0], x0)], [(bufs[steps % 2], 4 * n)]))
        results.append(bytes(out))
    assert results[0] == results[1]
    x = x0.astype(np.float64)
    for i in range(steps):
        x = 0.5 * x + (i % 7)
    np.testing.assert_allclose(f32(results[0]), x, rtol=1e-6, atol=1e-6)


def test_fence_wait_mode_gives_the_same_result(gpu_device: NativeDevice, monkeypatch) -> None:
    """The portable fallback (a mapped 4-byte fence per submission) instead of the queue's
    work-done notification."""
    dev, n, steps = gpu_device, 200, 50
    x0 = np.arange(n, dtype=np.float32)
    results = []
    for mode in (dev.wait_mode, "fence"):
        monkeypatch.setattr(dev, "wait_mode", mode)
        if mode == "fence":
            monkeypatch.setattr(dev, "_native_done", None)
        program, bufs, _ = _long_program(dev, 3, n, steps)
        (out,) = run(dev.execute(program, [(bufs[0], x0)], [(bufs[steps % 2], 4 * n)]))
        results.append(bytes(out))
    assert results[0] == results[1]
    assert dev._fences, "fence buffers are pooled after use"


def test_bounded_work_in_flight(gpu_device: NativeDevice, monkeypatch) -> None:
    """Chunk i + 1 is submitted before chunk i is waited for; never more than 2 outstanding."""
    dev, n = gpu_device, 256
    program, bufs, _ = _long_program(dev, 1, n, 40)
    events: list[str] = []
    real_submit = dev.queue.submit

    class QueueSpy:
        def __getattr__(self, name):
            return getattr(dev.queue_real, name)

        def submit(self, command_buffers):
            events.append("submit")
            real_submit(command_buffers)

    real_wait = dev._wait

    async def wait_spy(done, fence):
        await real_wait(done, fence)
        events.append("done")

    monkeypatch.setattr(dev, "queue_real", dev.queue, raising=False)
    monkeypatch.setattr(dev, "queue", QueueSpy())
    monkeypatch.setattr(dev, "_wait", wait_spy)
    run(dev.execute(program, [], [(bufs[0], 4 * n)]))
    outstanding = peak = 0
    for event in events:
        outstanding += 1 if event == "submit" else -1
        peak = max(peak, outstanding)
    assert events.count("submit") >= 40
    assert peak == 2, events[:8]
    assert events[:3] == ["submit", "submit", "done"]


def test_bad_wgsl_raises_shader_compile_error(gpu_device: NativeDevice) -> None:
    bad = ADD.replace("a[g.x] + b[g.x]", "a[g.x] + undefined_thing")
    with pytest.raises(ShaderCompileError) as info:
        gpu_device.create_kernel(bad, "my_broken_add")
    err = info.value
    text = str(err)
    assert err.label == "my_broken_add" and "my_broken_add" in text
    assert "   1 | " in text and "undefined_thing" in text  # numbered WGSL lines
    assert err.messages and all(m in text for m in err.messages)
    assert "undefined_thing" in "\n".join(err.messages)  # the compiler's own words


def test_pipeline_error_raises_shader_compile_error(gpu_device: NativeDevice) -> None:
    no_main = ADD.replace("fn main(", "fn not_main(")
    with pytest.raises(ShaderCompileError) as info:
        gpu_device.create_kernel(no_main, "no_entry_point")
    assert "no_entry_point" in str(info.value) and info.value.messages


@pytest.mark.parametrize("chunk_size", [0, 1])
def test_copies_run_in_order_with_dispatches(gpu_device: NativeDevice, chunk_size: int) -> None:
    dev, n = gpu_device, 100
    fill = {v: dev.create_kernel(FILL.replace("VALUE", f"{v}.0"), f"fill{v}") for v in (1, 2, 3)}
    a, b, c, d = (dev.create_buffer(4 * n, name) for name in "abcd")
    wg = (2, 1, 1)
    program = dev.create_program([
        Dispatch(fill[1], (a,), wg), Copy(a, b, 4 * n),
        Dispatch(fill[2], (a,), wg), Copy(a, c, 4 * n),
        Dispatch(fill[3], (a,), wg), Copy(a, d, 2 * n),  # half of d only
        Copy(b, d, 4 * 10, src_offset=0, dst_offset=4 * (n - 10)),
    ], chunk_size)
    outs = run(dev.execute(program, [], [(b, 4 * n), (c, 4 * n), (d, 4 * n), (a, 4 * n)]))
    b_, c_, d_, a_ = (f32(o) for o in outs)
    assert (b_ == 1).all() and (c_ == 2).all() and (a_ == 3).all()
    np.testing.assert_array_equal(d_[: n // 2], 3)
    np.testing.assert_array_equal(d_[n // 2: n - 10], 0)  # buffers start zeroed
    np.testing.assert_array_equal(d_[n - 10:], 1)


def test_read_buffers_round_trip(gpu_device: NativeDevice) -> None:
    dev = gpu_device
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, 4096, np.uint8).tobytes()
    buf, other = dev.create_buffer(len(data), "bytes"), dev.create_buffer(64, "other")
    dev.write_buffer(buf, data)
    dev.write_buffer(other, b"\x01\x02\x03\x04\x05\x06")  # not a multiple of 4: padded
    dev.write_buffer(buf, b"\xff" * 8, offset=16)
    full, part, small = run(dev.read_buffers([(buf, len(data)), (buf, 10), (other, 6)]))
    want = data[:16] + b"\xff" * 8 + data[24:]
    assert bytes(full) == want
    assert bytes(part) == want[:10] and len(part) == 10
    assert bytes(small) == b"\x01\x02\x03\x04\x05\x06"
    # Reads come back as fresh host memory, also through execute, many times over.
    empty = dev.create_program([], 0)
    for _ in range(3):
        (again,) = run(dev.execute(empty, [], [(buf, len(data))]))
        assert bytes(again) == want
    assert run(dev.execute(empty, [(other, b"\0" * 8)], [])) == []
    assert run(dev.read_buffers([])) == []
    dev.destroy_buffer(buf)
    dev.destroy_buffer(other)


def test_readback_buffers_are_pooled_within_bounds(gpu_device: NativeDevice) -> None:
    """Reads of many sizes share a few pooled readback buffers (size classes of powers of
    two), the pool keeps at most STAGING_KEPT of them and STAGING_KEPT_BYTES together, and a
    one-off read larger than that does not stay."""
    from tensorgrad.gpu.native import STAGING_KEPT, STAGING_KEPT_BYTES

    dev = gpu_device
    # The device's other staging buffers (the fence's source, fences pooled by earlier tests'
    # submissions) are not readback buffers: count them once, before.
    others = dev.live_objects()["staging"] - len(dev._staging)
    big = STAGING_KEPT_BYTES + (16 << 20)
    buf = dev.create_buffer(big, "big")
    for n in [4 * k for k in range(1, 300, 7)] + [1 << k for k in range(10, 24)]:
        (got,) = run(dev.read_buffers([(buf, n)]))
        assert len(got) == n and not any(got)
        assert len(dev._staging) <= STAGING_KEPT
        # (+1: a fence's source made on first use)
        assert dev.live_objects()["staging"] <= others + STAGING_KEPT + 1, dev.live_objects()
    run(dev.read_buffers([(buf, big)]))
    assert sum(b.size for b in dev._staging) <= STAGING_KEPT_BYTES
    assert dev.live_objects()["staging"] <= others + STAGING_KEPT + 1
    dev.destroy_buffer(buf)


def test_bind_error_names_the_dispatch(gpu_device: NativeDevice) -> None:
    dev = gpu_device
    kernel = dev.create_kernel(ADD, "add")
    buf = dev.create_buffer(16, "x")
    with pytest.raises(ValueError, match="lonely"):
        dev.create_program([Dispatch(kernel, (buf,), (1, 1, 1), "lonely")], 0)
    dev.destroy_buffer(buf)


def test_compile_picks_kernels_by_the_device_kind(gpu_device: NativeDevice) -> None:
    import tensorgrad as tg

    class Wide(tg.Module):
        def __init__(self):
            self.l = tg.Linear(64, 64)

    def loss(m, x):
        return tg.mean(m.l(x))

    async def kernels(info: AdapterInfo) -> list[str]:
        device = copy.copy(gpu_device)
        device.info = info
        train = await tg.compile(model=Wide(), loss=loss, inputs={"x": (64, 64)},
                                 optimizer=tg.optim.SGD(lr=0.1), device=device, seed=0)
        out = [k.wgsl for n, k in zip(train.ir.nodes, train._exe.kernels)
               if n.op == "matmul" and "workgroupBarrier" in k.wgsl]
        train.destroy()
        return out

    assert run(kernels(AdapterInfo(software=True))) == []     # matmuls without barrier tiles
    assert run(kernels(AdapterInfo(software=False)))          # tiled matmuls


@pytest.mark.parametrize("name", ["add", "slices", "copies_in_order", "bad_wgsl",
                                  "kernel_batch", "release"])
def test_the_browser_adapter_checks_pass_natively(gpu_device: NativeDevice, name: str) -> None:
    from tests.browser.adapter_checks import CHECKS

    run(CHECKS[name](gpu_device))


@pytest.mark.parametrize("checks", [True, False])
def test_kernels_with_other_runtime_checks_compute_the_same(gpu_device: NativeDevice,
                                                           checks: bool) -> None:
    """The default device compiles its kernels with bounds checks only ("bounds"); one with
    wgpu's loop counters as well (True), or with neither (False), trains the MLP to the
    same bits, and its GPU-target kernels (tiled matmuls, row teams, with prologues and
    epilogues) match the reference interpreter."""
    from tensorgrad.gpu.native import request_native_device
    from tests.kernel_check import check_graph_kernels
    from tests.models import demo
    from tests.native.test_fusion import train_losses
    from tests.native.test_stitch import CASES, _stitched

    other = run(request_native_device(runtime_checks=checks))
    try:
        assert other.runtime_checks is checks
        assert other.description.endswith(", bounds checks and loop counters" if checks
                                          else ", no runtime checks")
        if "TENSORGRAD_RUNTIME_CHECKS" not in os.environ:  # the session device: the default
            assert gpu_device.runtime_checks == "bounds"
            assert not gpu_device.description.endswith(("checks", "counters"))
        mod = demo("mlp_sin")
        default_losses, _ = run(train_losses(gpu_device, mod, mod.MLP(), True, 6))
        other_losses, _ = run(train_losses(other, mod, mod.MLP(), True, 6))
        assert other_losses == default_losses
        gpu_target = Target(limits=other.limits, software=False)
        for case in CASES:
            b, graph = _stitched(case)
            run(check_graph_kernels(other, graph, b.values, target=gpu_target))
    finally:
        other.destroy()


def test_runtime_checks_off_is_refused_clearly_where_it_cannot_work(monkeypatch) -> None:
    from tensorgrad.gpu import native

    with pytest.raises(ValueError, match=r"runtime_checks=False needs wgpu-native's trusted "
                                         r"shader modules, which the 'wgpudawn' backend"):
        native.trusted_module_maker("wgpudawn")
    with pytest.raises(ValueError, match=r"runtime_checks='bounds' needs wgpu-native's "):
        native.trusted_module_maker("wgpudawn", "bounds")
    with pytest.raises(TypeError, match=r"runtime_checks must be True, False, 'bounds' or None, "
                                        r"got 'no'"):
        run(native.request_native_device(runtime_checks="no"))
    monkeypatch.setenv("TENSORGRAD_RUNTIME_CHECKS", "maybe")
    with pytest.raises(ValueError, match=r"TENSORGRAD_RUNTIME_CHECKS='maybe': expected 1"):
        run(native.request_native_device())
    for value, want in (("0", False), ("off", False), ("1", True), ("on", True), ("", None),
                        ("bounds", "bounds"), (" Bounds", "bounds")):
        monkeypatch.setenv("TENSORGRAD_RUNTIME_CHECKS", value)
        assert native._runtime_checks_default() == want
    # unset: bounds checks only where wgpu-native compiles so, all checks on wgpudawn
    assert native._default_checks("wgpu") == "bounds"
    assert native._default_checks("wgpudawn") is True
