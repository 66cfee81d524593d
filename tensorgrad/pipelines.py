"""The compute pipelines of each device, shared by the executables that use them.

A :class:`PipelineCache` holds a device's pipelines by WGSL text, counts which live
executables use each, and keeps a few unused ones for quick reuse. A pipeline can be asked for
in two halves (:meth:`PipelineCache.start`, then :meth:`~PipelineCache.finish`), so that it
compiles in the background while the caller does other work: a tiered start compiles its
optimized kernels that way.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .gpu.interface import GPUDevice, KernelHandle, PendingKernels

__all__ = ["UNUSED_PIPELINES_KEPT", "Acquiring", "PipelineCache", "pipeline_cache"]

# Pipelines no executable uses, kept per device for quick reuse (a model compiled again, a
# batch size seen again). On lavapipe a pipeline holds ~1 MiB of compiled code, so the kept
# ones cost ~30 MiB at most there (bench/soak.py).
UNUSED_PIPELINES_KEPT = 32


class PipelineCache:
    """The compute pipelines of one device, keyed by WGSL text and shared by the executables
    that use them.

    Each executable holds one reference on each of its distinct pipelines (taken by
    :meth:`acquire` in :func:`~tensorgrad.runtime.build_executable`, dropped by :meth:`release`
    in :meth:`~tensorgrad.runtime.Executable.destroy`). A pipeline no live executable uses stays in a least recently
    used list of at most `keep` (:data:`UNUSED_PIPELINES_KEPT`) for quick reuse — the same
    model compiled again, a batch size seen again — and past that is released on the device
    (``destroy_kernel``). So the pipelines held are those of the live executables plus at most
    `keep` more, however many models or shapes a process compiles. Thread safe."""

    def __init__(self, device: GPUDevice, keep: int = UNUSED_PIPELINES_KEPT):
        self._device = weakref.ref(device)
        self.keep = keep
        self.kernels: dict[str, KernelHandle] = {}  # every pipeline held, by WGSL
        self.refs: dict[str, int] = {}  # WGSL -> how many live executables use it
        self.unused: OrderedDict[str, None] = OrderedDict()  # no reference, oldest first
        self._lock = threading.Lock()

    @property
    def device(self) -> GPUDevice | None:
        return self._device()

    def acquire(self, sources: Sequence[tuple[str, str]]) -> list[KernelHandle]:
        """The pipeline of each `(wgsl, label)`, in order: those not held yet compiled in one
        `create_kernels` call (a browser compiles them in parallel); one reference taken on
        each distinct WGSL, to be dropped by :meth:`release`."""
        return self.finish(self.start(sources))

    def start(self, sources: Sequence[tuple[str, str]]) -> Acquiring:
        """:meth:`acquire` in two halves: the missing pipelines start compiling (in the
        background where the device can) and the held ones are referenced now;
        :meth:`finish` gives them all, :meth:`abandon` gives them up."""
        device = self.device
        if device is None:
            raise RuntimeError("the pipeline cache's device is gone")
        with self._lock:
            missing: dict[str, str] = {}
            held: list[str] = []
            for wgsl, label in sources:
                if wgsl not in self.kernels:
                    missing.setdefault(wgsl, label)  # the first dispatch's label
            for wgsl in dict.fromkeys(w for w, _ in sources):
                if wgsl not in missing:
                    self._ref(wgsl)
                    held.append(wgsl)
        try:
            pending = device.start_kernels(list(missing.items())) if missing else None
        except BaseException:
            self.release(held)
            raise
        return Acquiring(list(sources), missing, pending, held)

    def finish(self, acquiring: Acquiring) -> list[KernelHandle]:
        """The pipelines of :meth:`start`, in order (waiting for those still compiling);
        on a ShaderCompileError the references taken are dropped."""
        pending, acquiring.pending = acquiring.pending, None
        try:
            made = pending.wait() if pending is not None else []
        except BaseException:
            self.release(acquiring.held)
            acquiring.held = []
            raise
        acquiring.held = []
        device = self.device
        with self._lock:
            for wgsl, kernel in zip(acquiring.missing, made):
                if wgsl in self.kernels:  # made meanwhile by another acquire
                    if device is not None:
                        device.destroy_kernel(kernel)
                else:
                    self.kernels[wgsl] = kernel
                self._ref(wgsl)
            return [self.kernels[w] for w, _ in acquiring.sources]

    def abandon(self, acquiring: Acquiring) -> None:
        """Give up what :meth:`start` began: compiling pipelines dropped, references
        released. Once only: a second call (a caller cleaning up after a callee that already
        did) changes nothing."""
        pending, acquiring.pending = acquiring.pending, None
        held, acquiring.held = acquiring.held, []
        if pending is not None:
            pending.cancel()
        self.release(held)

    def _ref(self, wgsl: str) -> None:
        self.refs[wgsl] = self.refs.get(wgsl, 0) + 1
        self.unused.pop(wgsl, None)

    def release(self, wgsls: Iterable[str]) -> None:
        """Drop one reference on each distinct WGSL of `wgsls` (as :meth:`acquire` took)."""
        with self._lock:
            for wgsl in dict.fromkeys(wgsls):
                left = self.refs.get(wgsl, 0) - 1
                if left > 0:
                    self.refs[wgsl] = left
                elif left == 0:
                    del self.refs[wgsl]
                    self.unused[wgsl] = None
            device = self.device
            if device is not None:
                self._trim(device)

    def get(self, wgsl: str, label: str) -> KernelHandle:
        """The pipeline of `wgsl` (compiled if not held), without a reference: it sits with
        the unused ones."""
        kernel = self.acquire([(wgsl, label)])[0]
        self.release([wgsl])
        return kernel

    def _trim(self, device: GPUDevice) -> None:
        while len(self.unused) > self.keep:
            wgsl, _ = self.unused.popitem(last=False)
            device.destroy_kernel(self.kernels.pop(wgsl))


@dataclass
class Acquiring:
    """Pipelines asked of a :class:`PipelineCache` by :meth:`~PipelineCache.start`: the
    `(wgsl, label)` sources in dispatch order, those being compiled (`pending`, None when
    every one was held) and the held WGSL already referenced."""

    sources: list[tuple[str, str]]
    missing: dict[str, str]
    pending: PendingKernels | None
    held: list[str]

    def ready(self) -> bool:
        """Whether :meth:`PipelineCache.finish` would not wait."""
        return self.pending is None or self.pending.ready()


_pipeline_caches: weakref.WeakKeyDictionary[GPUDevice, PipelineCache] = \
    weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def pipeline_cache(device: GPUDevice) -> PipelineCache:
    """The pipeline cache of `device` (one per device, dropped with it)."""
    with _caches_lock:
        cache = _pipeline_caches.get(device)
        if cache is None:
            cache = _pipeline_caches[device] = PipelineCache(device)
        return cache
