"""The small GPU interface every adapter implements (native wgpu-py, browser navigator.gpu).

The runtime talks only to this interface. Nothing here names wgpu, Pyodide or JS types:
handles are opaque objects owned by the adapter.

A step is one call to :meth:`GPUDevice.execute` (or :meth:`GPUDevice.submit`, then its
readback) on a :class:`Program` built once at compile time, so a browser adapter can encode
the whole step with a constant number of FFI calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NewType, Protocol, TypeVar

if TYPE_CHECKING:
    from typing import TypeAlias

    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

    # Host bytes for a write: any object with the buffer protocol (bytes, memoryview,
    # array.array, a numpy array).
    HostBytes: TypeAlias = Buffer

# Opaque handles: what an adapter made (a wgpu-py buffer, a JS GPUBuffer, the adapter's own
# pipeline and program records). The runtime holds them and hands them back to the device
# that made them, never looking inside; an adapter wraps what it makes (``BufferHandle(buf)``,
# free at run time) and reads its own handles back.
BufferHandle = NewType("BufferHandle", object)
KernelHandle = NewType("KernelHandle", object)
ProgramHandle = NewType("ProgramHandle", object)
R = TypeVar("R")
V = TypeVar("V")


@dataclass(frozen=True)
class DeviceLimits:
    """The device limits the planner and code generator respect."""

    max_storage_buffer_binding_size: int = 134_217_728
    max_buffer_size: int = 268_435_456
    max_storage_buffers_per_shader_stage: int = 8
    max_compute_workgroups_per_dimension: int = 65_535
    max_compute_invocations_per_workgroup: int = 256
    max_compute_workgroup_storage_size: int = 16_384


# Optional WebGPU features tensorgrad asks for when the adapter has them (standard names).
WANTED_FEATURES = ("subgroups", "timestamp-query", "shader-f16")


@dataclass(frozen=True)
class AdapterInfo:
    """What a device reports about itself, for code generation and logs.

    `software`: a CPU implementation of the GPU (SwiftShader, lavapipe, WARP), where
    shared-memory tiles with barriers are slow. `features`: the optional WebGPU features
    enabled on the device, by their standard names (``"subgroups"``, ``"timestamp-query"``,
    ``"shader-f16"``)."""

    vendor: str = ""
    architecture: str = ""
    description: str = ""
    backend: str = ""
    software: bool = False
    features: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        """The adapter for a message: its description, else its vendor and architecture
        (a browser's SwiftShader describes itself only as "google" "swiftshader")."""
        return (self.description or " ".join(p for p in (self.vendor, self.architecture) if p)
                or "an unnamed adapter")


@dataclass(frozen=True)
class WebGPUSupport:
    """Whether WebGPU can run tensorgrad here: `ok`, a message for a person, and when not ok
    a `reason`: "no-webgpu" (no WebGPU API at all), "no-adapter" (no usable GPU adapter) or
    "main-thread" (a Pyodide on a page's main thread: use ``tensorgrad.web.start()``).

    `mode` says where tensorgrad would run: "native" (wgpu-py in CPython), "worker" (in-process,
    on the ``navigator.gpu`` of the Web Worker this Pyodide runs in), "main-thread" (a page's
    main thread, where tensorgrad runs only in its dedicated worker) or "dedicated-worker"
    (``tensorgrad.web.check_webgpu()``: the page's probe for that worker); "" when unknown.
    `adapter` names the adapter found ("google swiftshader"). `jspi` (browser only): whether
    this Pyodide call can wait on a JS promise synchronously (JSPI), which lets a compile
    build its kernels in parallel and report a shader error at once; None natively."""

    ok: bool
    message: str
    reason: str | None = None
    mode: str = ""
    adapter: str = ""
    jspi: bool | None = None


@dataclass(frozen=True)
class BufferSlice:
    """`size` bytes of `buffer` from `offset` (a multiple of 256, WebGPU's storage offset
    alignment): wherever the interface takes a buffer, a slice binds, writes or reads just
    that range."""

    buffer: BufferHandle
    offset: int
    size: int


# What a kernel binds, and where the interface reads or writes: a whole buffer or a slice.
Binding = BufferHandle | BufferSlice


def relay(done: Callable[[R | BaseException], None], convert: Callable[[V], R]
          ) -> Callable[[V | BaseException], None]:
    """A callback for a value that arrives later (or the error instead): it hands `done`
    ``convert(value)``, or the error, or the exception `convert` raised."""
    def arrived(got: V | BaseException) -> None:
        if isinstance(got, BaseException):
            done(got)
            return
        try:
            converted = convert(got)
        except Exception as exc:  # noqa: BLE001 - the receiver's result
            done(exc)
            return
        done(converted)

    return arrived


def split_slice(buffer: Binding) -> tuple[BufferHandle, int, int | None]:
    """(handle, offset, size or None for the whole buffer) of a buffer or a slice."""
    if isinstance(buffer, BufferSlice):
        return buffer.buffer, buffer.offset, buffer.size
    return buffer, 0, None


STORAGE_OFFSET_ALIGNMENT = 256  # minStorageBufferOffsetAlignment's default (and maximum)


@dataclass(frozen=True)
class Dispatch:
    """One compute pass: `kernel` bound to `buffers` (binding i = buffers[i], group 0; each a
    buffer or a :class:`BufferSlice`)."""

    kernel: KernelHandle
    buffers: tuple[Binding, ...]
    workgroups: tuple[int, int, int]
    label: str = ""


@dataclass(frozen=True)
class Copy:
    """A buffer-to-buffer copy of `size` bytes, encoded in order with the dispatches."""

    src: BufferHandle
    dst: BufferHandle
    size: int
    src_offset: int = 0
    dst_offset: int = 0


class PendingKernels(Protocol):
    """Pipelines being compiled in the background (:meth:`GPUDevice.start_kernels`)."""

    def ready(self) -> bool:
        """Whether every pipeline is compiled (or one failed): :meth:`wait` would not block."""
        ...

    def wait(self) -> list[KernelHandle]:
        """The pipelines, in order, once compiled (blocking until then where the device can
        block; call it after :meth:`ready` says True where it cannot). Raises
        :class:`ShaderCompileError` for the first that failed (those made are released)."""
        ...

    def cancel(self) -> None:
        """Give the pipelines up: those made are released, those still compiling are dropped
        when done. Idempotent; nothing after :meth:`wait`."""
        ...


class ReadyKernels:
    """:class:`PendingKernels` of pipelines already made (a device that compiles at once)."""

    def __init__(self, device: GPUDevice, kernels: list[KernelHandle]):
        self._device: GPUDevice | None = device
        self._kernels = kernels

    def ready(self) -> bool:
        return True

    def wait(self) -> list[KernelHandle]:
        self._device = None
        return self._kernels

    def cancel(self) -> None:
        if self._device is not None:
            for kernel in self._kernels:
                self._device.destroy_kernel(kernel)
            self._device = None


class GPUDevice(Protocol):
    """One WebGPU device. All buffers have usage STORAGE | COPY_SRC | COPY_DST."""

    limits: DeviceLimits
    info: AdapterInfo
    description: str  # adapter vendor / architecture, for logs and benchmarks
    # What the device made and freed through this interface, for leak checks: "buffers
    # created" / "destroyed", "pipelines created" / "destroyed", "programs created" /
    # "destroyed".
    counts: Counter[str]
    # Whether submit_now can submit a step (the browser's device; natively False). The
    # browser's may be set False: every step then goes through the event loop.
    submits_now: bool

    @property
    def lost(self) -> str | None:
        """Why the device was lost or destroyed, or None while it works."""
        ...

    def create_buffer(self, size: int, label: str = "") -> BufferHandle:
        """A zero-initialised storage buffer of `size` bytes (a multiple of 4)."""
        ...

    def write_buffer(self, buffer: Binding, data: HostBytes, offset: int = 0) -> None:
        """Copy host bytes (any buffer-protocol object) into `buffer` at `offset`."""
        ...

    def destroy_buffer(self, buffer: BufferHandle) -> None:
        """Free `buffer`; inside :meth:`in_use` (any thread) only once the last user left."""
        ...

    def in_use(self) -> AbstractContextManager[None]:
        """While inside, no buffer is freed (a destroy waits for the last user to leave): a
        submission checks that its graph is alive inside, then submits with buffers that
        stay valid, whatever another thread or a task between two of its chunks destroys."""
        ...

    def create_kernel(self, wgsl: str, label: str) -> KernelHandle:
        """Compile `wgsl` (entry point `main`, bind group 0, layout 'auto') into a compute
        pipeline. Raises :class:`ShaderCompileError` on any validation failure."""
        ...

    def create_kernels(self, sources: Sequence[tuple[str, str]]) -> list[KernelHandle]:
        """:meth:`create_kernel` for each `(wgsl, label)`, in order; a device may compile
        them in parallel. Raises :class:`ShaderCompileError` for the first that fails."""
        ...

    def start_kernels(self, sources: Sequence[tuple[str, str]]) -> PendingKernels:
        """Begin :meth:`create_kernels` and return without waiting where the device compiles
        in the background (the browser); elsewhere compile now (:class:`ReadyKernels`)."""
        ...

    def destroy_kernel(self, kernel: KernelHandle) -> None:
        """Release a pipeline made by :meth:`create_kernel(s)`: the device drops every
        reference it holds (a program still using it keeps it until that program is
        destroyed). Idempotent."""
        ...

    def create_program(self, steps: Sequence[Dispatch | Copy], chunk_size: int) -> ProgramHandle:
        """Prepare an ordered list of dispatches and copies (bind groups made here, once).

        `chunk_size` is the most compute passes per queue submission (0: one submission)."""
        ...

    def destroy_program(self, program: ProgramHandle) -> None:
        """Release a program's bind groups and chunks (a run in flight finishes with what it
        holds). Idempotent."""
        ...

    def live_objects(self) -> dict[str, int]:
        """How many objects made through this interface are live, by kind: "buffers",
        "pipelines", "programs" (created minus destroyed); a device may add kinds of its own
        (e.g. its pooled readback buffers)."""
        ...

    async def execute(
        self,
        program: ProgramHandle,
        writes: Sequence[tuple[Binding, HostBytes]],
        reads: Sequence[tuple[Binding, int]],
    ) -> list[memoryview]:
        """Run one step: write host data, run the program's chunks with bounded work in
        flight, then read back `(buffer, nbytes)` pairs. Returns the bytes of each read."""
        ...

    async def submit(
        self,
        program: ProgramHandle,
        writes: Sequence[tuple[Binding, HostBytes]],
        reads: Sequence[tuple[Binding, int]],
    ) -> Coroutine[Any, Any, list[memoryview]]:
        """:meth:`execute` in two parts: this returns once the step is written and submitted
        (its readback already asked for), with a coroutine of the bytes of each read, which
        the caller awaits exactly once. Whatever is written, run or read after this returns
        runs after the step on the GPU (WebGPU's queue order), so the next step can be
        submitted while this one's readback is still on its way."""
        ...

    def submit_now(self, program: ProgramHandle, writes: Sequence[tuple[Binding, HostBytes]],
                   reads: Sequence[tuple[Binding, int]],
                   done: Callable[[list[memoryview] | BaseException], None]) -> bool:
        """:meth:`submit` without an event loop, where the device can submit the step
        without waiting for anything: True once it is submitted, `done` then called (from
        the host's event loop) with the bytes of each read, or the error, when they are in.
        False when it cannot: nothing was done (the browser's express steps; a device may
        always answer False)."""
        ...

    async def read_buffers(self, reads: Sequence[tuple[Binding, int]]) -> list[memoryview]:
        """Read `(buffer, nbytes)` pairs back to the host (one submission, one map each)."""
        ...

    def destroy(self) -> None: ...
