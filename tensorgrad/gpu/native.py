"""The native GPU adapter: the :class:`~tensorgrad.gpu.interface.GPUDevice` protocol on the
wgpu-py API, from either the ``wgpu`` package (wgpu-native) or ``wgpudawn`` (Dawn).

Which package: the ``backend`` argument, else the ``TENSORGRAD_WGPU`` environment variable,
else ``wgpu`` (falling back to ``wgpudawn`` when ``wgpu`` is not installed).

Which Vulkan driver: see :mod:`tensorgrad.gpu.vulkan` (decided before the first adapter
request of the process).

Runtime checks: by default wgpu compiles every kernel with bounds checks on each array index
and a counter on each loop. ``runtime_checks=False`` (or ``TENSORGRAD_RUNTIME_CHECKS=0``)
compiles them without, through wgpu-native's trusted-module entry point. tensorgrad's kernels
guard their own indices (the native suite passes with TENSORGRAD_RUNTIME_CHECKS=0, and
tests/native/test_adapter.py compares the two on every run), so this changes no result; a
kernel that did go out of bounds would read or write memory it does not own.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
import re
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..errors import DeviceLostError, ShaderCompileError
from .interface import (
    WANTED_FEATURES,
    AdapterInfo,
    Copy,
    DeviceLimits,
    Dispatch,
    ReadyKernels,
    WebGPUSupport,
    split_slice,
)
from .vulkan import (
    SWIFTSHADER_ICDS,
    configure_vulkan_driver,
    use_vulkan_driver,
    vulkan_driver_manifests,
)
from .workdone import NativeWorkDone

__all__ = [
    "NativeDevice", "NativeKernel", "NativeProgram", "configure_vulkan_driver", "probe_native",
    "request_native_device", "use_vulkan_driver", "vulkan_driver_manifests",
]

MAX_BUFFER_BYTES = 2_147_483_644  # largest multiple of 4 below 2**31
STAGING_KEPT, STAGING_KEPT_BYTES = 8, 64 << 20  # free readback buffers pooled, at most
# Adapter preference: a real GPU before a CPU rasteriser; Vulkan/Metal/D3D12 before OpenGL.
_TYPE_RANK = {"discretegpu": 0, "integratedgpu": 1, "virtualgpu": 2, "unknown": 3, "cpu": 4}
_BACKEND_RANK = {"vulkan": 0, "metal": 0, "d3d12": 0, "opengl": 2, "opengles": 2}
# wgpu-native spells some features its own way.
_NATIVE_FEATURE = {"subgroups": "subgroup"}
_STANDARD_FEATURE = {v: k for k, v in _NATIVE_FEATURE.items()}


def _import_backend(backend: str | None) -> ModuleType:
    name = backend or os.environ.get("TENSORGRAD_WGPU") or "wgpu"
    if name not in ("wgpu", "wgpudawn"):
        raise ValueError(f"unknown wgpu backend {name!r}: use 'wgpu' or 'wgpudawn'")
    try:
        return importlib.import_module(name)
    except ImportError as err:
        explicit = backend or os.environ.get("TENSORGRAD_WGPU")
        if explicit:
            raise ImportError(f"{name} is not installed (pip install {name})") from err
        try:
            return importlib.import_module("wgpudawn")
        except ImportError:
            raise ImportError("no wgpu-py package: pip install wgpu==0.32.0 "
                              "(or wgpudawn)") from err


# ----------------------------------------------------------------------------- handles


@dataclass(eq=False)
class NativeKernel:
    """A compiled compute pipeline (entry point `main`, layout 'auto')."""

    pipeline: Any
    label: str
    wgsl: str
    _layout: Any = None

    def layout(self) -> Any:
        if self._layout is None:
            self._layout = self.pipeline.get_bind_group_layout(0)
        return self._layout


# An encoded op: (pipeline, bind_group or None, x, y, z, pipeline handle, bind group handle
# or NULL) for a dispatch, (None, src, src_offset, dst, dst_offset, size) for a copy.
_Op = tuple


def _raw_pass_calls() -> tuple[Any, Any, Any, Any] | None:
    """wgpu-native's own compute-pass entry points (set pipeline, set bind group, dispatch,
    NULL), called on prepared handles: a step's dispatches were validated when its program
    was built, and the wgpu-py wrappers cost several microseconds per call (argument checks,
    a fresh offsets array per bind group), which is most of a small kernel's CPU cost. None
    where wgpu-py's internals are not as expected (the public methods are used then)."""
    if os.environ.get("TENSORGRAD_SAFE_ENCODE"):
        return None
    try:
        from wgpu.backends.wgpu_native._ffi import ffi, lib
        return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)
    except (ImportError, AttributeError):  # pragma: no cover - another wgpu-py layout
        return None


@dataclass(eq=False)
class NativeProgram:
    """Steps split into chunks of at most `chunk_size` compute passes, bind groups made."""

    chunks: list[list[_Op]]
    chunk_size: int
    n_dispatches: int
    labels: list[str] = field(default_factory=list)
    released: bool = False  # destroy_program ran: its chunks (bind groups) are dropped


# ----------------------------------------------------------------------------- device

# How wgpu-native and Dawn word the validation error of any call on a lost device.
_LOST_TEXT = re.compile(r"device (is |was |has been )?(lost|destroyed)", re.IGNORECASE)


def _loss_reason(err: BaseException) -> str | None:
    """The line of `err` (or of an exception it was raised from) saying the device is lost."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for line in str(e).splitlines():
            if _LOST_TEXT.search(line):
                return line.strip()
        e = e.__cause__ or e.__context__
    return None


def _loss_checked(method: Callable[..., Any]) -> Callable[..., Any]:
    """A device call that raises :class:`DeviceLostError` on a lost device: at once when the
    loss is known, else when wgpu's error says the device is lost (which records it)."""
    if asyncio.iscoroutinefunction(method):
        @functools.wraps(method)
        async def run_async(self: NativeDevice, *args: Any, **kwargs: Any) -> Any:
            self._raise_if_lost()
            try:
                return await method(self, *args, **kwargs)
            except DeviceLostError:
                raise
            except Exception as err:
                self._note_loss(err)
                raise
        return run_async

    @functools.wraps(method)
    def run(self: NativeDevice, *args: Any, **kwargs: Any) -> Any:
        self._raise_if_lost()
        try:
            return method(self, *args, **kwargs)
        except DeviceLostError:
            raise
        except Exception as err:
            self._note_loss(err)
            raise
    return run


class NativeDevice:
    """A WebGPU device from wgpu-py (``wgpu`` or ``wgpudawn``). See :class:`GPUDevice`."""

    def __init__(self, wgpu: ModuleType, adapter: Any, device: Any, driver_note: str = "",
                 runtime_checks: bool = True):
        self.wgpu = wgpu
        self.backend = wgpu.__name__
        self.adapter = adapter
        self.device = device
        self.queue = device.queue
        self._raw = _raw_pass_calls()
        self.driver_note = driver_note
        self.runtime_checks = runtime_checks
        self._create_module = (self._create_checked_module if runtime_checks
                               else _trusted_module_maker(self.backend))
        info = dict(adapter.info)
        self.adapter_info = info
        lim = device.limits
        self.limits = DeviceLimits(
            max_storage_buffer_binding_size=int(lim["max-storage-buffer-binding-size"]),
            max_buffer_size=int(lim["max-buffer-size"]),
            max_storage_buffers_per_shader_stage=int(lim["max-storage-buffers-per-shader-stage"]),
            max_compute_workgroups_per_dimension=int(lim["max-compute-workgroups-per-dimension"]),
            max_compute_invocations_per_workgroup=int(
                lim["max-compute-invocations-per-workgroup"]),
            max_compute_workgroup_storage_size=int(lim["max-compute-workgroup-storage-size"]),
        )
        parts = [info.get("vendor"), info.get("architecture"), info.get("device"),
                 info.get("description")]
        name = " ".join(str(p) for p in parts if p)
        self.description = (f"{self.backend} {wgpu.__version__}: {name} "
                            f"({info.get('backend_type', '?')}, {info.get('adapter_type', '?')})"
                            + ("" if runtime_checks else ", no runtime checks"))
        self.info = AdapterInfo(
            vendor=str(info.get("vendor") or ""), architecture=str(info.get("architecture") or ""),
            description=name, backend=str(info.get("backend_type") or ""),
            software=_adapter_kind(info) == "cpu",
            features=frozenset(_STANDARD_FEATURE.get(f, f) for f in device.features))
        usage = wgpu.BufferUsage
        self._storage_usage = usage.STORAGE | usage.COPY_SRC | usage.COPY_DST
        self._staging_usage = usage.MAP_READ | usage.COPY_DST
        self._map_read = wgpu.MapMode.READ
        self._staging: list[Any] = []  # free readback buffers, most recently used last
        self._staging_lock = threading.Lock()
        self._destroyed = False
        self._lost_reason: str | None = None
        self.counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()  # handles may run from several threads
        # How to learn that a submission is done, set by _probe_work_done (see there):
        # "native-poll", "queue" or "fence".
        self.wait_mode = "queue"
        self.wait_note = ""
        self._native_done: NativeWorkDone | None = None
        # wgpu-py's map_async(READ) first submits an empty command buffer, which blocks while
        # its poll thread waits on the GPU; the fence's contents are never read, so skip it.
        self._fence_map_mode: Any = "READ_NOSYNC" if self.backend == "wgpu" else self._map_read
        self._fence_src: Any = None
        self._fences: list[Any] = []

    async def _probe_work_done(self) -> None:
        """Choose how to wait for a submission.

        - "native-poll" (wgpu-native): the queue's work-done callback, polled without blocking
          from this thread. wgpu-py's own promises are served by a poll thread whose blocking
          poll waits for *all* submitted work and holds a lock that queue.submit needs, so
          every wait drains the GPU and chunk i + 1 could not be queued behind chunk i.
          It uses wgpu-py's private cffi handles: probed here, skipped when unavailable.
        - "queue": ``queue.on_submitted_work_done_async()`` (Dawn; a fixed wgpu-py). In
          wgpu 0.32.0 it raises TypeError (pygfx/wgpu-py#834).
        - "fence": a 4-byte copy into a MAP_READ buffer at the end of the submission, mapped.
        """
        if self.backend == "wgpu":
            try:
                native = NativeWorkDone(self.device)
                await asyncio.wait_for(native.wait(native.signal()), 10)
            except Exception as err:  # noqa: BLE001 - private API moved: use a public way
                self.wait_note = f"native-poll unavailable: {_error_text(err)}"
            else:
                self._native_done, self.wait_mode = native, "native-poll"
                return
        try:
            await asyncio.wait_for(self.queue.on_submitted_work_done_async(), 10)
            self.wait_mode = "queue"
        except Exception:  # noqa: BLE001 - any failure: fall back to the portable fence
            self.wait_mode = "fence"

    def _take_fence(self) -> Any:
        if self._fence_src is None:
            self._count("staging buffers created")
            self._fence_src = self.device.create_buffer(size=4, usage=self._storage_usage,
                                                        label="tensorgrad-fence-src")
        try:
            return self._fences.pop()
        except IndexError:
            self._count("staging buffers created")
            return self.device.create_buffer(size=4, usage=self._staging_usage,
                                             label="tensorgrad-fence")

    def _submit(self, command_buffer: Any, fence: Any) -> Any:
        """Submit; return what :meth:`_wait` needs to wait for this submission."""
        self.queue.submit([command_buffer])
        if fence is not None:
            try:
                return fence.map_async(self._fence_map_mode, 0, 4)
            except (ValueError, TypeError, KeyError):  # a wgpu-py without "READ_NOSYNC"
                self._fence_map_mode = self._map_read
                return fence.map_async(self._map_read, 0, 4)
        if self._native_done is not None:
            return self._native_done.signal()
        return self.queue.on_submitted_work_done_async()

    async def _wait(self, done: Any, fence: Any) -> None:
        try:
            if isinstance(done, int):
                await self._native_done.wait(done)
            else:
                await done
        finally:
            if fence is not None:
                if fence.map_state == "mapped":
                    fence.unmap()
                    self._fences.append(fence)
                else:
                    self._destroy_staging(fence)

    def __repr__(self) -> str:
        return f"<NativeDevice {self.description}>"

    @property
    def lost(self) -> str | None:
        """Why the device is lost: "destroyed" once :meth:`destroy` ran, wgpu's words once a
        call failed because the device is lost (wgpu-py has no loss event); else None."""
        return "destroyed" if self._destroyed else self._lost_reason

    def _lost_error(self) -> DeviceLostError:
        return DeviceLostError(f"the GPU device was lost ({self.lost}); its graphs cannot run "
                               "any more: compile again (tg.compile asks for a new default "
                               "device) or request a new device")

    def _raise_if_lost(self) -> None:
        if self.lost:
            raise self._lost_error()

    def _note_loss(self, err: BaseException) -> None:
        """Raise DeviceLostError from `err` when it says the device is lost."""
        reason = _loss_reason(err)
        if reason is not None:
            self._lost_reason = self._lost_reason or f"wgpu: {reason}"
            raise self._lost_error() from err

    def _count(self, what: str) -> None:
        with self._counts_lock:
            self.counts[what] += 1

    def live_objects(self) -> dict[str, int]:
        """Live objects made through this interface: "buffers", "pipelines", "programs", and
        "staging" (the device's own readback and fence buffers, pooled by size bucket)."""
        c = self.counts
        return {"buffers": c["buffers created"] - c["buffers destroyed"],
                "pipelines": c["pipelines created"] - c["pipelines destroyed"],
                "programs": c["programs created"] - c["programs destroyed"],
                "staging": c["staging buffers created"] - c["staging buffers destroyed"]}

    # -- buffers

    @_loss_checked
    def create_buffer(self, size: int, label: str = "") -> Any:
        """A zero-initialised storage buffer of `size` bytes (rounded up to a multiple of 4)."""
        size = max(4, (int(size) + 3) & ~3)
        if size > self.limits.max_buffer_size:
            raise ValueError(f"buffer '{label}' of {size} bytes exceeds maxBufferSize "
                             f"{self.limits.max_buffer_size}")
        buffer = self.device.create_buffer(size=size, usage=self._storage_usage, label=label)
        self._count("buffers created")
        return buffer

    @_loss_checked
    def write_buffer(self, buffer: Any, data: Any, offset: int = 0) -> None:
        """Copy host bytes into `buffer` (or a slice) at `offset` (a multiple of 4). Data
        whose length is not a multiple of 4 is padded with zero bytes."""
        buffer, base, _ = split_slice(buffer)
        offset += base
        m = memoryview(data)
        if not m.c_contiguous:
            m = memoryview(m.tobytes())
        if m.nbytes % 4:
            m = memoryview(m.tobytes() + bytes(4 - m.nbytes % 4))
        if m.nbytes:
            self.queue.write_buffer(buffer, offset, m)

    def destroy_buffer(self, buffer: Any) -> None:
        self._destroy_quietly(buffer)
        self._count("buffers destroyed")

    def _destroy_staging(self, buffer: Any) -> None:
        self._destroy_quietly(buffer)
        self._count("staging buffers destroyed")

    def _destroy_quietly(self, buffer: Any) -> None:
        try:
            buffer.destroy()
        except Exception as err:  # freeing on a lost device: nothing is left to free
            if self.lost is None and _loss_reason(err) is None:
                raise

    # -- kernels and programs

    @_loss_checked
    def create_kernel(self, wgsl: str, label: str) -> NativeKernel:
        """Compile `wgsl` into a compute pipeline; :class:`ShaderCompileError` on failure."""
        device = self.device
        try:
            module = self._create_module(device, wgsl, label)
        except Exception as err:  # GPUValidationError (wgpu / wgpudawn) or a panic message
            raise ShaderCompileError(label, wgsl, [_error_text(err)]) from err
        errors = self._compilation_errors(module)
        if errors:
            raise ShaderCompileError(label, wgsl, errors)
        try:
            pipeline = device.create_compute_pipeline(
                label=label, layout="auto", compute={"module": module, "entry_point": "main"})
        except Exception as err:
            raise ShaderCompileError(label, wgsl, [_error_text(err)]) from err
        self._count("pipelines created")
        return NativeKernel(pipeline, label, wgsl)

    def create_kernels(self, sources: Sequence[tuple[str, str]]) -> list[NativeKernel]:
        """:meth:`create_kernel` for each `(wgsl, label)`, one after another; when one fails,
        those made before it are released."""
        made: list[NativeKernel] = []
        try:
            for wgsl, label in sources:
                made.append(self.create_kernel(wgsl, label))
        except BaseException:
            for kernel in made:
                self.destroy_kernel(kernel)
            raise
        return made

    def start_kernels(self, sources: Sequence[tuple[str, str]]) -> ReadyKernels:
        """:meth:`create_kernels` now (wgpu-native compiles synchronously)."""
        return ReadyKernels(self, self.create_kernels(sources))

    def destroy_kernel(self, kernel: NativeKernel) -> None:
        """Drop the device's references to a pipeline (wgpu releases it once no program
        holds it either)."""
        if kernel.pipeline is None:
            return
        kernel.pipeline = kernel._layout = None
        self._count("pipelines destroyed")

    @staticmethod
    def _create_checked_module(device: Any, wgsl: str, label: str) -> Any:
        return device.create_shader_module(label=label, code=wgsl)

    @staticmethod
    def _compilation_errors(module: Any) -> list[str]:
        """Error messages from get_compilation_info, where the backend implements it."""
        try:
            get = getattr(module, "get_compilation_info_sync", None)
            info = get() if get is not None else module.get_compilation_info_async().sync_wait()
        except Exception:  # noqa: BLE001 - best effort: creation already raised on errors
            return []
        out = []
        for msg in getattr(info, "messages", info) or ():
            kind = str(getattr(msg, "type", None) or _get(msg, "type", "error"))
            if kind.endswith("error"):
                line = getattr(msg, "line_num", None) or _get(msg, "line_num", "?")
                col = getattr(msg, "line_pos", None) or _get(msg, "line_pos", "?")
                text = getattr(msg, "message", None) or _get(msg, "message", str(msg))
                out.append(f"{line}:{col}: {text}")
        return out

    @_loss_checked
    def create_program(self, steps: Sequence[Dispatch | Copy], chunk_size: int) -> NativeProgram:
        """Bind groups made once; steps split into chunks of `chunk_size` dispatches."""
        if chunk_size < 0:
            raise ValueError("chunk_size must be >= 0")
        max_wg = self.limits.max_compute_workgroups_per_dimension
        bind_groups: dict[tuple, Any] = {}
        chunks: list[list[_Op]] = [[]]
        in_chunk = 0
        n_dispatches = 0
        labels: list[str] = []
        for step in steps:
            if isinstance(step, Dispatch):
                kernel: NativeKernel = step.kernel
                label = step.label or kernel.label
                x, y, z = (int(v) for v in step.workgroups)
                if max(x, y, z) > max_wg or min(x, y, z) < 0:
                    raise ValueError(f"dispatch '{label}': workgroups {step.workgroups} outside "
                                     f"0..{max_wg} per dimension (split x into y)")
                bind_group = None
                if step.buffers:
                    key = (id(kernel), *(_slice_key(b) for b in step.buffers))
                    bind_group = bind_groups.get(key)
                    if bind_group is None:
                        bind_group = self._bind_group(kernel, step.buffers, label)
                        bind_groups[key] = bind_group
                if chunk_size and in_chunk == chunk_size:
                    chunks.append([])
                    in_chunk = 0
                chunks[-1].append((kernel.pipeline, bind_group, x, y, z,
                                   getattr(kernel.pipeline, "_internal", None),
                                   getattr(bind_group, "_internal", None)))
                in_chunk += 1
                n_dispatches += 1
                labels.append(label)
            elif isinstance(step, Copy):
                if step.size % 4 or step.src_offset % 4 or step.dst_offset % 4:
                    raise ValueError(f"copy of {step.size} bytes: size and offsets must be "
                                     "multiples of 4")
                chunks[-1].append((None, step.src, step.src_offset, step.dst, step.dst_offset,
                                   step.size))
            else:
                raise TypeError(f"program step must be Dispatch or Copy, not {type(step)}")
        chunks = [c for c in chunks if c]
        self._count("programs created")
        return NativeProgram(chunks, chunk_size, n_dispatches, labels)

    def destroy_program(self, program: NativeProgram) -> None:
        """Drop a program's chunks and bind groups (a run in flight keeps what it holds)."""
        if program.released:
            return
        program.released = True
        program.chunks = []
        self._count("programs destroyed")

    def _bind_group(self, kernel: NativeKernel, buffers: Sequence[Any], label: str) -> Any:
        entries = []
        for i, b in enumerate(buffers):
            handle, offset, size = split_slice(b)
            entries.append({"binding": i, "resource": {
                "buffer": handle, "offset": offset,
                "size": handle.size - offset if size is None else size}})
        try:
            return self.device.create_bind_group(layout=kernel.layout(), entries=entries,
                                                 label=label)
        except Exception as err:
            raise ValueError(f"dispatch '{label}': cannot bind {len(buffers)} buffers "
                             f"(sizes {[split_slice(b)[0].size for b in buffers]}) to kernel "
                             f"'{kernel.label}': {_error_text(err)}") from err

    # -- running

    def _encode(self, ops: list[_Op], reads: Sequence[tuple[Any, int, Any]] = (),
                fence: Any = None) -> Any:
        """One command buffer: consecutive dispatches share a compute pass (each dispatch is
        its own usage scope, so WebGPU orders their memory accesses), copies end the pass."""
        encoder = self.device.create_command_encoder()
        cpass = None
        pipeline = None
        raw = self._raw
        for op in ops:
            if op[0] is not None:
                if cpass is None:
                    cpass = encoder.begin_compute_pass()
                    handle = getattr(cpass, "_internal", None)
                    pipeline = None
                if raw is not None and handle is not None and op[5] is not None:
                    if op[0] is not pipeline:
                        pipeline = op[0]
                        raw[0](handle, op[5])
                    if op[6] is not None:
                        raw[1](handle, 0, op[6], 0, raw[3])
                    raw[2](handle, op[2], op[3], op[4])
                    continue
                if op[0] is not pipeline:
                    pipeline = op[0]
                    cpass.set_pipeline(pipeline)
                if op[1] is not None:
                    cpass.set_bind_group(0, op[1])
                cpass.dispatch_workgroups(op[2], op[3], op[4])
            else:
                if cpass is not None:
                    cpass.end()
                    cpass = None
                encoder.copy_buffer_to_buffer(op[1], op[2], op[3], op[4], op[5])
        if cpass is not None:
            cpass.end()
        for src, offset, size, staging in reads:
            encoder.copy_buffer_to_buffer(src, offset, staging, 0, size)
        if fence is not None:
            encoder.copy_buffer_to_buffer(self._fence_src, 0, fence, 0, 4)
        return encoder.finish()

    def _take_staging(self, size: int) -> Any:
        """A readback buffer of at least `size` bytes, from the pool when one of its size
        class is there: sizes are powers of two (256 bytes at least), so reads of many sizes
        (a forward run at every batch size) share a few buffers."""
        bucket = max(256, 1 << (size - 1).bit_length())
        with self._staging_lock:
            for i in range(len(self._staging) - 1, -1, -1):
                if self._staging[i].size == bucket:
                    return self._staging.pop(i)
        self._count("staging buffers created")
        return self.device.create_buffer(size=bucket, usage=self._staging_usage,
                                         label="tensorgrad-readback")

    def _give_staging(self, buffer: Any) -> None:
        """Back to the pool, which keeps the most recently used STAGING_KEPT buffers of at
        most STAGING_KEPT_BYTES together (a one-off large read does not stay)."""
        with self._staging_lock:
            self._staging.append(buffer)
            dropped = []
            while (len(self._staging) > STAGING_KEPT
                   or sum(b.size for b in self._staging) > STAGING_KEPT_BYTES):
                dropped.append(self._staging.pop(0))
        for old in dropped:
            self._destroy_staging(old)

    async def _map_and_read(self, reads: list[tuple[Any, int, Any]],
                            nbytes: list[int]) -> list[memoryview]:
        promises = [staging.map_async(self._map_read, 0, size) for _, _, size, staging in reads]
        out: list[memoryview] = []
        try:
            for promise in promises:
                await promise
            for (_, _, size, staging), n in zip(reads, nbytes):
                data = staging.read_mapped(0, size)
                out.append(data[:n] if n != size else data)
        finally:
            for _, _, size, staging in reads:
                if staging.map_state == "mapped":
                    staging.unmap()
                    self._give_staging(staging)
                else:  # pending or failed: never reuse it
                    self._destroy_staging(staging)
        return out

    def _plan_reads(self, reads: Sequence[tuple[Any, int]]) -> tuple[list, list[int]]:
        planned, nbytes = [], []
        for buffer, n in reads:
            buffer, offset, _ = split_slice(buffer)
            n = int(n)
            size = max(4, (n + 3) & ~3)
            if offset + size > buffer.size:
                raise ValueError(f"read of {n} bytes at {offset} from a buffer of "
                                 f"{buffer.size} bytes")
            planned.append((buffer, offset, size, self._take_staging(size)))
            nbytes.append(n)
        return planned, nbytes

    @_loss_checked
    async def execute(self, program: NativeProgram, writes: Sequence[tuple[Any, Any]],
                      reads: Sequence[tuple[Any, int]]) -> list[memoryview]:
        """Write inputs, run the chunks with at most two submissions in flight, then read
        back; the read copies ride in the last submission.

        Before chunk i is submitted, chunk i - 2 must be done, so only chunks 0..n-3 carry a
        completion token: a two-chunk step waits for nothing but its read maps, and the wait
        for chunk i - 2 overlaps the GPU running chunk i - 1."""
        for buffer, data in writes:
            self.write_buffer(buffer, data)
        planned, nbytes = self._plan_reads(reads)
        chunks = program.chunks
        last = len(chunks) - 1
        if last < 0:
            self.queue.submit([self._encode([], planned)])
        pending: deque[tuple[Any, Any]] = deque()
        for i, ops in enumerate(chunks):
            if i >= 2:
                await self._wait(*pending.popleft())  # chunk i - 2
            token = i <= last - 2 or (i == last and not planned)
            fence = self._take_fence() if token and self.wait_mode == "fence" else None
            command_buffer = self._encode(ops, planned if i == last else (), fence)
            if token:
                pending.append((self._submit(command_buffer, fence), fence))
            else:
                self.queue.submit([command_buffer])
        while pending:
            await self._wait(*pending.popleft())
        if not planned:
            return []
        return await self._map_and_read(planned, nbytes)

    @_loss_checked
    async def read_buffers(self, reads: Sequence[tuple[Any, int]]) -> list[memoryview]:
        """Read `(buffer, nbytes)` pairs back (one submission, one map each)."""
        planned, nbytes = self._plan_reads(reads)
        if not planned:
            return []
        self.queue.submit([self._encode([], planned)])
        return await self._map_and_read(planned, nbytes)

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        for buffer in self._staging:
            self._destroy_staging(buffer)
        self._staging.clear()
        for buffer in self._fences:
            self._destroy_staging(buffer)
        self._fences.clear()
        if self._fence_src is not None:
            self._destroy_staging(self._fence_src)
        self.device.destroy()


def _trusted_module_maker(backend: str) -> Any:
    """A `(device, wgsl, label) -> GPUShaderModule` that compiles without runtime checks,
    through wgpu-native's `wgpuDeviceCreateShaderModuleTrusted` (wgpu-py has no method for
    it). ValueError where that entry point is not there (wgpudawn, another wgpu-py)."""
    try:
        if backend != "wgpu":
            raise ImportError(backend)
        from wgpu.backends.wgpu_native import _api

        create = _api.libf.wgpuDeviceCreateShaderModuleTrusted
        new_struct_p, string_view = _api.new_struct_p, _api.to_c_string_view
        ffi, lib, module_type = _api.ffi, _api.lib, _api.GPUShaderModule
    except (ImportError, AttributeError) as err:
        raise ValueError(f"runtime_checks=False needs wgpu-native's trusted shader modules, "
                         f"which the {backend!r} backend does not have ({err})") from err

    def make(device: Any, wgsl: str, label: str) -> Any:
        source = new_struct_p("WGPUShaderSourceWGSL *", code=string_view(wgsl))
        source[0].chain.next = ffi.NULL
        source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
        desc = new_struct_p("WGPUShaderModuleDescriptor *",
                            nextInChain=ffi.cast("WGPUChainedStruct *", source),
                            label=string_view(label))
        handle = create(device._internal, desc, 0)  # WGPUShaderRuntimeChecks_None
        if handle == ffi.NULL:
            raise RuntimeError("shader module creation failed")
        return module_type(label, handle, device)

    return make


def _runtime_checks_default() -> bool:
    value = os.environ.get("TENSORGRAD_RUNTIME_CHECKS", "1").strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on", ""):
        raise ValueError(f"TENSORGRAD_RUNTIME_CHECKS={value!r}: expected 1 (checks, the "
                         f"default) or 0 (no bounds checks or loop counters in kernels)")
    return value not in ("0", "false", "off")


def _slice_key(buffer: Any) -> tuple[int, int, int | None]:
    handle, offset, size = split_slice(buffer)
    return id(handle), offset, size


def _get(obj: Any, key: str, default: Any) -> Any:
    try:
        return obj[key]
    except (KeyError, IndexError, TypeError):
        return default


def _error_text(err: BaseException) -> str:
    text = str(err).strip()
    return text or type(err).__name__


# ----------------------------------------------------------------------------- request


def _adapter_kind(info: Any) -> str:
    """The adapter type wgpu reports, normalised: discretegpu, integratedgpu, cpu, ..."""
    return str(_get(info, "adapter_type", "unknown")).lower().replace("_", "").replace(" ", "")


def _rank(adapter: Any) -> tuple[int, int]:
    backend = str(_get(adapter.info, "backend_type", "")).lower()
    return _TYPE_RANK.get(_adapter_kind(adapter.info), 3), _BACKEND_RANK.get(backend, 1)


def _wanted_features(adapter: Any) -> list[str]:
    """The adapter's features among WANTED_FEATURES, by the names this wgpu-py uses."""
    have = set(adapter.features)
    return [name for want in WANTED_FEATURES
            for name in dict.fromkeys((want, _NATIVE_FEATURE.get(want, want))) if name in have]


async def _pick_adapter(wgpu: ModuleType) -> Any:
    """The best adapter: a real GPU before a CPU one; ``TENSORGRAD_ADAPTER`` (a substring of
    the adapter's vendor/device/description) narrows the choice."""
    adapters: list[Any] = []
    try:
        adapters = list(await wgpu.gpu.enumerate_adapters_async())
    except Exception:  # noqa: BLE001 - fall back to request_adapter, which reports errors
        adapters = []
    wanted = os.environ.get("TENSORGRAD_ADAPTER", "").lower()
    if wanted:
        adapters = [a for a in adapters
                    if wanted in " ".join(str(v) for v in dict(a.info).values()).lower()]
        if not adapters:
            raise RuntimeError(f"no adapter matches TENSORGRAD_ADAPTER={wanted!r}")
    if adapters:
        return min(adapters, key=_rank)
    return await wgpu.gpu.request_adapter_async(power_preference="high-performance")


def _required_limits(adapter_limits: dict[str, int]) -> dict[str, int]:
    lim = dict(adapter_limits)
    max_buffer = min(int(lim["max-buffer-size"]), MAX_BUFFER_BYTES)
    required = {
        "max-buffer-size": max_buffer,
        "max-storage-buffer-binding-size": min(int(lim["max-storage-buffer-binding-size"]),
                                               max_buffer),
    }
    for key in ("max-storage-buffers-per-shader-stage", "max-compute-workgroups-per-dimension",
                "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x",
                "max-compute-workgroup-size-y", "max-compute-workgroup-size-z",
                "max-compute-workgroup-storage-size", "max-bind-groups",
                "max-bindings-per-bind-group"):
        if lim.get(key):
            required[key] = int(lim[key])
    return required


async def probe_native(backend: str | None = None) -> WebGPUSupport:
    """A :class:`~tensorgrad.gpu.WebGPUSupport` for wgpu-py here (no device is made)."""
    try:
        wgpu = _import_backend(backend)
    except ImportError as err:
        return WebGPUSupport(False, f"WebGPU is not available natively: {err}", "no-webgpu",
                             mode="native")
    note = configure_vulkan_driver(wgpu.__name__)
    try:
        adapter = await _pick_adapter(wgpu)
    except Exception as err:  # noqa: BLE001 - reported, not raised
        adapter, why = None, _error_text(err)
    else:
        why = "none found"
    if adapter is None:
        return WebGPUSupport(False, f"{wgpu.__name__} found no WebGPU adapter ({why}); Vulkan "
                             f"driver: {note}. Install libvulkan1 and mesa-vulkan-drivers, or "
                             "set VK_ICD_FILENAMES to a driver manifest.", "no-adapter",
                             mode="native")
    info = dict(adapter.info)
    name = info.get("device") or info.get("vendor") or "an adapter"
    return WebGPUSupport(True, f"WebGPU ready: {name} ({info.get('adapter_type', '?')}, "
                         f"{wgpu.__name__}; native, in this process)", mode="native",
                         adapter=str(name))


async def request_native_device(backend: str | None = None,
                                runtime_checks: bool | None = None) -> NativeDevice:
    """A :class:`NativeDevice` at the adapter's limits (buffers capped at 2147483644 bytes).

    `backend` is ``"wgpu"`` or ``"wgpudawn"`` (default: ``TENSORGRAD_WGPU`` or ``wgpu``).
    `runtime_checks` (default: ``TENSORGRAD_RUNTIME_CHECKS``, on): False compiles kernels
    without bounds checks and loop counters (``wgpu`` only; see the module docstring).
    Raises RuntimeError, naming the driver setup, when no adapter or device can be made."""
    if runtime_checks is None:
        runtime_checks = _runtime_checks_default()
    elif not isinstance(runtime_checks, bool):
        raise TypeError(f"request_native_device: runtime_checks must be a bool or None, "
                        f"got {runtime_checks!r}")
    wgpu = _import_backend(backend)
    if not runtime_checks:
        _trusted_module_maker(wgpu.__name__)  # fail before making a device
    note = configure_vulkan_driver(wgpu.__name__)
    try:
        adapter = await _pick_adapter(wgpu)
    except Exception as err:
        raise RuntimeError(f"{wgpu.__name__}: no WebGPU adapter ({_error_text(err)}). "
                           f"Vulkan driver: {note}. Install libvulkan1 and mesa-vulkan-drivers, "
                           "or set VK_ICD_FILENAMES to a driver manifest "
                           f"(SwiftShader: {SWIFTSHADER_ICDS[0]}).") from err
    if adapter is None:
        raise RuntimeError(f"{wgpu.__name__}: no WebGPU adapter. Vulkan driver: {note}.")
    required = _required_limits(adapter.limits)
    features = _wanted_features(adapter)
    try:
        try:
            device = await adapter.request_device_async(
                label="tensorgrad", required_limits=required, required_features=features)
        except Exception:
            if not features:
                raise
            device = await adapter.request_device_async(label="tensorgrad",
                                                        required_limits=required)
    except Exception as err:
        raise RuntimeError(f"{wgpu.__name__}: request_device failed on {dict(adapter.info)} "
                           f"with limits {required}: {_error_text(err)}") from err
    native = NativeDevice(wgpu, adapter, device, note, runtime_checks)
    await native._probe_work_done()
    return native
