"""A compiled graph on a device: buffers, pipelines, one dispatch program, step execution.

An :class:`Executable` is built once (pipelines and bind groups made at compile) and run
many times; each run is one `device.execute` call: write inputs, run the chunked program
(dispatches then writebacks), read back the output and captures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .codegen.kernel import Kernel, Target, dispatch_size
from .errors import AbortError, ShapeError
from .gpu.interface import Copy, Dispatch, GPUDevice
from .hostdata import from_bytes, to_bytes
from .ir import Graph

SOFTWARE_ADAPTERS = ("swiftshader", "llvmpipe", "lavapipe", "software", "cpu")


def target_for(device: GPUDevice) -> Target:
    """Code-generation target for `device` (barrier-heavy tiles off on CPU emulation)."""
    desc = (getattr(device, "description", "") or "").lower()
    return Target(limits=device.limits, prefer_tiled=not any(s in desc for s in SOFTWARE_ADAPTERS))


class PipelineCache:
    """Compute pipelines per device, keyed by WGSL text."""

    def __init__(self, device: GPUDevice):
        self.device = device
        self.kernels: dict[str, Any] = {}

    def get(self, wgsl: str, label: str) -> Any:
        k = self.kernels.get(wgsl)
        if k is None:
            k = self.kernels[wgsl] = self.device.create_kernel(wgsl, label)
        return k


@dataclass
class Executable:
    """One graph compiled onto a device."""

    device: GPUDevice
    graph: Graph
    plan: Any
    kernels: list[Kernel]
    buffers: list[Any]
    owned: list[bool]
    program: Any
    output_id: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    destroyed: bool = False
    inputs: dict[str, Any] = field(default_factory=dict)  # input name -> node, cached

    def __post_init__(self) -> None:
        self.inputs = self.graph.inputs

    @property
    def kernel_count(self) -> int:
        return sum(1 for k in self.kernels if k.threads > 0)

    def buffer_of(self, node_id: int) -> Any:
        return self.buffers[self.plan.node_buffer[node_id]]

    def leaf_buffer(self, op: str, name: str) -> Any:
        node = self.graph.leaves(op)[name]
        return self.buffer_of(node.id)

    async def run(self, feeds: Mapping[str, Any], read_captures: bool = True
                  ) -> tuple[Any, dict[str, Any]]:
        """Write `feeds` (every graph input, hidden ones included), run, read back.

        Returns the output array and {capture name: array}."""
        writes = []
        inputs = self.inputs
        for name, node in inputs.items():
            if name not in feeds:
                raise ShapeError("step", f"missing input '{name}' ({node.dtype}"
                                 f"{list(node.shape)})")
            writes.append((self.buffer_of(node.id),
                           to_bytes(f"input '{name}'", feeds[name], node.shape, node.dtype)))
        extra = set(feeds) - set(inputs)
        if extra:
            raise ShapeError("step", f"unknown input(s) {sorted(extra)}; the graph takes "
                             f"{sorted(n for n in inputs if not n.startswith('_'))}")
        out_node = self.graph[self.output_id]
        reads = [(self.buffer_of(out_node.id), max(4, out_node.nbytes))]
        captures = list(self.graph.captures.items()) if read_captures else []
        reads += [(self.buffer_of(i), max(4, self.graph[i].nbytes)) for _, i in captures]
        async with self.lock:
            if self.destroyed:
                raise AbortError("graph destroyed")
            data = await self.device.execute(self.program, writes, reads)
        out = from_bytes(data[0], out_node.shape, out_node.dtype)
        caps = {name: from_bytes(d, self.graph[i].shape, self.graph[i].dtype)
                for (name, i), d in zip(captures, data[1:])}
        return out, caps

    async def read(self, node_ids: list[int]) -> list[Any]:
        reads = [(self.buffer_of(i), max(4, self.graph[i].nbytes)) for i in node_ids]
        async with self.lock:
            data = await self.device.read_buffers(reads)
        return [from_bytes(d, self.graph[i].shape, self.graph[i].dtype)
                for i, d in zip(node_ids, data)]

    def write(self, node_id: int, data: Any) -> None:
        self.device.write_buffer(self.buffer_of(node_id), data)

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        for buf, own in zip(self.buffers, self.owned):
            if own:
                self.device.destroy_buffer(buf)


def build_executable(device: GPUDevice, graph: Graph, plan: Any, kernels: list[Kernel],
                     output_id: int, pipelines: PipelineCache, chunk_size: int,
                     shared: Mapping[int, Any] | None = None) -> Executable:
    """Create buffers (reusing `shared` {buffer index: handle}), pipelines and the program."""
    shared = shared or {}
    buffers, owned = [], []
    for idx, spec in enumerate(plan.buffers):
        if idx in shared:
            buffers.append(shared[idx])
            owned.append(False)
            continue
        buf = device.create_buffer(max(4, spec.size), spec.name or f"b{idx}")
        init = getattr(spec, "init", 0.0) or 0.0
        if init:
            import struct
            device.write_buffer(buf, struct.pack("<f", init) * (max(4, spec.size) // 4))
        buffers.append(buf)
        owned.append(True)
    steps: list[Dispatch | Copy] = []
    try:
        for node, kernel in zip(graph.nodes, kernels):
            if kernel.threads <= 0:
                continue
            pipeline = pipelines.get(kernel.wgsl, node.op)
            binds = tuple(buffers[plan.node_buffer[i]] for i in (*node.inputs, node.id))
            steps.append(Dispatch(pipeline, binds, dispatch_size(kernel.threads,
                                                                 kernel.workgroup_size),
                                  node.op))
        for wb in plan.writebacks:
            steps.append(Copy(buffers[wb.src], buffers[wb.dst], wb.size))
        program = device.create_program(steps, chunk_size)
    except BaseException:  # e.g. ShaderCompileError: free what this call created
        for buf, own in zip(buffers, owned):
            if own:
                device.destroy_buffer(buf)
        raise
    return Executable(device, graph, plan, kernels, buffers, owned, program, output_id)
