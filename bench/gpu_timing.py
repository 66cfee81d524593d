"""Timing helpers for bench/report.py on the native adapter (tensorgrad/gpu/native.py).

- :class:`HostTimer`: times the adapter's host work during real steps — command-buffer
  encoding (``NativeDevice._encode``), queue submits and buffer writes — and the time a step
  spends awaiting the GPU (``_wait``, ``_map_and_read``), by wrapping those methods on one
  device instance for the duration of a ``with`` block. Nothing in tensorgrad changes; the
  wrappers call the originals with the same arguments and are removed on exit.
- :func:`profile_program`: GPU time per dispatch of a compiled step program, from WebGPU
  timestamp queries (feature ``timestamp-query``): the program's dispatches are replayed,
  in order with its copies, each in a compute pass of its own whose ``timestamp_writes``
  record its start and end. WebGPU orders every dispatch as its own usage scope anyway, so
  the replay computes what a step computes (on the buffers as the last step left them).

Both fail soft: a missing private attribute or feature gives None and a reason.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

MAX_QUERIES = 4096  # WebGPU's maximum query set size


# ----------------------------------------------------------------------------- host side


class _TimedQueue:
    """Forwards to a wgpu queue, timing submit and write_buffer."""

    def __init__(self, queue: Any, timer: HostTimer) -> None:
        self._queue, self._timer = queue, timer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._queue.submit(*args, **kwargs)
        finally:
            self._timer.add("submit", time.perf_counter() - t0)

    def write_buffer(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._queue.write_buffer(*args, **kwargs)
        finally:
            self._timer.add("write", time.perf_counter() - t0)


@dataclass
class HostTimer:
    """Seconds spent in each adapter call kind while active: "encode" (building and
    finishing command buffers), "submit", "write" (queue.write_buffer), "wait" (awaiting
    submissions and read-back maps)."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    note: str = ""

    def add(self, kind: str, dt: float) -> None:
        self.seconds[kind] += dt
        self.calls[kind] += 1

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    @contextmanager
    def attach(self, device: Any) -> Iterator[HostTimer]:
        """Wrap `device`'s adapter calls (a NativeDevice) until the block exits."""
        needed = ("_encode", "_wait", "_map_and_read", "queue")
        missing = [n for n in needed if not hasattr(device, n)]
        if missing:
            self.note = f"not a NativeDevice with {missing}: host times n/a"
            yield self
            return
        encode, wait, read, queue = device._encode, device._wait, device._map_and_read, \
            device.queue

        def timed_encode(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return encode(*args, **kwargs)
            finally:
                self.add("encode", time.perf_counter() - t0)

        async def timed_wait(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await wait(*args, **kwargs)
            finally:
                self.add("wait", time.perf_counter() - t0)

        async def timed_read(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await read(*args, **kwargs)
            finally:
                self.add("wait", time.perf_counter() - t0)

        device._encode, device._wait, device._map_and_read = timed_encode, timed_wait, timed_read
        device.queue = _TimedQueue(queue, self)
        try:
            yield self
        finally:
            for name in ("_encode", "_wait", "_map_and_read"):
                device.__dict__.pop(name, None)  # back to the class's methods
            device.queue = queue

    @property
    def active(self) -> bool:
        return not self.note


# ----------------------------------------------------------------------------- GPU side


@dataclass
class GPUProfile:
    """Per-step GPU times from timestamp queries (milliseconds, median over the replays)."""

    busy_ms: float            # sum of the dispatches' durations
    span_ms: float            # first dispatch start to last dispatch end
    by_kind_ms: dict[str, float]
    by_kind_count: dict[str, int]  # dispatches of each kind per step
    dispatches: int
    replays: int
    period_ns: float          # nanoseconds per timestamp tick used
    per_dispatch_ms: list[float] = field(default_factory=list)  # in dispatch order


def has_timestamps(device: Any) -> bool:
    info = getattr(device, "info", None)
    return bool(info and "timestamp-query" in info.features and hasattr(device, "device"))


def timestamp_period(device: Any) -> float:
    """Nanoseconds per timestamp tick: wgpu-native's wgpuQueueGetTimestampPeriod where
    wgpu-py's private cffi handles reach it, else 1.0 (WebGPU's unit)."""
    try:
        from wgpu.backends.wgpu_native import _api
        period = float(_api.libf.wgpuQueueGetTimestampPeriod(device.device.queue._internal))
        return period if period > 0 else 1.0
    except Exception:  # noqa: BLE001 - Dawn, a moved private API: the spec's nanoseconds
        return 1.0


def _dispatch_ops(program: Any) -> list[tuple[Any, str]]:
    """[(op tuple, label or "" for a copy)] of a NativeProgram, in order."""
    labels = iter(program.labels)
    return [(op, next(labels, "?") if op[0] is not None else "")
            for chunk in program.chunks for op in chunk]


def _replay(device: Any, ops: list[tuple[Any, str]]) -> list[tuple[str, int, int]]:
    """Run `ops` once, each dispatch in its own compute pass with timestamp writes;
    (label, start tick, end tick) per dispatch."""
    wgpu, gdev = device.wgpu, device.device
    n = sum(1 for _, label in ops if label)
    sets, resolve, readback = [], [], []
    for first in range(0, 2 * n, MAX_QUERIES):
        count = min(MAX_QUERIES, 2 * n - first)
        sets.append(gdev.create_query_set(type=wgpu.QueryType.timestamp, count=count))
        resolve.append(gdev.create_buffer(
            size=8 * count, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC))
        readback.append(gdev.create_buffer(
            size=8 * count, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST))
    try:
        encoder = gdev.create_command_encoder()
        k = 0
        for op, label in ops:
            if not label:
                encoder.copy_buffer_to_buffer(op[1], op[2], op[3], op[4], op[5])
                continue
            q = 2 * k
            writes = {"query_set": sets[q // MAX_QUERIES],
                      "beginning_of_pass_write_index": q % MAX_QUERIES,
                      "end_of_pass_write_index": q % MAX_QUERIES + 1}
            cpass = encoder.begin_compute_pass(timestamp_writes=writes)
            cpass.set_pipeline(op[0])
            if op[1] is not None:
                cpass.set_bind_group(0, op[1])
            cpass.dispatch_workgroups(op[2], op[3], op[4])
            cpass.end()
            k += 1
        for qs, buf, back in zip(sets, resolve, readback):
            encoder.resolve_query_set(qs, 0, qs.count, buf, 0)
            encoder.copy_buffer_to_buffer(buf, 0, back, 0, buf.size)
        device.queue.submit([encoder.finish()])
        ticks: list[int] = []
        for back in readback:
            back.map_sync(wgpu.MapMode.READ)
            ticks += memoryview(back.read_mapped()).cast("Q").tolist()
            back.unmap()
        labels = [label for _, label in ops if label]
        return [(labels[i], ticks[2 * i], ticks[2 * i + 1]) for i in range(n)]
    finally:
        for obj in (*resolve, *readback, *sets):
            with suppress(Exception):  # best effort
                obj.destroy()


def profile_program(device: Any, program: Any, replays: int = 3
                    ) -> tuple[GPUProfile | None, str]:
    """GPU times of one step of `program` (a NativeProgram), or (None, why not)."""
    if not hasattr(program, "chunks") or not hasattr(program, "labels"):
        return None, "not a native program"
    ops = _dispatch_ops(program)
    if not has_timestamps(device):
        return None, "no 'timestamp-query' feature on this adapter"
    period = timestamp_period(device)
    busy, span, kinds = [], [], defaultdict(list)
    each: list[list[float]] = []
    try:
        for _ in range(max(1, replays)):
            rows = _replay(device, ops)
            if not rows:
                return None, "no dispatches"
            per_kind: dict[str, float] = defaultdict(float)
            for label, start, end in rows:
                per_kind[label] += max(0, end - start) * period / 1e6
            busy.append(sum(per_kind.values()))
            each.append([max(0, end - start) * period / 1e6 for _, start, end in rows])
            span.append((max(e for _, _, e in rows) - min(s for _, s, _ in rows)) * period / 1e6)
            for label in {r[0] for r in rows}:
                kinds[label].append(per_kind[label])
    except Exception as err:  # noqa: BLE001 - fail soft: report why
        return None, f"timestamp replay failed: {type(err).__name__}: {err}"
    if max(busy) <= 0:
        return None, "timestamps all zero (adapter does not implement them)"
    by_kind = {k: statistics.median(v) for k, v in kinds.items()}
    by_kind = dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))
    counts: dict[str, int] = defaultdict(int)
    for label, _, _ in rows:
        counts[label] += 1
    return GPUProfile(statistics.median(busy), statistics.median(span), by_kind,
                      {k: counts[k] for k in by_kind}, len(rows), len(busy), period,
                      [statistics.median(times) for times in zip(*each)]), ""
