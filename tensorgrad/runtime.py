"""Compiled graphs on a device: params, buffers, pipelines, one dispatch program per graph.

An :class:`Executable` is built once (pipelines and bind groups made at compile) and run
many times; each run is one `device.execute` call: write inputs, run the chunked program
(dispatches then writebacks), read back the output and captures. Params live in a
:class:`ParamStore` (one GPU buffer per param) that a training graph and every forward graph
attached to it bind, so they share weights without copies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import describe
from .codegen.kernel import Kernel, dispatch_size
from .codegen.program import is_core
from .errors import AbortError, PlanError, ShapeError
from .gpu.interface import BufferSlice, Copy, Dispatch, GPUDevice, split_slice
from .hostdata import from_bytes, to_bytes
from .init import ParamSpec, init_params
from .ir import Graph, Node
from .ops.arena import ALIGN, arena_layout
from .ops.index import IndexBound, first_rejected, input_index_bounds, sentinel_only
from .ops.registry import OPS


class ParamStore:
    """The params on the GPU, shared by every graph compiled against them: the f32 params in
    one arena buffer (each a 256-byte aligned slice, at the offsets `layout` gives, as the
    optimizer packed them, and those the layout leaves out, the frozen ones, after them),
    other dtypes in buffers of their own."""

    def __init__(self, device: GPUDevice, specs: Mapping[str, ParamSpec], seed: int,
                 layout: Mapping[str, int] | None = None):
        self.device = device
        self.specs = dict(specs)
        self.seed = seed
        f32 = [n for n, s in self.specs.items() if s.dtype == "f32"]
        if layout is None:
            offsets, _ = arena_layout([self.specs[n].size for n in f32])
            layout = dict(zip(f32, offsets))
        if not set(layout) <= set(f32):
            raise ValueError(f"param arena layout {sorted(layout)} names params that are not "
                             f"f32 params of the model {sorted(f32)}")
        self.layout = dict(layout)
        rest = [n for n in f32 if n not in layout]  # frozen: the optimizer did not pack them
        if rest:
            end = max([self.layout[n] + self.specs[n].size for n in layout], default=0)
            start = -(-end // ALIGN) * ALIGN
            offsets, _ = arena_layout([self.specs[n].size for n in rest])
            self.layout.update({n: start + o for n, o in zip(rest, offsets)})
        size = max([self.layout[n] + self.specs[n].size for n in f32], default=0)
        self.arena = device.create_buffer(4 * max(size, ALIGN), "params") if f32 else None
        self.buffers: dict[str, Any] = {}
        for name, spec in self.specs.items():
            if name in self.layout:
                self.buffers[name] = BufferSlice(self.arena, 4 * self.layout[name],
                                                 max(4, 4 * spec.size))
            else:
                self.buffers[name] = device.create_buffer(max(4, 4 * spec.size), name)
        self.reset()

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    def reset(self) -> None:
        """Regenerate the initial values from the specs and the seed."""
        for name, values in init_params(self.specs, self.seed).items():
            self.device.write_buffer(self.buffers[name], memoryview(values).cast("B"))

    def check(self, params: Mapping[str, Any], partial: bool = False) -> dict[str, bytes]:
        """{name: bytes} of {name: array}, every name unless `partial`: validated and copied
        (a later change to the caller's arrays changes nothing)."""
        unknown = sorted(set(params) - set(self.specs))
        if unknown:
            raise KeyError(f"upload_params: unknown param(s) {unknown}; the model has "
                           f"{self.names}")
        missing = [n for n in self.specs if n not in params]
        if missing and not partial:
            raise KeyError(f"upload_params: missing param(s) {missing} (pass partial=True "
                           "to upload a subset)")
        return {n: bytes(to_bytes(f"upload_params '{n}'", v, self.specs[n].shape,
                                  self.specs[n].dtype))
                for n, v in params.items()}

    def write(self, data: Mapping[str, bytes]) -> None:
        """Write what :meth:`check` gave."""
        for name, view in data.items():
            self.device.write_buffer(self.buffers[name], view)

    def upload(self, params: Mapping[str, Any], partial: bool = False) -> None:
        """Write {name: array}; strict unless `partial`. Everything is checked first."""
        self.write(self.check(params, partial))

    async def download(self) -> dict[str, Any]:
        names = self.names
        data = await self.device.read_buffers(
            [(self.buffers[n], max(4, 4 * self.specs[n].size)) for n in names])
        return {n: from_bytes(d, self.specs[n].shape, self.specs[n].dtype)
                for n, d in zip(names, data)}

    def destroy(self) -> None:
        for buf in self.buffers.values():
            if not isinstance(buf, BufferSlice):
                self.device.destroy_buffer(buf)
        if self.arena is not None:
            self.device.destroy_buffer(self.arena)
            self.arena = None
        self.buffers = {}


def shared_param_buffers(graph: Graph, plan: Any, store: ParamStore) -> dict[int, Any]:
    """{buffer index of each param of `graph`: the store's buffer, a slice of its arena, or
    the arena itself where the plan packed the params as the store did}; ShapeError when the
    graph uses a param the store does not have, or with another shape."""
    shared = {}
    for name, node in graph.params.items():
        if name not in store.buffers:
            raise ShapeError("attach", f"the forward uses param '{name}', which the model "
                             f"does not have ({store.names})")
        spec = store.specs[name]
        if spec.shape != node.shape:
            raise ShapeError("attach", f"param '{name}' has shape {list(spec.shape)} in the "
                             f"model but {list(node.shape)} in the forward")
        index = plan.node_buffer[node.id]
        if plan.buffers[index].kind == "param_arena":
            if plan.node_offset[node.id] != 4 * store.layout.get(name, -1):
                raise PlanError(f"param '{name}' lies at byte {plan.node_offset[node.id]} of "
                                "the compiled arena but elsewhere in the param store")
            shared[index] = store.arena
        else:
            shared[index] = store.buffers[name]
    return shared


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

    def prepare(self, sources: Sequence[tuple[str, str]]) -> None:
        """Compile every `(wgsl, label)` not cached yet in one `create_kernels` call (a
        browser compiles them in parallel)."""
        missing: dict[str, str] = {}
        for wgsl, label in sources:
            if wgsl not in self.kernels:
                missing.setdefault(wgsl, label)  # the first dispatch's label, as get() gives
        if missing:
            made = self.device.create_kernels(list(missing.items()))
            self.kernels.update(zip(missing, made))


_pipeline_caches: dict[int, PipelineCache] = {}


def pipeline_cache(device: GPUDevice) -> PipelineCache:
    """The pipeline cache of `device` (one per device, for the life of the process)."""
    cache = _pipeline_caches.get(id(device))
    if cache is None or cache.device is not device:
        cache = _pipeline_caches[id(device)] = PipelineCache(device)
    return cache


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
    status_id: int | None = None  # the step guard (1.0: the update was applied)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    destroyed: bool = False
    inputs: dict[str, Any] = field(default_factory=dict)  # input name -> node, cached
    index_bounds: dict[str, tuple[IndexBound, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.inputs = self.graph.inputs
        self.index_bounds = input_index_bounds(self.graph)

    @property
    def kernel_count(self) -> int:
        return sum(1 for k in self.kernels if k.threads > 0)

    def __repr__(self) -> str:
        """One line: inputs, kernels, nodes, peak bytes, device, state (no buffers, no WGSL)."""
        inputs = describe.mapping({n: describe.shape(node.shape, node.dtype)
                                   for n, node in self.inputs.items()})
        return (f"<Executable: inputs {inputs}, {describe.count(self.kernel_count, 'kernel')}, "
                f"{describe.count(len(self.graph.nodes), 'node')}, peak "
                f"{describe.byte_size(self.plan.peak_bytes)}, on {describe.device(self.device)}, "
                f"{'destroyed' if self.destroyed else 'live'}>")

    def buffer_of(self, node_id: int) -> Any:
        """What holds node `node_id`: its buffer, or the slice of an arena or of a shared
        buffer it lies in."""
        return binding(self.buffers, self.plan, self.graph, node_id)

    def sentinel_only_input(self, data: Mapping[str, bytes]) -> str:
        """Which index input holds nothing but a use's sentinel ("" when none): every target
        of a cross_entropy or nll_loss equal to its ignore_index, whose 'mean' is then 0/0
        = nan, as in PyTorch. Looked up only after a failed step."""
        for name, uses in self.index_bounds.items():
            if name not in data:
                continue
            use = sentinel_only(memoryview(data[name]).cast("i"), uses)
            if use is not None:
                return (f"input '{name}' holds only {use.sentinel}, the ignore_index of "
                        f"{use.what}: a 'mean' over no counted target is 0/0 = nan, as in "
                        "PyTorch (give each batch a target that is not ignored, or use "
                        "reduction='sum')")
        return ""

    def leaf_buffer(self, op: str, name: str) -> Any:
        node = self.graph.leaves(op)[name]
        return self.buffer_of(node.id)

    async def run(self, feeds: Mapping[str, Any], read_captures: bool = True
                  ) -> tuple[Any, dict[str, Any], bool]:
        """Write `feeds` (every graph input, hidden ones included), run, read back.

        Returns the output array, {capture name: array} and whether the step guard let the
        update through (True for a graph without one)."""
        writes = []
        inputs = self.inputs
        for name, node in inputs.items():
            if name not in feeds:
                raise ShapeError("step", f"missing input '{name}' ({node.dtype}"
                                 f"{list(node.shape)})")
            data = to_bytes(f"input '{name}'", feeds[name], node.shape, node.dtype)
            if name in self.index_bounds:
                _check_index_range(name, data, self.index_bounds[name])
            writes.append((self.buffer_of(node.id), data))
        extra = set(feeds) - set(inputs)
        if extra:
            raise ShapeError("step", f"unknown input(s) {sorted(extra)}; the graph takes "
                             f"{sorted(n for n in inputs if not n.startswith('_'))}")
        out_node = self.graph[self.output_id]
        reads = [(self.buffer_of(out_node.id), max(4, out_node.nbytes))]
        if self.status_id is not None:
            reads.append((self.buffer_of(self.status_id), 4))
        captures = list(self.graph.captures.items()) if read_captures else []
        reads += [(self.buffer_of(i), max(4, self.graph[i].nbytes)) for _, i in captures]
        async with self.lock:
            if self.destroyed:
                raise AbortError("graph destroyed")
            data = await self.device.execute(self.program, writes, reads)
        out = from_bytes(data[0], out_node.shape, out_node.dtype)
        applied = True
        if self.status_id is not None:
            applied = bytes(data[1][:4]) != b"\x00\x00\x00\x00"  # 1.0f or 0.0f
            data = data[1:]
        caps = {name: from_bytes(d, self.graph[i].shape, self.graph[i].dtype)
                for (name, i), d in zip(captures, data[1:])}
        return out, caps, applied

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


def _check_index_range(name: str, data: memoryview, uses: Sequence[IndexBound]) -> None:
    """ShapeError naming the first value of i32 `data` that one of its index `uses` does not
    allow (outside 0..bound - 1 and not that use's sentinel)."""
    found = first_rejected(data.cast("i"), uses)
    if found is None:
        return
    k, v, use = found
    raise ShapeError(f"input '{name}'", f"holds {v} at flat index {k}, outside "
                     f"{use.expected()} as {use.what} needs (an index outside it would give "
                     "an all-zero row and be silently ignored)", site="")


def binding(buffers: Sequence[Any], plan: Any, graph: Graph, node_id: int) -> Any:
    """The buffer (or slice) a kernel binds for node `node_id`."""
    buffer = buffers[plan.node_buffer[node_id]]
    offset = plan.node_offset[node_id]
    if offset == 0 and not isinstance(buffer, BufferSlice):
        return buffer
    handle, base, _ = split_slice(buffer)
    return BufferSlice(handle, base + offset, (max(4, graph[node_id].nbytes) + 3) & ~3)


def dispatch_label(node: Node) -> str:
    """The op a dispatch runs, for profiles and error messages: the IR op, "fused" for an
    elementwise group, or e.g. "matmul+fused" for a matmul (a reduction, ...) with stitched
    prologues or epilogue."""
    if node.op != "fused":
        return node.op
    program = node.attrs["program"]
    core = program.core(lambda n: is_core(n, OPS))
    return "fused" if core is None else f"{program.nodes[core].op}+fused"


def build_executable(device: GPUDevice, graph: Graph, plan: Any, kernels: list[Kernel],
                     output_id: int, pipelines: PipelineCache, chunk_size: int,
                     shared: Mapping[int, Any] | None = None,
                     status_id: int | None = None) -> Executable:
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
        dispatched = [(node, kernel, dispatch_label(node))
                      for node, kernel in zip(graph.nodes, kernels) if kernel.threads > 0]
        pipelines.prepare([(kernel.wgsl, label) for _, kernel, label in dispatched])
        for node, kernel, label in dispatched:
            pipeline = pipelines.get(kernel.wgsl, label)
            binds = tuple(binding(buffers, plan, graph, i) for i in (*node.inputs, node.id))
            steps.append(Dispatch(pipeline, binds, dispatch_size(kernel.threads,
                                                                 kernel.workgroup_size),
                                  label))
        for wb in plan.writebacks:
            src, src_base, _ = split_slice(buffers[wb.src])
            dst, dst_base, _ = split_slice(buffers[wb.dst])
            steps.append(Copy(src, dst, wb.size, src_base + wb.src_offset,
                              dst_base + wb.dst_offset))
        program = device.create_program(steps, chunk_size)
    except BaseException:  # e.g. ShaderCompileError: free what this call created
        for buf, own in zip(buffers, owned):
            if own:
                device.destroy_buffer(buf)
        raise
    return Executable(device, graph, plan, kernels, buffers, owned, program, output_id,
                      status_id)
