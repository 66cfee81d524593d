"""The browser adapter: :class:`~tensorgrad.gpu.interface.GPUDevice` over ``navigator.gpu``.

Runs inside Pyodide (a Web Worker or the page). Every crossing of the Python↔JS boundary costs
far more than a WebGPU call made from JS, so the per-step work lives in a small JS module
(``browser.mjs`` beside this file, imported once): :meth:`BrowserDevice.create_program` hands the whole
list of dispatches and copies to JS in one call, which makes the bind groups and chunks once;
:meth:`BrowserDevice.execute` is then a constant number of FFI calls whatever the kernel
count. ``ffi_calls`` counts every crossing the adapter makes, for tests and benchmarks.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, cast

from ..errors import DeviceLostError, MainThreadError, ShaderCompileError
from .interface import (
    WANTED_FEATURES,
    AdapterInfo,
    Binding,
    BufferHandle,
    Copy,
    DeviceLimits,
    Dispatch,
    KernelHandle,
    PendingKernels,
    ProgramHandle,
    ReadyKernels,
    WebGPUSupport,
    relay,
    split_slice,
)

if TYPE_CHECKING:
    from .interface import HostBytes

__all__ = ["MAIN_THREAD_HELP", "BrowserDevice", "BrowserProgram", "browser_mode", "probe_browser",
           "request_browser_device"]

# Device limits requested at the adapter's maximum (the names of DeviceLimits, in JS).
_LIMITS = {
    "max_storage_buffer_binding_size": "maxStorageBufferBindingSize",
    "max_buffer_size": "maxBufferSize",
    "max_storage_buffers_per_shader_stage": "maxStorageBuffersPerShaderStage",
    "max_compute_workgroups_per_dimension": "maxComputeWorkgroupsPerDimension",
    "max_compute_invocations_per_workgroup": "maxComputeInvocationsPerWorkgroup",
    "max_compute_workgroup_storage_size": "maxComputeWorkgroupStorageSize",
}



_JS_FUNCTIONS = ("createBuffer", "writeBuffer", "createKernel", "createKernels", "startKernels",
                 "createProgram", "destroyProgram", "execute", "submit", "submitNow", "readBuffers",
                 "destroy", "lostReason")
_helper: Any = None


async def _js_helper() -> Any:
    """The adapter's JS module (browser.mjs beside this file, imported once per interpreter
    from a Blob URL, so it works in a worker and on a page alike)."""
    global _helper
    if _helper is None:
        from pyodide.code import run_js

        source = (resources.files(__package__) / "browser.mjs").read_text()
        load = run_js("(src) => import(URL.createObjectURL("
                      "new Blob([src], { type: 'text/javascript' })))")
        _helper = await load(source)
        _install_normals(_helper)
    return _helper


def _install_normals(helper: Any) -> None:
    """Param init's normals made in JS from now on (:data:`tensorgrad.init.FAST_NORMALS`),
    unless NumPy makes them."""
    from .. import init

    js_normals = helper.normals

    def normals(state: int, n: int, std: float) -> array[float]:
        return array("f", js_normals(state, n, std).to_bytes())

    init.FAST_NORMALS = normals


@dataclass
class BrowserProgram:
    """A program prepared in JS: bind groups and chunks live in `plan` (a JS object)."""

    plan: Any  # None once destroyed
    dispatches: int
    chunks: int


@dataclass
class BrowserKernel:
    """A compute pipeline (a JS object) and its label."""

    pipeline: Any  # None once destroyed
    label: str


class BrowserDevice:
    """:class:`~tensorgrad.gpu.interface.GPUDevice` over ``navigator.gpu`` (inside Pyodide)."""

    def __init__(self, helper: Any, state: Any, limits: DeviceLimits, info: AdapterInfo,
                 description: str):
        self._fns = {name: getattr(helper, name) for name in _JS_FUNCTIONS}
        self._state = state
        self.limits = limits
        self.info = info
        self.description = description
        self.ffi_calls = 0  # every Python→JS crossing this adapter made
        self.counts: Counter[str] = Counter()
        self._unchecked: list[tuple[Any, str, str]] = []  # kernels validated at next execute
        # Steps may be submitted at once, outside the event loop (submit_now: express
        # steps); False sends every step through the event loop (the same results).
        self.submits_now = True

    # -- FFI, counted ------------------------------------------------------------------------
    def in_use(self) -> AbstractContextManager[None]:
        """See :meth:`GPUDevice.in_use`: nothing to hold here (one thread, and a browser
        fails a submission that uses a destroyed buffer through its error scope, as that
        step's error, where wgpu-native aborts the process)."""
        return nullcontext()

    def _call(self, name: str, *args: Any) -> Any:
        self.ffi_calls += 1
        return self._fns[name](self._state, *args)

    def _to_js(self, value: Any) -> Any:
        from pyodide.ffi import to_js

        self.ffi_calls += 1
        return to_js(value, create_pyproxies=False)

    def _lost_mapped(self, call: Callable[[], Any]) -> Any:
        """`call()`; the helper's DeviceLostError (thrown at once) becomes tensorgrad's."""
        from pyodide.ffi import JsException

        try:
            return call()
        except JsException as exc:
            lost = _device_lost(exc)
            if lost is None:
                raise
            raise lost from None

    async def _await(self, promise: Any) -> Any:
        """Await a JS promise; the helper's DeviceLostError becomes tensorgrad's."""
        from pyodide.ffi import JsException

        self.ffi_calls += 1
        try:
            return await promise
        except JsException as exc:
            lost = _device_lost(exc)
            if lost is None:
                raise
            raise lost from None

    def live_objects(self) -> dict[str, int]:
        """Live objects made through this adapter: "buffers", "pipelines", "programs"."""
        c = self.counts
        return {"buffers": c["buffers created"] - c["buffers destroyed"],
                "pipelines": c["pipelines created"] - c["pipelines destroyed"],
                "programs": c["programs created"] - c["programs destroyed"]}

    @property
    def lost(self) -> str | None:
        """Why the device was lost ("reason: message"), or None while it works."""
        reason = self._call("lostReason")
        return None if reason is None else str(reason)

    # -- GPUDevice ---------------------------------------------------------------------------
    def create_buffer(self, size: int, label: str = "") -> BufferHandle:
        """A zero-initialised storage buffer of `size` bytes."""
        buffer = self._call("createBuffer", int(size), label)
        self.counts["buffers created"] += 1
        return buffer

    def write_buffer(self, buffer: Binding, data: HostBytes, offset: int = 0) -> None:
        """Copy host bytes into `buffer` (or a slice) at `offset`."""
        handle, base, _ = split_slice(buffer)
        self._call("writeBuffer", handle, int(base + offset), self._to_js(_bytes_view(data)))

    def destroy_buffer(self, buffer: BufferHandle) -> None:
        self.ffi_calls += 1
        cast(Any, buffer).destroy()  # a JS GPUBuffer
        self.counts["buffers destroyed"] += 1

    def create_kernel(self, wgsl: str, label: str) -> KernelHandle:
        """Compile `wgsl` into a compute pipeline; raises ShaderCompileError on any error.

        The error check is asynchronous in WebGPU: it blocks here through JSPI (``run_sync``)
        where Pyodide can, else it is deferred to :meth:`check_kernels` / the next execute."""
        from pyodide.ffi import can_run_sync, run_sync

        made = self._call("createKernel", wgsl, label)
        self.ffi_calls += 2  # the two attribute reads below
        kernel, check = BrowserKernel(made.pipeline, label), made.check
        self.counts["pipelines created"] += 1
        if can_run_sync():
            self.ffi_calls += 1
            _raise_if_errors(run_sync(check), wgsl, label)
        else:
            self._unchecked.append((check, wgsl, label))
        return KernelHandle(kernel)

    def create_kernels(self, sources: Sequence[tuple[str, str]]) -> list[KernelHandle]:
        """Compile every `(wgsl, label)` at once: the pipelines are made in parallel
        (``createComputePipelineAsync``) and waited for together through JSPI; in Chromium on
        SwiftShader (2 cores) the addition transformer's 49 kernels took 1.7-1.9 s instead of
        2.4 s one by one. Raises ShaderCompileError for the first that fails. Without JSPI,
        kernel by kernel (:meth:`create_kernel`)."""
        from pyodide.ffi import can_run_sync

        if not can_run_sync():
            return self._one_by_one(sources)
        return self.start_kernels(sources).wait()

    def _one_by_one(self, sources: Sequence[tuple[str, str]]) -> list[KernelHandle]:
        kernels: list[KernelHandle] = []
        try:
            for wgsl, label in sources:
                kernels.append(self.create_kernel(wgsl, label))
        except BaseException:  # release those made before the one that failed
            for kernel in kernels:
                self.destroy_kernel(kernel)
            raise
        return kernels

    def start_kernels(self, sources: Sequence[tuple[str, str]]) -> PendingKernels:
        """Begin compiling every `(wgsl, label)` in parallel (``createComputePipelineAsync``)
        and return at once: Python goes on (initialising params, running steps) while the
        browser compiles. Without JSPI (no way to block), kernel by kernel now."""
        from pyodide.ffi import can_run_sync

        if not can_run_sync():
            return ReadyKernels(self, self._one_by_one(sources))
        job = self._call("startKernels", self._to_js([w for w, _ in sources]),
                         self._to_js([label for _, label in sources]))
        return _BrowserPendingKernels(self, job, list(sources))

    def destroy_kernel(self, kernel: KernelHandle) -> None:
        """Drop the adapter's reference to a pipeline (the JS object is collected once no
        program holds it either)."""
        made = cast(BrowserKernel, kernel)
        if made.pipeline is None:
            return
        made.pipeline = None
        self.counts["pipelines destroyed"] += 1

    async def check_kernels(self) -> None:
        """Raise ShaderCompileError for any kernel whose check was deferred."""
        unchecked, self._unchecked = self._unchecked, []
        for check, wgsl, label in unchecked:
            _raise_if_errors(await self._await(check), wgsl, label)

    def create_program(self, steps: Sequence[Dispatch | Copy], chunk_size: int
                       ) -> ProgramHandle:
        """Hand every dispatch and copy to JS at once; bind groups and chunks are made there."""
        plain: list[list[Any]] = []
        for s in steps:
            if isinstance(s, Dispatch):
                wg = tuple(int(n) for n in s.workgroups) + (1, 1, 1)
                binds = [[h, off, size or 0] for h, off, size in map(split_slice, s.buffers)]
                kernel = cast(BrowserKernel, s.kernel)
                plain.append(["d", kernel.pipeline, binds, *wg[:3], s.label])
            else:
                plain.append(["c", s.src, int(s.src_offset), s.dst, int(s.dst_offset), int(s.size)])
        plan = self._call("createProgram", self._to_js(plain), int(chunk_size))
        dispatches = sum(isinstance(s, Dispatch) for s in steps)
        self.counts["programs created"] += 1
        chunks = 1 if chunk_size <= 0 else max(1, -(-dispatches // chunk_size))
        return ProgramHandle(BrowserProgram(plan, dispatches, chunks))

    def destroy_program(self, program: ProgramHandle) -> None:
        """Drop the program's bind groups and chunks in JS and its proxy here (a run in
        flight keeps the chunks it read)."""
        made = cast(BrowserProgram, program)
        if made.plan is None:
            return
        self._call("destroyProgram", made.plan)
        made.plan = None
        self.counts["programs destroyed"] += 1

    async def execute(self, program: ProgramHandle, writes: Sequence[tuple[Binding, HostBytes]],
                      reads: Sequence[tuple[Binding, int]]) -> list[memoryview]:
        """Write inputs, run the program's chunks (two in flight at most), read back: four FFI
        calls whatever the number of kernels, writes and reads."""
        args = await self._step_args(writes, reads)
        out = await self._await(self._call("execute", cast(BrowserProgram, program).plan, args))
        return self._split(out, reads)

    async def submit(self, program: ProgramHandle, writes: Sequence[tuple[Binding, HostBytes]],
                     reads: Sequence[tuple[Binding, int]]
                     ) -> Coroutine[Any, Any, list[memoryview]]:
        """:meth:`execute` in two parts: returns once the step is submitted, with a coroutine
        of its reads (a one-chunk step is submitted in the call itself, no promise awaited)."""
        args = await self._step_args(writes, reads)
        job = self._lost_mapped(lambda: self._call("submit", cast(BrowserProgram, program).plan,
                                                   args))
        self.ffi_calls += 1  # the attribute read
        ready = job.ready
        if ready is not None:  # more than one chunk (or a first run): submitted in JS time
            await self._await(ready)
        return self._readback(job, reads)

    def submit_now(self, program: ProgramHandle, writes: Sequence[tuple[Binding, HostBytes]],
                   reads: Sequence[tuple[Binding, int]],
                   done: Callable[[list[memoryview] | BaseException], None]) -> bool:
        """:meth:`submit` without an event loop where no wait is needed (a one-chunk program
        already checked, every kernel validated): True once submitted, `done` then called
        with the bytes of each read, or the error, when they are in (from the JS event
        loop). False when it would have to wait, or `submits_now` is False: nothing was
        done."""
        if self._unchecked or not self.submits_now:
            return False
        from pyodide.ffi import create_proxy

        def split(out: Any) -> list[memoryview]:
            return self._split(out, reads)

        relayed = relay(done, split)

        def arrived(out: Any, error: Any) -> None:
            relayed(out if error is None else _js_error(error))

        args = self._args(writes, reads)
        plan = cast(BrowserProgram, program).plan
        callback = create_proxy(arrived)
        try:
            taken = self._lost_mapped(lambda: self._call("submitNow", plan, args, callback))
        except BaseException:
            callback.destroy()
            raise
        if not taken:
            callback.destroy()
        return bool(taken)

    async def _readback(self, job: Any, reads: Sequence[tuple[Binding, int]]
                        ) -> list[memoryview]:
        self.ffi_calls += 1  # the attribute read
        out = await self._await(job.readback)
        return self._split(out, reads)

    async def _step_args(self, writes: Sequence[tuple[Binding, HostBytes]],
                         reads: Sequence[tuple[Binding, int]]) -> Any:
        """The JS arguments of a step: the writes as one blob, the reads flat."""
        if self._unchecked:
            await self.check_kernels()
        return self._args(writes, reads)

    def _args(self, writes: Sequence[tuple[Binding, HostBytes]],
              reads: Sequence[tuple[Binding, int]]) -> Any:
        blob = bytearray()
        handles, offsets, sizes = [], [], []
        for buffer, data in writes:
            view = _bytes_view(data)
            handle, offset, _ = split_slice(buffer)
            blob += view
            handles.append(handle)
            offsets.append(offset)
            sizes.append(view.nbytes)
        return self._to_js([handles, offsets, sizes, memoryview(blob), _flat_reads(reads)])

    async def read_buffers(self, reads: Sequence[tuple[Binding, int]]) -> list[memoryview]:
        """Read `(buffer, nbytes)` pairs back: one submission, one map."""
        flat = self._to_js(_flat_reads(reads))
        out = await self._await(self._call("readBuffers", flat))
        return self._split(out, reads)

    def _split(self, out: Any, reads: Sequence[tuple[Binding, int]]) -> list[memoryview]:
        self.ffi_calls += 1
        data = memoryview(out.to_bytes())
        views, offset = [], 0
        for _, n in reads:
            views.append(data[offset:offset + int(n)])
            offset += (int(n) + 3) & ~3
        return views

    def destroy(self) -> None:
        self._call("destroy")


class _BrowserPendingKernels:
    """:class:`~tensorgrad.gpu.interface.PendingKernels` of a JS startKernels job."""

    def __init__(self, device: BrowserDevice, job: Any, sources: list[tuple[str, str]]):
        self._device = device
        self._job: Any = job
        self._sources = sources

    def ready(self) -> bool:
        self._device.ffi_calls += 1
        return self._job is None or bool(self._job.done)

    def wait(self) -> list[KernelHandle]:
        from pyodide.ffi import run_sync

        if self._job is None:
            raise RuntimeError("these kernels were cancelled or already taken")
        job, self._job = self._job, None
        device = self._device
        device.ffi_calls += 2  # the wait, the promise read
        made = run_sync(job.promise)
        kernels: list[KernelHandle] = []
        try:
            for (wgsl, label), got in zip(self._sources, made):
                device.ffi_calls += 2  # the two attribute reads
                _raise_if_errors(got.messages, wgsl, label)
                kernels.append(KernelHandle(BrowserKernel(got.pipeline, label)))
                device.counts["pipelines created"] += 1
        except BaseException:  # release those made before the one that failed
            for kernel in kernels:
                device.destroy_kernel(kernel)
            raise
        return kernels

    def cancel(self) -> None:
        self._job = None  # the JS pipelines are collected once the job settles


def _device_lost(error: Any) -> DeviceLostError | None:
    """tensorgrad's DeviceLostError for the helper's (a JS error so named), else None."""
    if str(getattr(error, "name", "")) != "DeviceLostError":
        return None
    return DeviceLostError(str(error.message))


def _js_error(error: Any) -> BaseException:
    """The exception of a rejected JS promise, as awaiting it would raise it (a JS Error
    arrives as a JsException; the helper's DeviceLostError becomes tensorgrad's)."""
    lost = _device_lost(error)
    if lost is not None:
        return lost
    if isinstance(error, BaseException):
        return error
    return RuntimeError(f"a JS promise was rejected with {error!r}")


def _flat_reads(reads: Sequence[tuple[Binding, int]]) -> list[Any]:
    """[buffer, offset, nbytes, ...] of `(buffer or slice, nbytes)` pairs."""
    flat: list[Any] = []
    for buffer, n in reads:
        handle, offset, _ = split_slice(buffer)
        flat += [handle, offset, int(n)]
    return flat


def _bytes_view(data: HostBytes) -> memoryview:
    """The bytes of any buffer-protocol object, as a flat unsigned-byte memoryview."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _raise_if_errors(messages: Any, wgsl: str, label: str) -> None:
    found = [str(m) for m in messages]
    if found:
        raise ShaderCompileError(label, wgsl, found)


# Why a main-thread Pyodide does not use the GPU in-process, and what to do instead.
MAIN_THREAD_HELP = (
    "this Pyodide runs on the web page's main thread, where tensorgrad does not use the GPU "
    "in-process (compiling a model is seconds of Python, and the page would freeze meanwhile). "
    "Either start tensorgrad's dedicated worker from here: `session = await "
    "tensorgrad.web.start()`, then `await session.exec(model_source)` and `train = await "
    "session.compile(model=..., loss=..., inputs=..., optimizer=...)` (or "
    "`session.run_script(source)`); or run this code in a Web Worker, where `tg.compile` runs "
    "in-process on the worker's own navigator.gpu: PyScript's `<script type=\"py\" worker>`, "
    "JupyterLite's Pyodide kernel, or a worker of your own that loads Pyodide")


def browser_mode() -> str:
    """"worker" where this Pyodide runs in a Web Worker (or in a JS runtime without a page),
    "main-thread" on a web page's main thread."""
    import js

    if hasattr(js, "WorkerGlobalScope") or not hasattr(js, "document"):
        return "worker"
    return "main-thread"


def _jspi_note(jspi: bool, browser_has_jspi: bool) -> str:
    if jspi:
        return "JSPI: yes, kernels compile in parallel"
    why = ("this call cannot wait on a promise synchronously (not entered through "
           "runPythonAsync)" if browser_has_jspi else "this browser has no JSPI "
           "(WebAssembly.Suspending)")
    return (f"JSPI: no, {why}: kernels compile one at a time and a shader error is reported at "
            "the first step rather than at compile")


async def probe_browser() -> WebGPUSupport:
    """A :class:`~tensorgrad.gpu.WebGPUSupport` for ``navigator.gpu`` (no device is made): the
    mode (a worker, or a page's main thread, where the answer is no: see
    :data:`MAIN_THREAD_HELP`), the adapter and whether JSPI is usable."""
    from pyodide.ffi import can_run_sync

    mode, jspi = browser_mode(), bool(can_run_sync())
    got = (await (await _js_helper()).probeAdapter()).to_py()
    adapter = str(got.get("adapter") or "")
    if mode == "main-thread":
        found = f"WebGPU is here ({adapter})" if got["ok"] else str(got["message"])
        return WebGPUSupport(False, f"{found}, but {MAIN_THREAD_HELP}", "main-thread",
                             mode=mode, adapter=adapter, jspi=jspi)
    if not got["ok"]:
        return WebGPUSupport(False, str(got["message"]), got.get("reason"), mode=mode,
                             jspi=jspi)
    note = _jspi_note(jspi, bool(got.get("jspiBrowser")))
    return WebGPUSupport(True, f"WebGPU ready: {adapter} (in-process, on this Web Worker's "
                         f"navigator.gpu; {note})", mode=mode, adapter=adapter, jspi=jspi)


async def request_browser_device() -> BrowserDevice:
    """Request a WebGPU device from ``navigator.gpu`` at the adapter's limits. Raises
    :class:`~tensorgrad.errors.MainThreadError` on a web page's main thread."""
    from pyodide.ffi import to_js

    if browser_mode() == "main-thread":
        raise MainThreadError(f"tensorgrad cannot compile or run here: {MAIN_THREAD_HELP}")
    helper = await _js_helper()
    got = await helper.requestDevice(to_js(list(_LIMITS.values())), to_js(list(WANTED_FEATURES)))
    limits = DeviceLimits(**{py: int(getattr(got.limits, js)) for py, js in _LIMITS.items()})
    parts = [got.vendor, got.architecture, got.description]
    description = " ".join(p for p in parts if p) or "WebGPU"
    info = AdapterInfo(vendor=str(got.vendor), architecture=str(got.architecture),
                       description=str(got.description), backend="browser",
                       software=bool(got.software), features=frozenset(got.features.to_py()))
    return BrowserDevice(helper, got.state, limits, info, f"{description} (browser)")
