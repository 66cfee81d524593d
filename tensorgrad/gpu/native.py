"""The native GPU adapter: the :class:`~tensorgrad.gpu.interface.GPUDevice` protocol on the
wgpu-py API, from either the ``wgpu`` package (wgpu-native) or ``wgpudawn`` (Dawn).

Which package: the ``backend`` argument, else the ``TENSORGRAD_WGPU`` environment variable,
else ``wgpu`` (falling back to ``wgpudawn`` when ``wgpu`` is not installed).

Which Vulkan driver: see :mod:`tensorgrad.gpu.vulkan` (decided before the first adapter
request of the process).

Runtime checks: wgpu can compile every kernel with bounds checks on each array index and a
counter on each loop. By default (``runtime_checks=None``, ``TENSORGRAD_RUNTIME_CHECKS``
unset) tensorgrad keeps the bounds checks and drops the loop counters (``"bounds"``): every
loop it emits counts up to a bound by a positive step or halves down to zero
(tests/unit/test_kernel_loops.py checks each kernel), so it ends without one. On GPT-2 small
(H100) the counters cost 3.5% of a step. ``True`` (``TENSORGRAD_RUNTIME_CHECKS=1``) keeps
both, ``False`` (``=0``) drops both. Fewer checks go through wgpu-native's trusted-module
entry point; where it is missing (``wgpudawn``) the default is ``True``. tensorgrad's kernels
guard their own indices (the native suite passes with TENSORGRAD_RUNTIME_CHECKS=0, and
tests/native/test_adapter.py compares the three on every run), so this changes no result;
without bounds checks a kernel that did go out of bounds would read or write memory it does
not own.

This module requests the device; :mod:`tensorgrad.gpu.native_device` is the device (buffers,
submissions, readback, loss) and :mod:`tensorgrad.gpu.native_program` its programs (bind
groups, chunks, encoding, shader modules).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from .interface import WANTED_FEATURES, WebGPUSupport
from .native_device import (  # noqa: F401  (STAGING_KEPT*: the readback pool's bounds)
    NATIVE_FEATURE,
    STAGING_KEPT,
    STAGING_KEPT_BYTES,
    NativeDevice,
    adapter_kind,
)
from .native_program import (
    NativeKernel,
    NativeProgram,
    RuntimeChecks,
    error_text,
    field_of,
    trusted_module_maker,
)
from .vulkan import (
    SWIFTSHADER_ICDS,
    configure_vulkan_driver,
    use_vulkan_driver,
    vulkan_driver_manifests,
)

__all__ = [
    "NativeDevice", "NativeKernel", "NativeProgram", "configure_vulkan_driver", "probe_native",
    "request_native_device", "use_vulkan_driver", "vulkan_driver_manifests",
]

MAX_BUFFER_BYTES = 2_147_483_644  # largest multiple of 4 below 2**31
# Adapter preference: a real GPU before a CPU rasteriser; Vulkan/Metal/D3D12 before OpenGL.
_TYPE_RANK = {"discretegpu": 0, "integratedgpu": 1, "virtualgpu": 2, "unknown": 3, "cpu": 4}
_BACKEND_RANK = {"vulkan": 0, "metal": 0, "d3d12": 0, "opengl": 2, "opengles": 2}


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


def _runtime_checks_default() -> RuntimeChecks | None:
    """TENSORGRAD_RUNTIME_CHECKS as a `runtime_checks` value (None: unset, the backend's
    default)."""
    value = os.environ.get("TENSORGRAD_RUNTIME_CHECKS", "").strip().lower()
    if value not in ("0", "1", "false", "true", "off", "on", "", "bounds"):
        raise ValueError(f"TENSORGRAD_RUNTIME_CHECKS={value!r}: expected 1 (bounds checks and "
                         f"loop counters), bounds (bounds checks only, the default) or 0 (no "
                         f"bounds checks or loop counters in kernels)")
    if value == "":
        return None
    if value == "bounds":
        return "bounds"
    return value not in ("0", "false", "off")


def _default_checks(backend: str) -> RuntimeChecks:
    """Bounds checks without loop counters where the backend can compile so, else all."""
    try:
        trusted_module_maker(backend, "bounds")
    except ValueError:
        return True
    return "bounds"


# ----------------------------------------------------------------------------- request


def _rank(adapter: Any) -> tuple[int, int]:
    backend = str(field_of(adapter.info, "backend_type", "")).lower()
    return _TYPE_RANK.get(adapter_kind(adapter.info), 3), _BACKEND_RANK.get(backend, 1)


def _wanted_features(adapter: Any, wanted: Sequence[str] = WANTED_FEATURES) -> list[str]:
    """The adapter's features among `wanted`, by the names this wgpu-py uses."""
    have = set(adapter.features)
    return [name for want in wanted
            for name in dict.fromkeys((want, NATIVE_FEATURE.get(want, want))) if name in have]


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
        adapter, why = None, error_text(err)
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
                                runtime_checks: RuntimeChecks | None = None,
                                features: Sequence[str] = WANTED_FEATURES) -> NativeDevice:
    """A :class:`NativeDevice` at the adapter's limits (buffers capped at 2147483644 bytes).

    `backend` is ``"wgpu"`` or ``"wgpudawn"`` (default: ``TENSORGRAD_WGPU`` or ``wgpu``).
    `runtime_checks`: True compiles kernels with bounds checks and loop counters,
    ``"bounds"`` with bounds checks only, False with neither (the last two: ``wgpu`` only);
    default: ``TENSORGRAD_RUNTIME_CHECKS``, else ``"bounds"`` (True on ``wgpudawn``). See
    the module docstring.
    `features`: the optional WebGPU features to enable where the adapter has them (standard
    names; default ``subgroups``, ``timestamp-query`` and ``shader-f16``, which
    ``precision="mixed"`` needs); ``device.info.features`` says which were enabled.
    Raises RuntimeError, naming the driver setup, when no adapter or device can be made."""
    unknown = sorted(set(features) - set(WANTED_FEATURES))
    if isinstance(features, str) or unknown:
        raise ValueError(f"request_native_device: features must be a list of "
                         f"{list(WANTED_FEATURES)}, got {features!r}")
    if runtime_checks is None:
        runtime_checks = _runtime_checks_default()
    elif not isinstance(runtime_checks, bool) and runtime_checks != "bounds":
        raise TypeError(f"request_native_device: runtime_checks must be True, False, "
                        f"'bounds' or None, got {runtime_checks!r}")
    wgpu = _import_backend(backend)
    if runtime_checks is None:
        runtime_checks = _default_checks(wgpu.__name__)
    elif runtime_checks is not True:
        trusted_module_maker(wgpu.__name__, runtime_checks)  # fail before making a device
    note = configure_vulkan_driver(wgpu.__name__)
    try:
        adapter = await _pick_adapter(wgpu)
    except Exception as err:
        raise RuntimeError(f"{wgpu.__name__}: no WebGPU adapter ({error_text(err)}). "
                           f"Vulkan driver: {note}. Install libvulkan1 and mesa-vulkan-drivers, "
                           "or set VK_ICD_FILENAMES to a driver manifest "
                           f"(SwiftShader: {SWIFTSHADER_ICDS[0]}).") from err
    if adapter is None:
        raise RuntimeError(f"{wgpu.__name__}: no WebGPU adapter. Vulkan driver: {note}.")
    required = _required_limits(adapter.limits)
    features = _wanted_features(adapter, features)
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
                           f"with limits {required}: {error_text(err)}") from err
    native = NativeDevice(wgpu, adapter, device, note, runtime_checks)
    await native._probe_work_done()
    return native

