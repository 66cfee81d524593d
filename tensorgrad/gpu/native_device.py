"""The native adapter's device: :class:`NativeDevice`, the
:class:`~tensorgrad.gpu.interface.GPUDevice` protocol on a wgpu-py device (buffers, kernels,
programs, one step's submissions with bounded work in flight, readback through a bounded pool
of staging buffers, device loss). Programs and their encoding are in
:mod:`tensorgrad.gpu.native_program`; :mod:`tensorgrad.gpu.native` requests the device.
"""

from __future__ import annotations

import asyncio
import functools
import re
import threading
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..errors import DeviceLostError, ShaderCompileError
from .interface import (
    AdapterInfo,
    Binding,
    BufferHandle,
    Copy,
    DeviceLimits,
    Dispatch,
    KernelHandle,
    ProgramHandle,
    ReadyKernels,
    split_slice,
)
from .lifetimes import DeferredFrees
from .native_program import (
    NativeKernel,
    NativeProgram,
    RuntimeChecks,
    _Op,
    bind_group_entries,
    build_program,
    checked_module,
    compilation_errors,
    encode,
    error_text,
    field_of,
    native_kernel,
    raw_pass_calls,
    trusted_module_maker,
    wgpu_buffer,
)
from .workdone import NativeWorkDone

if TYPE_CHECKING:
    from .interface import HostBytes

STAGING_KEPT, STAGING_KEPT_BYTES = 8, 64 << 20  # free readback buffers pooled, at most
# wgpu-native spells some features its own way.
NATIVE_FEATURE = {"subgroups": "subgroup"}
_STANDARD_FEATURE = {v: k for k, v in NATIVE_FEATURE.items()}
_CHECKS_NOTE = {True: ", bounds checks and loop counters", "bounds": "",
                False: ", no runtime checks"}


def adapter_kind(info: Any) -> str:
    """The adapter type wgpu reports, normalised: discretegpu, integratedgpu, cpu, ..."""
    return str(field_of(info, "adapter_type", "unknown")).lower().replace("_", "").replace(" ", "")


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


Method = TypeVar("Method", bound=Callable[..., Any])


def _loss_checked(method: Method) -> Method:
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
        return cast(Method, run_async)

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
    return cast(Method, run)


class NativeDevice:
    """A WebGPU device from wgpu-py (``wgpu`` or ``wgpudawn``). See :class:`GPUDevice`."""

    def __init__(self, wgpu: ModuleType, adapter: Any, device: Any, driver_note: str = "",
                 runtime_checks: RuntimeChecks = True):
        self.wgpu = wgpu
        self.backend = wgpu.__name__
        self.adapter = adapter
        self.device = device
        self.queue = device.queue
        self._raw = raw_pass_calls()
        self.driver_note = driver_note
        self.runtime_checks = runtime_checks
        self._create_module = (checked_module if runtime_checks is True
                               else trusted_module_maker(self.backend, runtime_checks))
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
                            + _CHECKS_NOTE[runtime_checks])
        self.info = AdapterInfo(
            vendor=str(info.get("vendor") or ""), architecture=str(info.get("architecture") or ""),
            description=name, backend=str(info.get("backend_type") or ""),
            software=adapter_kind(info) == "cpu",
            features=frozenset(_STANDARD_FEATURE.get(f, f) for f in device.features))
        usage = wgpu.BufferUsage
        self._storage_usage = usage.STORAGE | usage.COPY_SRC | usage.COPY_DST
        self._staging_usage = usage.MAP_READ | usage.COPY_DST
        self._map_read = wgpu.MapMode.READ
        self._staging: list[Any] = []  # free readback buffers, most recently used last
        self._staging_lock = threading.Lock()
        self._frees = DeferredFrees()  # (see in_use)
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
                self.wait_note = f"native-poll unavailable: {error_text(err)}"
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
            native = self._native_done
            if isinstance(done, int) and native is not None:
                await native.wait(done)  # a token of the native work-done poll
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
    def create_buffer(self, size: int, label: str = "") -> BufferHandle:
        """A zero-initialised storage buffer of `size` bytes (rounded up to a multiple of 4)."""
        size = max(4, (int(size) + 3) & ~3)
        if size > self.limits.max_buffer_size:
            raise ValueError(f"buffer '{label}' of {size} bytes exceeds maxBufferSize "
                             f"{self.limits.max_buffer_size}")
        buffer = self.device.create_buffer(size=size, usage=self._storage_usage, label=label)
        self._count("buffers created")
        return BufferHandle(buffer)

    @_loss_checked
    def write_buffer(self, buffer: Binding, data: HostBytes, offset: int = 0) -> None:
        """Copy host bytes into `buffer` (or a slice) at `offset` (a multiple of 4). Data
        whose length is not a multiple of 4 is padded with zero bytes."""
        handle, base, _ = split_slice(buffer)
        offset += base
        m = memoryview(data)
        if not m.c_contiguous:
            m = memoryview(m.tobytes())
        if m.nbytes % 4:
            m = memoryview(m.tobytes() + bytes(4 - m.nbytes % 4))
        if m.nbytes:
            self.queue.write_buffer(wgpu_buffer(handle), offset, m)

    def destroy_buffer(self, buffer: BufferHandle) -> None:
        handle = wgpu_buffer(buffer)
        self._count("buffers destroyed")
        if not self._frees.later(lambda: self._destroy_quietly(handle)):
            self._destroy_quietly(handle)

    def in_use(self) -> AbstractContextManager[None]:
        """See :meth:`GPUDevice.in_use` and :mod:`tensorgrad.gpu.lifetimes`: buffers and
        programs destroyed while a step is being submitted (by another thread, or by a task
        that ran while the step waited between chunks) are freed when the last user is done.
        Work already submitted keeps what it uses (wgpu frees a destroyed buffer once the
        submissions using it are done)."""
        return self._frees.in_use()

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
    def create_kernel(self, wgsl: str, label: str) -> KernelHandle:
        """Compile `wgsl` into a compute pipeline; :class:`ShaderCompileError` on failure."""
        device = self.device
        try:
            module = self._create_module(device, wgsl, label)
        except Exception as err:  # GPUValidationError (wgpu / wgpudawn) or a panic message
            raise ShaderCompileError(label, wgsl, [error_text(err)]) from err
        errors = compilation_errors(module)
        if errors:
            raise ShaderCompileError(label, wgsl, errors)
        try:
            pipeline = device.create_compute_pipeline(
                label=label, layout="auto", compute={"module": module, "entry_point": "main"})
        except Exception as err:
            raise ShaderCompileError(label, wgsl, [error_text(err)]) from err
        self._count("pipelines created")
        return KernelHandle(NativeKernel(pipeline, label, wgsl))

    def create_kernels(self, sources: Sequence[tuple[str, str]]) -> list[KernelHandle]:
        """:meth:`create_kernel` for each `(wgsl, label)`, one after another; when one fails,
        those made before it are released."""
        made: list[KernelHandle] = []
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

    def destroy_kernel(self, kernel: KernelHandle) -> None:
        """Drop the device's references to a pipeline (wgpu releases it once no program
        holds it either)."""
        native = native_kernel(kernel)
        if native.pipeline is None:
            return
        native.pipeline = native._layout = None
        self._count("pipelines destroyed")

    @_loss_checked
    def create_program(self, steps: Sequence[Dispatch | Copy], chunk_size: int
                       ) -> ProgramHandle:
        """Bind groups made once; steps split into chunks of `chunk_size` dispatches."""
        program = build_program(steps, chunk_size,
                                self.limits.max_compute_workgroups_per_dimension,
                                self._bind_group)
        self._count("programs created")
        return ProgramHandle(program)

    def destroy_program(self, program: ProgramHandle) -> None:
        """Drop a program's chunks and bind groups (a run in flight keeps what it holds;
        inside :meth:`in_use`, once the last user is done: a submission that had not yet
        taken the chunks would run nothing and read back zeros)."""
        native = cast(NativeProgram, program)
        if native.released:
            return
        native.released = True
        self._count("programs destroyed")
        if not self._frees.later(lambda: setattr(native, "chunks", [])):
            native.chunks = []

    def _bind_group(self, kernel: NativeKernel, buffers: Sequence[Binding], label: str) -> Any:
        try:
            return self.device.create_bind_group(layout=kernel.layout(),
                                                 entries=bind_group_entries(buffers),
                                                 label=label)
        except Exception as err:
            raise ValueError(f"dispatch '{label}': cannot bind {len(buffers)} buffers "
                             f"(sizes {[wgpu_buffer(split_slice(b)[0]).size for b in buffers]}) to kernel "
                             f"'{kernel.label}': {error_text(err)}") from err

    # -- running

    def _encode(self, ops: list[_Op], reads: Sequence[tuple[Any, int, int, Any]] = (),
                fence: Any = None) -> Any:
        """One command buffer of `ops` (see :func:`~tensorgrad.gpu.native_program.encode`),
        then the read copies and the fence's."""
        return encode(self.device, ops, self._raw, reads,
                      None if fence is None else (self._fence_src, fence))

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

    async def _map_and_read(self, reads: list[tuple[Any, int, int, Any]],
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

    def _plan_reads(self, reads: Sequence[tuple[Binding, int]]
                    ) -> tuple[list[tuple[Any, int, int, Any]], list[int]]:
        planned, nbytes = [], []
        for binding, n in reads:
            handle, offset, _ = split_slice(binding)
            buffer = wgpu_buffer(handle)
            n = int(n)
            size = max(4, (n + 3) & ~3)
            if offset + size > buffer.size:
                raise ValueError(f"read of {n} bytes at {offset} from a buffer of "
                                 f"{buffer.size} bytes")
            planned.append((buffer, offset, size, self._take_staging(size)))
            nbytes.append(n)
        return planned, nbytes

    @_loss_checked
    async def execute(self, program: ProgramHandle,
                      writes: Sequence[tuple[Binding, HostBytes]],
                      reads: Sequence[tuple[Binding, int]]) -> list[memoryview]:
        """:meth:`submit`, then its readback."""
        return await (await self.submit(program, writes, reads))

    @_loss_checked
    async def submit(self, program: ProgramHandle,
                     writes: Sequence[tuple[Binding, HostBytes]],
                     reads: Sequence[tuple[Binding, int]]
                     ) -> Coroutine[Any, Any, list[memoryview]]:
        """Write inputs and submit the chunks with at most two submissions in flight; the
        read copies ride in the last submission. Returns (once the last chunk is submitted)
        the readback: a coroutine of the bytes of each read, to be awaited once.

        Before chunk i is submitted, chunk i - 2 must be done, so only chunks 0..n-3 carry a
        completion token: a two-chunk step waits for nothing but its read maps, and the wait
        for chunk i - 2 overlaps the GPU running chunk i - 1."""
        with self._frees.in_use():  # (see in_use)
            for buffer, data in writes:
                self.write_buffer(buffer, data)
            planned, nbytes = self._plan_reads(reads)
            chunks = cast(NativeProgram, program).chunks
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
        return self._readback(pending, planned, nbytes)

    submits_now = False  # (see submit_now)

    def submit_now(self, program: ProgramHandle, writes: Sequence[tuple[Binding, HostBytes]],
                   reads: Sequence[tuple[Binding, int]],
                   done: Callable[[list[memoryview] | BaseException], None]) -> bool:
        """False: steps here go through :meth:`submit` (an event loop is always there)."""
        return False

    async def _readback(self, pending: deque[tuple[Any, Any]],
                        planned: list[tuple[Any, int, int, Any]],
                        nbytes: list[int]) -> list[memoryview]:
        """The rest of a submitted step: its remaining waits, then its reads mapped (the
        device loss check of :func:`_loss_checked` inline: one coroutine less a step)."""
        self._raise_if_lost()
        try:
            while pending:
                await self._wait(*pending.popleft())
            if not planned:
                return []
            return await self._map_and_read(planned, nbytes)
        except DeviceLostError:
            raise
        except Exception as err:
            self._note_loss(err)
            raise

    @_loss_checked
    async def read_buffers(self, reads: Sequence[tuple[Binding, int]]) -> list[memoryview]:
        """Read `(buffer, nbytes)` pairs back (one submission, one map each)."""
        with self.in_use():
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
