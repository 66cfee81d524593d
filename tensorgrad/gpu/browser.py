"""The browser adapter: :class:`~tensorgrad.gpu.interface.GPUDevice` over ``navigator.gpu``.

Runs inside Pyodide (a Web Worker or the page). Every crossing of the Python↔JS boundary costs
far more than a WebGPU call made from JS, so the per-step work lives in a small JS helper
(:data:`_HELPER_JS`, evaluated once): :meth:`BrowserDevice.create_program` hands the whole
list of dispatches and copies to JS in one call, which makes the bind groups and chunks once;
:meth:`BrowserDevice.execute` is then a constant number of FFI calls whatever the kernel
count. ``ffi_calls`` counts every crossing the adapter makes, for tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ShaderCompileError
from .interface import WANTED_FEATURES, AdapterInfo, BufferHandle, Copy, DeviceLimits, Dispatch

__all__ = ["BrowserDevice", "BrowserProgram", "request_browser_device"]

# Device limits requested at the adapter's maximum (the names of DeviceLimits, in JS).
_LIMITS = {
    "max_storage_buffer_binding_size": "maxStorageBufferBindingSize",
    "max_buffer_size": "maxBufferSize",
    "max_storage_buffers_per_shader_stage": "maxStorageBuffersPerShaderStage",
    "max_compute_workgroups_per_dimension": "maxComputeWorkgroupsPerDimension",
    "max_compute_invocations_per_workgroup": "maxComputeInvocationsPerWorkgroup",
    "max_compute_workgroup_storage_size": "maxComputeWorkgroupStorageSize",
}

_HELPER_JS = r"""
(() => {
  const USAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
  const align4 = (n) => (n + 3) & ~3;

  async function requestDevice(limitNames, wantedFeatures) {
    const gpu = globalThis.navigator?.gpu;
    if (!gpu) throw new Error("WebGPU is not available here (navigator.gpu is missing): use a " +
      "browser with WebGPU, served from https:// or http://127.0.0.1");
    const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
    if (!adapter) throw new Error("navigator.gpu.requestAdapter() found no GPU adapter");
    const requiredLimits = {};
    for (const name of [...limitNames, "maxComputeWorkgroupSizeX", "maxComputeWorkgroupSizeY",
                        "maxComputeWorkgroupSizeZ"]) {
      if (adapter.limits[name] !== undefined) requiredLimits[name] = adapter.limits[name];
    }
    const requiredFeatures = wantedFeatures.filter((f) => adapter.features.has(f));
    let device;
    try {
      device = await adapter.requestDevice({ label: "tensorgrad", requiredLimits, requiredFeatures });
    } catch (err) {  // an optional feature refused: go on without them
      if (!requiredFeatures.length) throw err;
      device = await adapter.requestDevice({ label: "tensorgrad", requiredLimits });
    }
    const state = { device, adapter, lost: null, staging: [] };
    device.lost.then((info) => { state.lost = `${info.reason}: ${info.message}`; });
    const info = adapter.info ?? {};
    const limits = {};
    for (const name of limitNames) limits[name] = device.limits[name];
    // Chromium's software adapter (SwiftShader) says so in its architecture.
    const software = Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter) ||
      info.architecture === "swiftshader";
    return { state, limits, vendor: info.vendor ?? "", architecture: info.architecture ?? "",
             description: info.description ?? "", software, features: [...device.features] };
  }

  function createBuffer(state, size, label) {
    return state.device.createBuffer({ size: align4(size), usage: USAGE(), label });
  }

  function writeBuffer(state, buffer, offset, data) {
    state.device.queue.writeBuffer(buffer, offset, data);
  }

  // A compute pipeline plus a promise of its error messages ([] when it compiled).
  function createKernel(state, wgsl, label) {
    const device = state.device;
    device.pushErrorScope("validation");
    const module = device.createShaderModule({ code: wgsl, label });
    const pipeline = device.createComputePipeline({
      layout: "auto", compute: { module, entryPoint: "main" }, label });
    const scope = device.popErrorScope();
    const check = (async () => {
      const messages = [];
      const info = await module.getCompilationInfo();
      for (const m of info.messages) {
        if (m.type === "error") messages.push(`error at line ${m.lineNum}:${m.linePos}: ${m.message}`);
      }
      const err = await scope;  // e.g. a pipeline the WGSL alone does not explain
      if (err && !messages.length) messages.push(err.message);
      return messages;
    })();
    return { pipeline, check };
  }

  // steps: ["d", pipeline, [buffers], x, y, z, label] | ["c", src, srcOffset, dst, dstOffset, size]
  function createProgram(state, steps, chunkSize) {
    const device = state.device;
    device.pushErrorScope("validation");
    const chunks = [[]];
    let passes = 0;
    for (const s of steps) {
      if (s[0] === "d") {
        if (chunkSize > 0 && passes === chunkSize) { chunks.push([]); passes = 0; }
        const [, pipeline, buffers, x, y, z, label] = s;
        const bindGroup = device.createBindGroup({
          layout: pipeline.getBindGroupLayout(0), label,
          entries: buffers.map((buffer, binding) => ({ binding, resource: { buffer } })),
        });
        chunks[chunks.length - 1].push({ pipeline, bindGroup, x, y, z, label });
        passes += 1;
      } else {
        const [, src, srcOffset, dst, dstOffset, size] = s;
        chunks[chunks.length - 1].push({ src, srcOffset, dst, dstOffset, size: align4(size) });
      }
    }
    const error = device.popErrorScope();
    return { chunks, error, checked: false, passes: steps.filter((s) => s[0] === "d").length };
  }

  function encode(encoder, ops) {
    for (const op of ops) {
      if (op.pipeline) {
        const pass = encoder.beginComputePass({ label: op.label });
        pass.setPipeline(op.pipeline);
        pass.setBindGroup(0, op.bindGroup);
        pass.dispatchWorkgroups(op.x, op.y, op.z);
        pass.end();
      } else {
        encoder.copyBufferToBuffer(op.src, op.srcOffset, op.dst, op.dstOffset, op.size);
      }
    }
  }

  function takeStaging(state, size) {
    const i = state.staging.findIndex((b) => b.size >= size);
    if (i >= 0) return state.staging.splice(i, 1)[0];
    return state.device.createBuffer({
      size: Math.max(align4(size), 256), label: "tensorgrad-readback",
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  }

  // Copy the reads into one staging buffer; returns [staging, total] (null when no reads).
  function encodeReads(state, encoder, reads) {
    let total = 0;
    for (let i = 0; i < reads.length; i += 2) total += align4(reads[i + 1]);
    if (total === 0) return null;
    const staging = takeStaging(state, total);
    let offset = 0;
    for (let i = 0; i < reads.length; i += 2) {
      const size = align4(reads[i + 1]);
      encoder.copyBufferToBuffer(reads[i], 0, staging, offset, size);
      offset += size;
    }
    return [staging, total];
  }

  // One ArrayBuffer holding every read back to back (each padded to 4 bytes).
  async function mapReads(state, pending) {
    if (!pending) return new ArrayBuffer(0);
    const [staging, total] = pending;
    await staging.mapAsync(GPUMapMode.READ, 0, total);
    const out = staging.getMappedRange(0, total).slice(0);
    staging.unmap();
    state.staging.push(staging);
    return out;
  }

  function checkErrors(errors, what) {
    const messages = errors.filter((e) => e).map((e) => e.message);
    if (messages.length) throw new Error(`WebGPU validation failed in ${what}:\n` + messages.join("\n"));
  }

  // args: [writeBuffers, writeSizes, blob (Uint8Array), readBuffers-and-sizes (flat)]
  async function execute(state, program, args) {
    if (state.lost) throw new Error(`the GPU device was lost (${state.lost})`);
    if (!program.checked) {
      checkErrors([await program.error], "create_program");
      program.checked = true;
    }
    const [writeBuffers, writeSizes, blob, reads] = args;
    const device = state.device, queue = device.queue;
    const scopes = [];
    device.pushErrorScope("validation");
    let offset = 0;
    for (let i = 0; i < writeBuffers.length; i++) {
      queue.writeBuffer(writeBuffers[i], 0, blob, offset, writeSizes[i]);
      offset += writeSizes[i];
    }
    scopes.push(device.popErrorScope());
    let previous = null, pending = null;
    const chunks = program.chunks;
    for (let c = 0; c < chunks.length; c++) {
      device.pushErrorScope("validation");
      const encoder = device.createCommandEncoder();
      encode(encoder, chunks[c]);
      if (c === chunks.length - 1) pending = encodeReads(state, encoder, reads);
      queue.submit([encoder.finish()]);
      scopes.push(device.popErrorScope());
      // At most two chunks in flight: chunk c is queued before waiting for chunk c - 1.
      const done = queue.onSubmittedWorkDone();
      if (previous) await previous;
      previous = done;
    }
    if (previous) await previous;
    checkErrors(await Promise.all(scopes), "execute");
    return mapReads(state, pending);
  }

  async function readBuffers(state, reads) {
    if (state.lost) throw new Error(`the GPU device was lost (${state.lost})`);
    const device = state.device;
    device.pushErrorScope("validation");
    const encoder = device.createCommandEncoder();
    const pending = encodeReads(state, encoder, reads);
    device.queue.submit([encoder.finish()]);
    checkErrors([await device.popErrorScope()], "read_buffers");
    return mapReads(state, pending);
  }

  function destroy(state) {
    for (const b of state.staging) b.destroy();
    state.staging.length = 0;
    state.device.destroy();
  }

  return { requestDevice, createBuffer, writeBuffer, createKernel, createProgram, execute,
           readBuffers, destroy };
})()
"""

_JS_FUNCTIONS = ("createBuffer", "writeBuffer", "createKernel", "createProgram", "execute",
                 "readBuffers", "destroy")
_helper: Any = None


def _js_helper() -> Any:
    """The JS helper object (evaluated once per interpreter)."""
    global _helper
    if _helper is None:
        from pyodide.code import run_js

        _helper = run_js(_HELPER_JS)
    return _helper


@dataclass
class BrowserProgram:
    """A program prepared in JS: bind groups and chunks live in `plan` (a JS object)."""

    plan: Any
    dispatches: int
    chunks: int


@dataclass
class BrowserKernel:
    """A compute pipeline (a JS object) and its label."""

    pipeline: Any
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
        self._unchecked: list[tuple[Any, str, str]] = []  # kernels validated at next execute

    # -- FFI, counted ------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> Any:
        self.ffi_calls += 1
        return self._fns[name](self._state, *args)

    def _to_js(self, value: Any) -> Any:
        from pyodide.ffi import to_js

        self.ffi_calls += 1
        return to_js(value, create_pyproxies=False)

    async def _await(self, promise: Any) -> Any:
        self.ffi_calls += 1
        return await promise

    # -- GPUDevice ---------------------------------------------------------------------------
    def create_buffer(self, size: int, label: str = "") -> BufferHandle:
        """A zero-initialised storage buffer of `size` bytes."""
        return self._call("createBuffer", int(size), label)

    def write_buffer(self, buffer: BufferHandle, data: Any, offset: int = 0) -> None:
        """Copy host bytes into `buffer` at `offset`."""
        self._call("writeBuffer", buffer, int(offset), self._to_js(_bytes_view(data)))

    def destroy_buffer(self, buffer: BufferHandle) -> None:
        self.ffi_calls += 1
        buffer.destroy()

    def create_kernel(self, wgsl: str, label: str) -> BrowserKernel:
        """Compile `wgsl` into a compute pipeline; raises ShaderCompileError on any error.

        The error check is asynchronous in WebGPU: it blocks here through JSPI (``run_sync``)
        where Pyodide can, else it is deferred to :meth:`check_kernels` / the next execute."""
        from pyodide.ffi import can_run_sync, run_sync

        made = self._call("createKernel", wgsl, label)
        self.ffi_calls += 2  # the two attribute reads below
        kernel, check = BrowserKernel(made.pipeline, label), made.check
        if can_run_sync():
            self.ffi_calls += 1
            _raise_if_errors(run_sync(check), wgsl, label)
        else:
            self._unchecked.append((check, wgsl, label))
        return kernel

    async def check_kernels(self) -> None:
        """Raise ShaderCompileError for any kernel whose check was deferred."""
        unchecked, self._unchecked = self._unchecked, []
        for check, wgsl, label in unchecked:
            _raise_if_errors(await self._await(check), wgsl, label)

    def create_program(self, steps: Sequence[Dispatch | Copy], chunk_size: int) -> BrowserProgram:
        """Hand every dispatch and copy to JS at once; bind groups and chunks are made there."""
        plain: list[list[Any]] = []
        for s in steps:
            if isinstance(s, Dispatch):
                wg = tuple(int(n) for n in s.workgroups) + (1, 1, 1)
                plain.append(["d", s.kernel.pipeline, list(s.buffers), *wg[:3], s.label])
            else:
                plain.append(["c", s.src, int(s.src_offset), s.dst, int(s.dst_offset), int(s.size)])
        plan = self._call("createProgram", self._to_js(plain), int(chunk_size))
        dispatches = sum(isinstance(s, Dispatch) for s in steps)
        chunks = 1 if chunk_size <= 0 else max(1, -(-dispatches // chunk_size))
        return BrowserProgram(plan, dispatches, chunks)

    async def execute(self, program: BrowserProgram, writes: Sequence[tuple[BufferHandle, Any]],
                      reads: Sequence[tuple[BufferHandle, int]]) -> list[memoryview]:
        """Write inputs, run the program's chunks (two in flight at most), read back: four FFI
        calls whatever the number of kernels, writes and reads."""
        if self._unchecked:
            await self.check_kernels()
        blob = bytearray()
        sizes = []
        for _, data in writes:
            view = _bytes_view(data)
            blob += view
            sizes.append(view.nbytes)
        args = self._to_js([[b for b, _ in writes], sizes, memoryview(blob),
                            [x for buf, n in reads for x in (buf, int(n))]])
        out = await self._await(self._call("execute", program.plan, args))
        return self._split(out, reads)

    async def read_buffers(self, reads: Sequence[tuple[BufferHandle, int]]) -> list[memoryview]:
        """Read `(buffer, nbytes)` pairs back: one submission, one map."""
        flat = self._to_js([x for buf, n in reads for x in (buf, int(n))])
        out = await self._await(self._call("readBuffers", flat))
        return self._split(out, reads)

    def _split(self, out: Any, reads: Sequence[tuple[BufferHandle, int]]) -> list[memoryview]:
        self.ffi_calls += 1
        data = memoryview(out.to_bytes())
        views, offset = [], 0
        for _, n in reads:
            views.append(data[offset:offset + int(n)])
            offset += (int(n) + 3) & ~3
        return views

    def destroy(self) -> None:
        self._call("destroy")


def _bytes_view(data: Any) -> memoryview:
    """The bytes of any buffer-protocol object, as a flat unsigned-byte memoryview."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _raise_if_errors(messages: Any, wgsl: str, label: str) -> None:
    found = [str(m) for m in messages]
    if found:
        raise ShaderCompileError(label, wgsl, found)


async def request_browser_device() -> BrowserDevice:
    """Request a WebGPU device from ``navigator.gpu`` at the adapter's limits."""
    from pyodide.ffi import to_js

    helper = _js_helper()
    got = await helper.requestDevice(to_js(list(_LIMITS.values())), to_js(list(WANTED_FEATURES)))
    limits = DeviceLimits(**{py: int(getattr(got.limits, js)) for py, js in _LIMITS.items()})
    parts = [got.vendor, got.architecture, got.description]
    description = " ".join(p for p in parts if p) or "WebGPU"
    info = AdapterInfo(vendor=str(got.vendor), architecture=str(got.architecture),
                       description=str(got.description), backend="browser",
                       software=bool(got.software), features=frozenset(got.features.to_py()))
    return BrowserDevice(helper, got.state, limits, info, f"{description} (browser)")
