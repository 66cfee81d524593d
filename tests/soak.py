"""Compile / step / destroy cycles, counting what the device made and freed: the soak run of
tests/native/test_soak.py, tests/browser/test_soak.py (exec'd in the worker: no NumPy, no
pytest here) and bench/soak.py."""

from __future__ import annotations

import array
import gc
import sys
import time
from typing import Any

import tensorgrad as tg


class SoakMLP(tg.Module):
    def __init__(self) -> None:
        self.l1 = tg.Linear(4, 16)
        self.l2 = tg.Linear(16, 1)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l2(tg.relu(self.l1(x)))


def soak_loss(m: SoakMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(m(x) - y))


def memory_bytes() -> int:
    """This process's resident memory (natively) or the worker's WebAssembly heap plus the JS
    heap (in Pyodide)."""
    if sys.platform == "emscripten":
        import js
        import pyodide_js

        heap = int(pyodide_js._module.HEAPU8.length)
        memory = getattr(js.performance, "memory", None)
        return heap + (int(memory.usedJSHeapSize) if memory is not None else 0)
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import resource

    return pages * resource.getpagesize()


def live_buffers(device: Any) -> int:
    return device.counts["buffers created"] - device.counts["buffers destroyed"]


async def soak(device: Any, cycles: int, warmup: int = 10) -> dict[str, Any]:
    """`cycles` of compile → attach → step → run → destroy; the counts and memory figures.

    After every destroy the device's live buffers and programs must be back where they were
    before the cycle, and after the warm-up no new pipeline may be compiled (the same kernels
    are cached) and the live pipelines stay as many: checked here, AssertionError naming the
    cycle."""
    x = array.array("f", [0.1 * k for k in range(32)])
    y = array.array("f", [1.0, -1.0, 0.5, 0.0, 2.0, -0.5, 0.25, 1.5])
    baseline = live_buffers(device)
    programs = live_objects(device)["programs"]
    pipelines = device.counts["pipelines created"]
    live_pipelines = live_objects(device)["pipelines"]
    created0 = device.counts["buffers created"]
    memory: dict[str, int] = {}
    t0 = time.perf_counter()
    for cycle in range(cycles):
        train = await tg.compile(model=SoakMLP(), loss=soak_loss,
                                 inputs={"x": (8, 4), "y": (8, 1)},
                                 optimizer=tg.optim.Adam(lr=1e-2), device=device, seed=cycle)
        forward = await train.attach(forward=lambda m, x: m(x), inputs={"x": (None, 4)})
        step = await train.step(x=x, y=y)
        assert step.kind == "completed", f"cycle {cycle}: {step}"
        run = await forward.run(x=x[:8])
        assert run.kind == "completed", f"cycle {cycle}: {run}"
        train.destroy()
        live = live_buffers(device)
        assert live == baseline, f"cycle {cycle}: {live - baseline} GPU buffers leaked"
        objects = live_objects(device)
        assert objects["programs"] == programs, \
            f"cycle {cycle}: {objects['programs'] - programs} programs left live"
        if cycle + 1 == warmup:
            gc.collect()
            pipelines = device.counts["pipelines created"]
            live_pipelines = objects["pipelines"]
            memory["after_warmup"] = memory_bytes()
        elif cycle >= warmup:
            assert device.counts["pipelines created"] == pipelines, \
                f"cycle {cycle}: a pipeline was compiled again (the cache should hold it)"
            assert objects["pipelines"] == live_pipelines, \
                f"cycle {cycle}: {objects['pipelines'] - live_pipelines} more pipelines live"
    gc.collect()
    memory["end"] = memory_bytes()
    return {
        "cycles": cycles, "seconds": time.perf_counter() - t0,
        "buffers_created": device.counts["buffers created"] - created0,
        "buffers_live_delta": live_buffers(device) - baseline,
        "pipelines_created": device.counts["pipelines created"],
        "programs_created": device.counts["programs created"],
        "memory_after_warmup": memory.get("after_warmup", 0), "memory_end": memory["end"],
        "memory_growth": memory["end"] - memory.get("after_warmup", memory["end"]),
    }


# ---- distinct models and batch sizes (bench/soak.py, tests/native/test_soak.py) -------------

class WideMLP(tg.Module):
    """4 -> `hidden` -> 1: each width compiles to kernels of its own."""

    def __init__(self, hidden: int) -> None:
        self.l1 = tg.Linear(4, hidden)
        self.l2 = tg.Linear(hidden, 1)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l2(tg.relu(self.l1(x)))


def live_objects(device: Any) -> dict[str, int]:
    """The device's live GPU objects by kind (`device.live_objects()`; from its counts on a
    device without that method, where pipelines and programs are never released)."""
    get = getattr(device, "live_objects", None)
    if get is not None:
        return dict(get())
    c = device.counts
    return {"buffers": c["buffers created"] - c["buffers destroyed"],
            "pipelines": c["pipelines created"] - c["pipelines destroyed"],
            "programs": c["programs created"] - c["programs destroyed"]}


def _row(device: Any, iteration: int, rows: list[dict[str, Any]], on_row: Any) -> None:
    gc.collect()
    rows.append({"iteration": iteration, "memory": memory_bytes(), "live": live_objects(device)})
    if on_row is not None:
        on_row(rows[-1])


async def distinct_models(device: Any, n: int, every: int = 50, steps: int = 3,
                          first_width: int = 8, on_row: Any = None) -> list[dict[str, Any]]:
    """`n` models of distinct widths, each compiled, stepped `steps` times and destroyed; a
    row {iteration, memory, live objects} every `every` iterations (and after the last),
    also passed to `on_row` as it is taken."""
    x = array.array("f", [0.1 * k for k in range(32)])
    y = array.array("f", [1.0, -1.0, 0.5, 0.0, 2.0, -0.5, 0.25, 1.5])
    rows = []
    for i in range(n):
        train = await tg.compile(model=WideMLP(first_width + i), loss=soak_loss,
                                 inputs={"x": (8, 4), "y": (8, 1)},
                                 optimizer=tg.optim.Adam(lr=1e-2), device=device, seed=i)
        for _ in range(steps):
            result = await train.step(x=x, y=y)
            assert result.kind == "completed", f"model {i}: {result}"
        train.destroy()
        del train
        if (i + 1) % every == 0 or i + 1 == n:
            _row(device, i + 1, rows, on_row)
    return rows


async def batch_sizes(device: Any, n: int, every: int = 50, on_row: Any = None
                      ) -> list[dict[str, Any]]:
    """One forward with a free batch dim (default max_cached_shapes) run at batch sizes 1..n,
    each compiling its own graph; a row every `every` sizes. The handle is destroyed at the
    end (the last row is taken before that, the cache still full)."""
    forward = await tg.compile_forward(model=SoakMLP(), forward=lambda m, x: m(x),
                                       inputs={"x": (None, 4)}, device=device, seed=0)
    rows = []
    for b in range(1, n + 1):
        result = await forward.run(x=array.array("f", [0.01 * k for k in range(4 * b)]))
        assert result.kind == "completed", f"batch {b}: {result}"
        if b % every == 0 or b == n:
            _row(device, b, rows, on_row)
    forward.destroy()
    return rows
