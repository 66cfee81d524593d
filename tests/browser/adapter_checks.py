"""GPU adapter checks over the GPUDevice interface, with no NumPy and no pytest.

The browser tests send this file's source to the worker (``exec``) and await each check there
against the ``navigator.gpu`` adapter; the same checks run natively in CPython when a native
adapter exists. Each check raises AssertionError on failure and returns a small dict of facts.
"""

from __future__ import annotations

import time
from array import array
from typing import Any

from tensorgrad.errors import ShaderCompileError
from tensorgrad.gpu.interface import BufferSlice, Copy, Dispatch

ADD_WGSL = """
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i < arrayLength(&out)) {
    out[i] = a[i] + b[i];
  }
}
"""

# out[i] = i over a 2D grid of workgroups (x, y): i = (wg.y * nwg.x + wg.x) * 64 + local.
INDEX_2D_WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
  let i = (wg.y * nwg.x + wg.x) * 64u + local;
  if (i < arrayLength(&out)) {
    out[i] = i;
  }
}
"""

# x = x * M + C (mod 2^32), in place: order-sensitive and exact.
AFFINE_WGSL = """
@group(0) @binding(0) var<storage, read_write> x: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i < arrayLength(&x)) {
    x[i] = x[i] * {M}u + {C}u;
  }
}
"""

BAD_WGSL = """
@group(0) @binding(0) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  x[gid.x] = undefined_name * 2.0;
}
"""

AFFINES = ((3, 1), (5, 2), (7, 11))


def _affine_kernels(dev: Any) -> list[Any]:
    return [dev.create_kernel(AFFINE_WGSL.replace("{M}", str(m)).replace("{C}", str(c)),
                              f"affine_{m}_{c}") for m, c in AFFINES]


def _affine_steps(kernels: list[Any], x: Any, snapshot: Any, n: int, count: int,
                  wgs: int) -> tuple[list[Dispatch | Copy], list[int]]:
    """`count` affine dispatches on x (kernel i % 3, i // 3 % 2 stretches), with a copy of x[0]
    into snapshot[k] after every 10th dispatch; the expected snapshot values."""
    steps: list[Dispatch | Copy] = []
    value, expected = 1, []
    for i in range(count):
        k = (i + i // 3) % len(kernels)
        steps.append(Dispatch(kernels[k], (x,), (wgs, 1, 1), f"affine{i}"))
        m, c = AFFINES[k]
        value = (value * m + c) & 0xFFFFFFFF
        if i % 10 == 9:
            steps.append(Copy(x, snapshot, 4, 0, 4 * len(expected)))
            expected.append(value)
    return steps, expected


async def check_add(dev: Any) -> dict[str, Any]:
    """A 1-D add kernel: out = a + b."""
    n = 1000
    a = array("f", [float(i) for i in range(n)])
    b = array("f", [0.5 * i for i in range(n)])
    bufs = [dev.create_buffer(4 * n, name) for name in ("a", "b", "out")]
    kernel = dev.create_kernel(ADD_WGSL, "add")
    program = dev.create_program([Dispatch(kernel, tuple(bufs), (-(-n // 64), 1, 1), "add")], 0)
    (out,) = await dev.execute(program, [(bufs[0], a), (bufs[1], b)], [(bufs[2], 4 * n)])
    got = out.cast("f")
    assert got.tolist() == [1.5 * i for i in range(n)], got.tolist()[:8]
    for buf in bufs:
        dev.destroy_buffer(buf)
    return {"n": n}


async def check_slices(dev: Any) -> dict[str, Any]:
    """Slices of one buffer bound, written and read at 256-byte aligned offsets: a and b read
    from one buffer, the sum written into a second buffer's middle slice."""
    n = 100
    a = array("f", [float(i) for i in range(n)])
    b = array("f", [2.0 * i for i in range(n)])
    src = dev.create_buffer(1024 + 4 * n, "ab")
    dst = dev.create_buffer(2048, "out")
    sa, sb = BufferSlice(src, 0, 4 * n), BufferSlice(src, 1024, 4 * n)
    so = BufferSlice(dst, 512, 4 * n)
    dev.write_buffer(sb, b)  # a slice write
    kernel = dev.create_kernel(ADD_WGSL, "add")
    program = dev.create_program([Dispatch(kernel, (sa, sb, so), (-(-n // 64), 1, 1), "add")], 0)
    out, whole = await dev.execute(program, [(sa, a)], [(so, 4 * n), (dst, 2048)])
    assert out.cast("f").tolist() == [3.0 * i for i in range(n)], out.cast("f").tolist()[:8]
    rest = whole.cast("f").tolist()
    assert rest[128:128 + n] == [3.0 * i for i in range(n)]
    assert not any(rest[:128]) and not any(rest[128 + n:]), "a write outside its slice"
    (again,) = await dev.read_buffers([(BufferSlice(src, 1024, 8), 8)])
    assert again.cast("f").tolist() == [0.0, 2.0]
    for buf in (src, dst):
        dev.destroy_buffer(buf)
    return {"n": n}


async def check_dispatch_2d(dev: Any) -> dict[str, Any]:
    """More than 65535 workgroups, dispatched as a 2D grid."""
    limit = dev.limits.max_compute_workgroups_per_dimension
    groups = limit + 1000
    n = groups * 64 - 5
    grid = (limit, -(-groups // limit), 1)
    out = dev.create_buffer(4 * n, "out")
    kernel = dev.create_kernel(INDEX_2D_WGSL, "index_2d")
    program = dev.create_program([Dispatch(kernel, (out,), grid, "index_2d")], 0)
    (data,) = await dev.execute(program, [], [(out, 4 * n)])
    assert bytes(data) == array("I", range(n)).tobytes(), "2D dispatch missed or repeated items"
    dev.destroy_buffer(out)
    return {"workgroups": groups, "grid": list(grid), "items": n}


async def check_chunking(dev: Any, count: int = 150,
                         chunk_sizes: tuple[int, ...] = (0, 1, 7, 32)) -> dict[str, Any]:
    """A >100-dispatch program with copies gives the same result for every chunk size."""
    n, wgs = 256, 4
    x = dev.create_buffer(4 * n, "x")
    snapshot = dev.create_buffer(4 * (count // 10), "snapshot")
    kernels = _affine_kernels(dev)
    steps, expected = _affine_steps(kernels, x, snapshot, n, count, wgs)
    final = expected[-1] if count % 10 == 0 else None
    results = {}
    for chunk in chunk_sizes:
        program = dev.create_program(steps, chunk)
        xs, snaps = await dev.execute(program, [(x, array("I", [1] * n))],
                                      [(x, 4 * n), (snapshot, 4 * len(expected))])
        assert snaps.cast("I").tolist() == expected, (chunk, snaps.cast("I").tolist()[:4])
        if final is not None:
            assert set(xs.cast("I").tolist()) == {final}, chunk
        results[chunk] = bytes(xs) + bytes(snaps)
    assert len(set(results.values())) == 1, "results differ between chunk sizes"
    dev.destroy_buffer(x)
    dev.destroy_buffer(snapshot)
    return {"dispatches": count, "copies": len(expected), "chunk_sizes": list(chunk_sizes)}


async def check_copies_in_order(dev: Any) -> dict[str, Any]:
    """Copies see exactly the dispatches encoded before them, and copies chain in order."""
    n = 64
    x = dev.create_buffer(4 * n, "x")
    first, second, chained = (dev.create_buffer(4 * n, name) for name in ("c1", "c2", "c3"))
    (k3, k5, _) = _affine_kernels(dev)
    steps = [Dispatch(k3, (x,), (1, 1, 1), "x*3+1"), Copy(x, first, 4 * n),
             Dispatch(k5, (x,), (1, 1, 1), "x*5+2"), Copy(x, second, 4 * n),
             Copy(first, chained, 4 * n)]
    for chunk in (0, 1):
        program = dev.create_program(steps, chunk)
        got = await dev.execute(program, [(x, array("I", [2] * n))],
                                [(first, 4 * n), (second, 4 * n), (chained, 4 * n)])
        one, two, three = (set(g.cast("I").tolist()) for g in got)
        assert one == {7} and two == {37} and three == {7}, (chunk, one, two, three)
    for buf in (x, first, second, chained):
        dev.destroy_buffer(buf)
    return {"values": [7, 37, 7]}


async def check_bad_wgsl(dev: Any) -> dict[str, Any]:
    """Invalid WGSL raises ShaderCompileError naming the kernel, with numbered lines and the
    compiler's message."""
    try:
        dev.create_kernel(BAD_WGSL, "my_bad_kernel")
        check = getattr(dev, "check_kernels", None)
        if check is not None:
            await check()
    except ShaderCompileError as err:
        text = str(err)
        assert "my_bad_kernel" in text, text
        assert "   6 |   x[gid.x] = undefined_name * 2.0;" in text, text
        assert "undefined_name" in "\n".join(err.messages), err.messages
        assert err.label == "my_bad_kernel" and err.wgsl == BAD_WGSL
        return {"messages": err.messages}
    raise AssertionError("invalid WGSL compiled without ShaderCompileError")


async def check_kernel_batch(dev: Any) -> dict[str, Any]:
    """create_kernels compiles a batch in order (each kernel runs as its WGSL says), and a
    bad kernel in a batch raises ShaderCompileError naming that kernel, not its neighbours."""
    n = 256
    affines = [AFFINE_WGSL.replace("{M}", str(m)).replace("{C}", str(c)) for m, c in AFFINES]
    kernels = dev.create_kernels([(w, f"affine{k}") for k, w in enumerate(affines)])
    assert len(kernels) == len(AFFINES), kernels
    x = dev.create_buffer(4 * n, "x")
    expected = [0] * n
    for kernel, (m, c) in zip(kernels, AFFINES):
        program = dev.create_program([Dispatch(kernel, (x,), (n // 64, 1, 1), "affine")], 0)
        (got,) = await dev.execute(program, [], [(x, 4 * n)])
        expected = [(v * m + c) % 2**32 for v in expected]
        assert got.cast("I").tolist() == expected, (m, c, got.cast("I").tolist()[:4])
    dev.destroy_buffer(x)
    try:
        dev.create_kernels([(affines[0], "good_first"), (BAD_WGSL, "bad_in_batch"),
                            (affines[1], "good_last")])
        check = getattr(dev, "check_kernels", None)
        if check is not None:
            await check()
    except ShaderCompileError as err:
        assert err.label == "bad_in_batch" and err.wgsl == BAD_WGSL, err.label
        assert "undefined_name" in "\n".join(err.messages), err.messages
        return {"kernels": len(kernels), "messages": err.messages}
    raise AssertionError("a batch with invalid WGSL compiled without ShaderCompileError")


LIVE_KINDS = ("buffers", "pipelines", "programs")


def _live(dev: Any) -> dict[str, int]:
    live = dev.live_objects()
    return {k: live[k] for k in LIVE_KINDS}


async def check_release(dev: Any) -> dict[str, Any]:
    """destroy_program and destroy_kernel release what create_program and create_kernel(s)
    made: live_objects() counts them and comes back to where it was (a second destroy changes
    nothing), and a batch with a bad kernel leaves none of its pipelines live."""
    base = _live(dev)
    n = 64
    x = dev.create_buffer(4 * n, "x")
    kernels = _affine_kernels(dev)
    program = dev.create_program([Dispatch(k, (x,), (1, 1, 1), f"affine{i}")
                                  for i, k in enumerate(kernels)], 1)
    (got,) = await dev.execute(program, [(x, array("I", [0] * n))], [(x, 4 * n)])
    value = 0
    for m, c in AFFINES:
        value = (value * m + c) % 2**32
    assert set(got.cast("I").tolist()) == {value}, got.cast("I").tolist()[:4]
    made = {k: v - base[k] for k, v in _live(dev).items()}
    assert made == {"buffers": 1, "pipelines": len(AFFINES), "programs": 1}, made
    for _ in range(2):
        dev.destroy_program(program)
        for kernel in kernels:
            dev.destroy_kernel(kernel)
    dev.destroy_buffer(x)
    assert _live(dev) == base, (_live(dev), base)
    good = AFFINE_WGSL.replace("{M}", "3").replace("{C}", "1")
    try:
        dev.create_kernels([(good, "good_first"), (BAD_WGSL, "bad_in_batch")])
        check = getattr(dev, "check_kernels", None)
        if check is not None:
            await check()
    except ShaderCompileError:
        pass
    else:
        raise AssertionError("a batch with invalid WGSL compiled without ShaderCompileError")
    assert _live(dev) == base, ("a failed batch left pipelines live", _live(dev), base)
    return {"made": made, "live": _live(dev)}


async def ffi_calls_per_step(dev: Any, dispatches: int, steps: int = 3,
                             chunk_size: int = 32) -> dict[str, Any]:
    """FFI calls (and ms) per execute of an affine program of `dispatches` dispatches."""
    n = 256
    x = dev.create_buffer(4 * n, "x")
    kernels = _affine_kernels(dev)
    program_steps, _ = _affine_steps(kernels, x, x, n, dispatches, 4)
    program_steps = [s for s in program_steps if isinstance(s, Dispatch)]
    program = dev.create_program(program_steps, chunk_size)
    data = array("I", [1] * n)
    await dev.execute(program, [(x, data)], [(x, 4 * n)])  # warm-up
    before, t0 = dev.ffi_calls, time.perf_counter()
    for _ in range(steps):
        await dev.execute(program, [(x, data)], [(x, 4 * n)])
    ms = (time.perf_counter() - t0) * 1000 / steps
    calls = (dev.ffi_calls - before) / steps
    dev.destroy_buffer(x)
    return {"dispatches": dispatches, "ffi_calls": calls, "ms_per_step": round(ms, 2)}


CHECKS = {"add": check_add, "slices": check_slices, "dispatch_2d": check_dispatch_2d,
          "chunking": check_chunking,
          "copies_in_order": check_copies_in_order, "bad_wgsl": check_bad_wgsl,
          "kernel_batch": check_kernel_batch, "release": check_release}
