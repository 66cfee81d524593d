"""The native adapter's programs: compiled kernels, a step's dispatches and copies bound and
chunked once (:func:`build_program`), each chunk encoded into one command buffer
(:func:`encode`), and shader compilation without runtime checks
(:func:`trusted_module_maker`), on wgpu-py's API. :mod:`tensorgrad.gpu.native_device` runs
them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from .interface import Binding, BufferHandle, Copy, Dispatch, KernelHandle, split_slice


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
_Op = tuple[Any, ...]
# wgpu-native's compute-pass entry points: set pipeline, set bind group, dispatch, NULL.
RawPassCalls = tuple[Any, Any, Any, Any]


def raw_pass_calls() -> RawPassCalls | None:
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



def wgpu_buffer(handle: BufferHandle) -> Any:
    """The wgpu-py GPUBuffer behind a buffer handle this adapter made."""
    return handle


def native_kernel(handle: KernelHandle) -> NativeKernel:
    """The :class:`NativeKernel` behind a kernel handle this adapter made."""
    return cast(NativeKernel, handle)


def build_program(steps: Sequence[Dispatch | Copy], chunk_size: int, max_workgroups: int,
                  bind_group: Callable[[NativeKernel, Sequence[Binding], str], Any]
                  ) -> NativeProgram:
    """Steps split into chunks of `chunk_size` dispatches (0: one chunk), each dispatch's bind
    group made once by `bind_group(kernel, buffers, label)` (shared by the dispatches that
    bind one kernel to the same buffers)."""
    if chunk_size < 0:
        raise ValueError("chunk_size must be >= 0")
    bind_groups: dict[tuple[Any, ...], Any] = {}
    chunks: list[list[_Op]] = [[]]
    in_chunk = 0
    n_dispatches = 0
    labels: list[str] = []
    for step in steps:
        if isinstance(step, Dispatch):
            kernel = native_kernel(step.kernel)
            label = step.label or kernel.label
            x, y, z = (int(v) for v in step.workgroups)
            if max(x, y, z) > max_workgroups or min(x, y, z) < 0:
                raise ValueError(f"dispatch '{label}': workgroups {step.workgroups} outside "
                                 f"0..{max_workgroups} per dimension (split x into y)")
            group = None
            if step.buffers:
                key = (id(kernel), *(slice_key(b) for b in step.buffers))
                group = bind_groups.get(key)
                if group is None:
                    group = bind_groups[key] = bind_group(kernel, step.buffers, label)
            if chunk_size and in_chunk == chunk_size:
                chunks.append([])
                in_chunk = 0
            chunks[-1].append((kernel.pipeline, group, x, y, z,
                               getattr(kernel.pipeline, "_internal", None),
                               getattr(group, "_internal", None)))
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
    return NativeProgram([c for c in chunks if c], chunk_size, n_dispatches, labels)


def bind_group_entries(buffers: Sequence[Binding]) -> list[dict[str, Any]]:
    """wgpu-py's bind group entries: binding i is buffer i (or the slice of it)."""
    entries = []
    for i, b in enumerate(buffers):
        handle, offset, size = split_slice(b)
        buffer = wgpu_buffer(handle)
        entries.append({"binding": i, "resource": {
            "buffer": buffer, "offset": offset,
            "size": buffer.size - offset if size is None else size}})
    return entries


def encode(device: Any, ops: Sequence[_Op], raw: RawPassCalls | None,
           reads: Sequence[tuple[Any, int, int, Any]] = (),
           fence: tuple[Any, Any] | None = None) -> Any:
    """One command buffer of wgpu `device`: consecutive dispatches share a compute pass (each
    dispatch is its own usage scope, so WebGPU orders their memory accesses), copies end the
    pass; then the copies of `reads` (src, offset, size, staging buffer) and of `fence`
    (source, fence buffer: 4 bytes). `raw`: wgpu-native's own pass calls, or None for
    wgpu-py's methods."""
    encoder = device.create_command_encoder()
    cpass = None
    pipeline = None
    handle = None
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
        encoder.copy_buffer_to_buffer(fence[0], 0, fence[1], 0, 4)
    return encoder.finish()


def compilation_errors(module: Any) -> list[str]:
    """Error messages from a shader module's get_compilation_info, where the backend
    implements it."""
    try:
        get = getattr(module, "get_compilation_info_sync", None)
        info = get() if get is not None else module.get_compilation_info_async().sync_wait()
    except Exception:  # noqa: BLE001 - best effort: creation already raised on errors
        return []
    out = []
    for msg in getattr(info, "messages", info) or ():
        kind = str(getattr(msg, "type", None) or field_of(msg, "type", "error"))
        if kind.endswith("error"):
            line = getattr(msg, "line_num", None) or field_of(msg, "line_num", "?")
            col = getattr(msg, "line_pos", None) or field_of(msg, "line_pos", "?")
            text = getattr(msg, "message", None) or field_of(msg, "message", str(msg))
            out.append(f"{line}:{col}: {text}")
    return out


ModuleMaker = Callable[[Any, str, str], Any]


def checked_module(device: Any, wgsl: str, label: str) -> Any:
    """A shader module compiled with wgpu's runtime checks (bounds, loop counters)."""
    return device.create_shader_module(label=label, code=wgsl)


RuntimeChecks = bool | Literal["bounds"]
"""True: bounds checks and loop counters (wgpu's default); "bounds": bounds checks only;
False: neither."""


def trusted_module_maker(backend: str, checks: RuntimeChecks = False) -> ModuleMaker:
    """A `(device, wgsl, label) -> GPUShaderModule` that compiles with bounds checks only
    (`checks` "bounds") or no runtime checks (False), through wgpu-native's
    `wgpuDeviceCreateShaderModuleTrusted` (wgpu-py has no method for it). ValueError where
    that entry point is not there (wgpudawn, another wgpu-py)."""
    try:
        if backend != "wgpu":
            raise ImportError(backend)
        from wgpu.backends.wgpu_native import _api

        create = _api.libf.wgpuDeviceCreateShaderModuleTrusted
        new_struct_p, string_view = _api.new_struct_p, _api.to_c_string_view
        ffi, lib, module_type = _api.ffi, _api.lib, _api.GPUShaderModule
    except (ImportError, AttributeError) as err:
        raise ValueError(f"runtime_checks={checks!r} needs wgpu-native's trusted shader "
                         f"modules, which the {backend!r} backend does not have ({err})") from err
    flags = 0x1 if checks == "bounds" else 0  # WGPUShaderRuntimeChecks_BoundsChecks, _None

    def make(device: Any, wgsl: str, label: str) -> Any:
        source = new_struct_p("WGPUShaderSourceWGSL *", code=string_view(wgsl))
        source[0].chain.next = ffi.NULL
        source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
        desc = new_struct_p("WGPUShaderModuleDescriptor *",
                            nextInChain=ffi.cast("WGPUChainedStruct *", source),
                            label=string_view(label))
        handle = create(device._internal, desc, flags)
        if handle == ffi.NULL:
            raise RuntimeError("shader module creation failed")
        return module_type(label, handle, device)

    return make


def slice_key(buffer: Any) -> tuple[int, int, int | None]:
    handle, offset, size = split_slice(buffer)
    return id(handle), offset, size


def field_of(obj: Any, key: str, default: Any) -> Any:
    try:
        return obj[key]
    except (KeyError, IndexError, TypeError):
        return default


def error_text(err: BaseException) -> str:
    text = str(err).strip()
    return text or type(err).__name__
