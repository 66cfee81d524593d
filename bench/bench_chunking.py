#!/usr/bin/env python3
"""Cost of chunked submission on the native device at hand.

    python bench/bench_chunking.py [--dispatches 1000] [--steps 20] [--kernels]

Prints ms/step of a program of ~1000 small dispatches (plus a copy every 50) run with
chunk_size 0 (one submission) and 32 (bounded work in flight), and the overhead of the
latter. `--kernels` also times a 256x256 matmul and a chain of 200 tiny elementwise
kernels (the numbers used to choose between lavapipe and SwiftShader: run it once with
and once without VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tensorgrad.gpu.interface import Copy, Dispatch
from tensorgrad.gpu.native import NativeDevice, request_native_device

AXPY = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&y)) { y[g.x] = 0.5 * x[g.x] + 1.0; }
}
"""

MATMUL = """
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
const N: u32 = 256u;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    var acc = 0.0;
    for (var k = 0u; k < N; k++) { acc += a[g.y * N + k] * b[k * N + g.x]; }
    c[g.y * N + g.x] = acc;
}
"""


def chain_program(dev: NativeDevice, n_dispatch: int, n: int, chunk: int, copy_every: int = 50):
    """A ping-pong chain of `n_dispatch` elementwise kernels over `n` floats."""
    kernel = dev.create_kernel(AXPY, "axpy")
    bufs = [dev.create_buffer(4 * n, f"b{i}") for i in range(3)]
    steps: list[Dispatch | Copy] = []
    for i in range(n_dispatch):
        src, dst = bufs[i % 2], bufs[(i + 1) % 2]
        steps.append(Dispatch(kernel, (src, dst), ((n + 63) // 64, 1, 1), f"axpy{i}"))
        if copy_every and i % copy_every == copy_every - 1:
            steps.append(Copy(dst, bufs[2], 4 * n))
    return dev.create_program(steps, chunk), bufs


async def time_steps(dev: NativeDevice, program, writes, reads, steps: int,
                     cpu: list[float] | None = None) -> list[float]:
    """Wall ms of each step; the process's CPU ms (all threads: a CPU adapter's too) go to
    `cpu`."""
    out = []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        await dev.execute(program, writes, reads)
        out.append((time.perf_counter() - t0) * 1e3)
        if cpu is not None:
            cpu.append((time.process_time() - c0) * 1e3)
    return out


async def bench_chunking(dev: NativeDevice, n_dispatch: int, steps: int, n: int) -> None:
    data = struct.pack(f"{n}f", *([1.0] * n))
    programs = {}
    for chunk in (0, 32):
        program, bufs = chain_program(dev, n_dispatch, n, chunk)
        programs[chunk] = (program, [(bufs[0], data)], [(bufs[n_dispatch % 2], 4 * n)])
        await time_steps(dev, *programs[chunk], 3)  # warm up
    times: dict[int, list[float]] = {0: [], 32: []}
    cpu: dict[int, list[float]] = {0: [], 32: []}
    for _ in range(steps):  # interleaved, so drifts hit both alike
        for chunk in (0, 32):
            times[chunk] += await time_steps(dev, *programs[chunk], 1, cpu[chunk])
    med = {c: statistics.median(t) for c, t in times.items()}
    low = {c: min(t) for c, t in times.items()}
    cpu_med = {c: statistics.median(t) for c, t in cpu.items()}
    n_sub = len(programs[32][0].chunks)
    print(f"{n_dispatch} dispatches over {n} floats, {steps} steps each (interleaved), "
          f"waits: {dev.wait_mode}")
    for chunk, what in ((0, "1 submission"), (32, f"{n_sub} submissions")):
        print(f"  chunk_size {chunk:2d}: median {med[chunk]:8.2f} ms/step, min {low[chunk]:8.2f},"
              f" CPU {cpu_med[chunk]:8.2f} ms/step ({what})")

    def pct(d: dict[int, float]) -> str:
        return f"{100 * (d[32] - d[0]) / d[0]:+.1f} %"

    print(f"  overhead of chunking: median {pct(med)}, min {pct(low)}, CPU {pct(cpu_med)}")


async def bench_kernels(dev: NativeDevice, steps: int) -> None:
    n = 256
    a, b, c = (dev.create_buffer(4 * n * n) for _ in range(3))
    dev.write_buffer(a, struct.pack(f"{n * n}f", *([1.0] * (n * n))))
    dev.write_buffer(b, struct.pack(f"{n * n}f", *([2.0] * (n * n))))
    kernel = dev.create_kernel(MATMUL, "matmul")
    mm = dev.create_program([Dispatch(kernel, (a, b, c), (n // 8, n // 8, 1))], 0)
    await time_steps(dev, mm, [], [(c, 4)], 2)
    t = statistics.median(await time_steps(dev, mm, [], [(c, 4)], steps))
    print(f"  256x256 matmul (naive, 8x8 workgroups): {t:8.2f} ms "
          f"({2 * n**3 / t / 1e6:.2f} GFLOP/s)")
    chain, bufs = chain_program(dev, 200, 1024, 0, copy_every=0)
    await time_steps(dev, chain, [], [(bufs[0], 4)], 2)
    t = statistics.median(await time_steps(dev, chain, [], [(bufs[0], 4)], steps))
    print(f"  chain of 200 elementwise kernels (1024 floats): {t:8.2f} ms "
          f"({1e3 * t / 200:.1f} us/dispatch)")


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dispatches", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--floats", type=int, default=4096)
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--backend", default=None, help="wgpu or wgpudawn")
    args = parser.parse_args(argv)
    dev = await request_native_device(args.backend)
    print(f"device: {dev.description}")
    try:
        if args.kernels:
            await bench_kernels(dev, args.steps)
        await bench_chunking(dev, args.dispatches, args.steps, args.floats)
    finally:
        dev.destroy()


if __name__ == "__main__":
    asyncio.run(main())
