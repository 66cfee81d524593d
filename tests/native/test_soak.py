"""Compile / step / destroy cycles natively: every GPU buffer made is freed, no pipeline is
compiled twice, memory does not grow (bench/soak.py runs 1,000 cycles); destroyed handles and
evicted forward shapes give back every GPU object they held (buffers, programs, pipelines),
so the device's live objects come back to their baseline (bench/soak.py: RSS and live
objects over 500 distinct models and 500 batch sizes)."""

from __future__ import annotations

import array
import asyncio
from collections.abc import Iterator

import pytest

import tensorgrad as tg
from tensorgrad import runtime
from tests.soak import SoakMLP, WideMLP, live_objects, soak, soak_loss

MEMORY_GROWTH_BOUND = 32 * 2**20  # over 150 cycles after the warm-up
KINDS = ("buffers", "pipelines", "programs")


def test_cycles_free_everything_they_make(gpu_device) -> None:
    report = asyncio.run(soak(gpu_device, 160))
    print(f"\nsoak: {report}")
    assert report["buffers_live_delta"] == 0 and report["buffers_created"] >= 160 * 10
    assert report["memory_growth"] < MEMORY_GROWTH_BOUND, report


def live(device) -> dict[str, int]:
    got = live_objects(device)
    return {k: got[k] for k in KINDS}


@pytest.fixture
def no_unused_pipelines(gpu_device) -> Iterator[None]:
    """The device's pipeline cache keeps no unused pipeline while the test runs (so released
    pipelines show in the live count at once); restored after."""
    cache = runtime.pipeline_cache(gpu_device)
    keep, cache.keep = cache.keep, 0
    cache.release(())  # trims what earlier tests left unused
    yield
    cache.keep = keep


X = array.array("f", [0.1 * k for k in range(32)])
Y = array.array("f", [1.0, -1.0, 0.5, 0.0, 2.0, -0.5, 0.25, 1.5])


async def train_and_destroy(device, width: int) -> None:
    train = await tg.compile(model=WideMLP(width), loss=soak_loss,
                             inputs={"x": (8, 4), "y": (8, 1)},
                             optimizer=tg.optim.Adam(lr=1e-2), device=device, seed=width)
    forward = await train.attach(forward=lambda m, x: m(x), inputs={"x": (None, 4)})
    assert (await train.step(x=X, y=Y)).kind == "completed"
    assert (await forward.run(x=X[:12])).kind == "completed"
    train.destroy()


def test_destroyed_handles_give_back_every_gpu_object(gpu_device, no_unused_pipelines) -> None:
    base = live(gpu_device)

    async def go() -> None:
        for width in (5, 6, 7):  # distinct models: pipelines of their own
            await train_and_destroy(gpu_device, width)
            assert live(gpu_device) == base, f"model of width {width}"

    asyncio.run(go())


def test_evicted_forward_shapes_give_back_their_gpu_objects(gpu_device,
                                                            no_unused_pipelines) -> None:
    base = live(gpu_device)

    async def go() -> None:
        forward = await tg.compile_forward(model=SoakMLP(), forward=lambda m, x: m(x),
                                           inputs={"x": (None, 4)}, device=gpu_device,
                                           seed=0, max_cached_shapes=3)
        store_buffers = live(gpu_device)["buffers"] - base["buffers"]
        per_graph = []
        for b in range(1, 11):  # ten batch sizes, three cached
            assert (await forward.run(x=X[:4 * b])).kind == "completed"
            per_graph.append(forward.graph_for(x=X[:4 * b]).kernel_count)
            now = live(gpu_device)
            assert now["programs"] - base["programs"] == min(b, 3), (b, now)
            assert 0 < now["pipelines"] - base["pipelines"] <= sum(per_graph[-3:]), (b, now)
            assert now["buffers"] - base["buffers"] > store_buffers, (b, now)
        forward.destroy()
        assert live(gpu_device) == base

    asyncio.run(go())


def test_unused_pipelines_kept_for_reuse_are_bounded(gpu_device) -> None:
    """With the default cache, a model compiled again reuses its pipelines, and however many
    models were compiled and destroyed, at most UNUSED_PIPELINES_KEPT pipelines stay."""
    base = live(gpu_device)

    async def go() -> None:
        for width in range(20, 26):  # more kernels than the cache keeps (~10 each)
            await train_and_destroy(gpu_device, width)
        made = gpu_device.counts["pipelines created"]
        await train_and_destroy(gpu_device, 25)
        assert gpu_device.counts["pipelines created"] == made, "compiled again"

    asyncio.run(go())
    now = live(gpu_device)
    assert now["buffers"] == base["buffers"] and now["programs"] == base["programs"], now
    assert now["pipelines"] - base["pipelines"] <= runtime.UNUSED_PIPELINES_KEPT, (now, base)


def test_abandoning_a_start_twice_drops_its_references_once(gpu_device) -> None:
    """A build that fails after its pipelines were started is abandoned by the build and
    again by the compiler around it: the pipelines it shares with a live graph keep that
    graph's reference (a double release would let the cache destroy them under it)."""
    async def go() -> None:
        train = await tg.compile(model=SoakMLP(), loss=soak_loss,
                                 inputs={"x": (8, 4), "y": (8, 1)},
                                 optimizer=tg.optim.Adam(lr=1e-2), device=gpu_device, seed=0)
        cache = runtime.pipeline_cache(gpu_device)
        exe = train._exe
        refs = {w: cache.refs[w] for w in exe.wgsls}
        sources = [(k.wgsl, "again") for k in exe.kernels if k.threads > 0]
        acquiring = cache.start(sources)
        cache.abandon(acquiring)
        cache.abandon(acquiring)
        assert {w: cache.refs.get(w, 0) for w in exe.wgsls} == refs
        assert (await train.step(x=[0.5] * 32, y=[1.0] * 8)).kind == "completed"
        train.destroy()

    asyncio.run(go())


def test_a_devices_pipeline_cache_goes_with_the_device() -> None:
    """The per-device pipeline cache holds its device weakly: once a device is destroyed and
    dropped, the device and its cache (with the pipelines in it) are freed."""
    import gc
    import weakref

    from tensorgrad.gpu.native import request_native_device

    caches = len(runtime._pipeline_caches)

    async def go() -> weakref.ref:
        device = await request_native_device()
        await train_and_destroy(device, 9)
        assert runtime.pipeline_cache(device).kernels  # its pipelines are cached
        assert len(runtime._pipeline_caches) == caches + 1
        device.destroy()
        return weakref.ref(device)

    gone = asyncio.run(go())
    gc.collect()
    assert gone() is None, "the destroyed device is still referenced"
    assert len(runtime._pipeline_caches) == caches
