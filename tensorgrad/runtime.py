"""Compiled graphs on a device: params, buffers, pipelines, one dispatch program per graph.

An :class:`Executable` is built once (pipelines and bind groups made at compile) and run
many times; each run is one `device.execute` call: write inputs, run the chunked program
(dispatches then writebacks), read back the output and captures. Params live in a
:class:`ParamStore` (one GPU buffer per param) that a training graph and every forward graph
attached to it bind, so they share weights without copies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import describe
from .codegen.kernel import Kernel, dispatch_size
from .codegen.program import ProgramOp, is_core
from .errors import AbortError, PlanError, ShapeError
from .flight import CallQueue
from .gpu.interface import (
    Binding,
    BufferSlice,
    Copy,
    DeviceLimits,
    Dispatch,
    GPUDevice,
    KernelHandle,
    ProgramHandle,
    relay,
    split_slice,
)
from .hostdata import IndexBound, first_rejected, from_bytes, sentinel_only, to_bytes
from .init import ParamSpec, check_spec, init_params
from .ir import Graph, Node
from .layout import ALIGN, arena_layout
from .pipelines import (  # noqa: F401  (all stay importable from runtime, as before)
    UNUSED_PIPELINES_KEPT,
    Acquiring,
    PipelineCache,
    _pipeline_caches,
    pipeline_cache,
)
from .plan import BufferPlan, check_bytes

if TYPE_CHECKING:
    from .gpu.interface import HostBytes
    from .hostdata import HostArray, HostData

Ran = tuple["HostArray", dict[str, "HostArray"], bool]
"""What a run gives: the output, {capture name: array}, whether the step guard applied it."""


@contextmanager
def alive_in_use(owner: ParamStore | Executable) -> Iterator[None]:
    """``owner.device.in_use()`` once `owner` is checked alive inside it (AbortError once
    destroyed): a destroy from another thread, or from a task while the work awaits, then
    waits for the work to be done with the buffers."""
    with owner.device.in_use():
        if owner.destroyed:
            raise AbortError("graph destroyed")
        yield


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
        self._check_limits(device.limits, 4 * size if f32 else 0)
        arena = device.create_buffer(4 * max(size, ALIGN), "params") if f32 else None
        self.arena = arena
        self.buffers: dict[str, Binding] = {}
        for name, spec in self.specs.items():
            if arena is not None and name in self.layout:  # (an f32 param: there is one)
                self.buffers[name] = BufferSlice(arena, 4 * self.layout[name],
                                                 max(4, 4 * spec.size))
            else:
                self.buffers[name] = device.create_buffer(max(4, 4 * spec.size), name)
        self.reset()

    def _check_limits(self, limits: DeviceLimits, arena_bytes: int) -> None:
        """DeviceLimitError, as tg.compile's plan raises it, before anything is allocated or
        initialised: every param must fit one binding, the arena one buffer; ShapeError for an
        init that would make non-finite values."""
        for name, spec in self.specs.items():
            check_spec(spec.init, spec.shape, spec.dtype, f"param '{name}'", spec.fan_in)
            check_bytes("param", f"param '{name}' {spec.dtype}{list(spec.shape)}",
                        4 * spec.size, limits)
        check_bytes("param", f"the param arena ({len(self.layout)} f32 params, "
                    f"{arena_bytes // 4:,} values)", arena_bytes, limits, bound=False)

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    def reset(self) -> None:
        """Regenerate the initial values from the specs and the seed."""
        for name, values in init_params(self.specs, self.seed).items():
            self.device.write_buffer(self.buffers[name], memoryview(values).cast("B"))

    def check(self, params: Mapping[str, HostData], partial: bool = False) -> dict[str, bytes]:
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
                                  self.specs[n].dtype, param=True))
                for n, v in params.items()}

    def write(self, data: Mapping[str, bytes]) -> None:
        """Write what :meth:`check` gave."""
        with alive_in_use(self):
            for name, view in data.items():
                self.device.write_buffer(self.buffers[name], view)

    @property
    def destroyed(self) -> bool:
        """Whether :meth:`destroy` freed its buffers."""
        return bool(self.names) and not self.buffers

    def upload(self, params: Mapping[str, HostData], partial: bool = False) -> None:
        """Write {name: array}; strict unless `partial`. Everything is checked first."""
        self.write(self.check(params, partial))

    async def download(self) -> dict[str, HostArray]:
        names = self.names
        with alive_in_use(self):
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


def shared_param_buffers(graph: Graph, plan: BufferPlan, store: ParamStore
                         ) -> dict[int, Binding]:
    """{buffer index of each param of `graph`: the store's buffer, a slice of its arena, or
    the arena itself where the plan packed the params as the store did}; ShapeError when the
    graph uses a param the store does not have, or with another shape."""
    shared: dict[int, Binding] = {}
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
            if store.arena is None or plan.node_offset[node.id] != 4 * store.layout.get(name, -1):
                raise PlanError(f"param '{name}' lies at byte {plan.node_offset[node.id]} of "
                                "the compiled arena but elsewhere in the param store")
            shared[index] = store.arena
        else:
            shared[index] = store.buffers[name]
    return shared


@dataclass
class Executable:
    """One graph compiled onto a device."""

    device: GPUDevice
    graph: Graph
    plan: BufferPlan
    kernels: list[Kernel]
    buffers: list[Binding]  # one per plan buffer: made here, or shared (a param store's)
    owned: list[bool]  # which of `buffers` this executable made (and frees)
    program: ProgramHandle
    output_id: int
    status_id: int | None = None  # the step guard (1.0: the update was applied)
    pipelines: PipelineCache | None = None  # where its pipelines came from (released there)
    wgsls: tuple[str, ...] = ()  # its pipelines' WGSL, one per dispatch
    # One run or read at a time, from any thread or event loop (a handle's calls already
    # come one at a time; this also orders direct use of the executable).
    lock: CallQueue = field(default_factory=CallQueue)
    destroyed: bool = False
    evicted: bool = False  # destroyed by a forward's shape cache (the shape may come back)
    # {i32 input name: what its values may hold} (the compiler's input_index_bounds)
    index_bounds: Mapping[str, tuple[IndexBound, ...]] = field(default_factory=dict)
    inputs: dict[str, Node] = field(default_factory=dict)  # input name -> node, cached
    chunk_size: int = 32
    # A tiered start: `kernels` are the quick first tier and `upgrade` emits the optimized
    # ones. Their pipelines start compiling after the first run (in the background where the
    # device can) and the program is swapped for theirs before the first run that finds
    # them compiled. Both tiers bind the same buffers: results are the same. `ops` (the op
    # table, handed in by the compiler) labels the optimized kernels' dispatches.
    upgrade: Callable[[], list[Kernel]] | None = None
    upgrading: tuple[list[Kernel], Acquiring] | None = None
    ops: Mapping[str, ProgramOp] = field(default_factory=dict)
    # {node id: what holds it}, filled as looked up (the buffers are fixed once built)
    _bindings: dict[int, Binding] = field(default_factory=dict, repr=False)
    _leaves: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)  # node ids
    _read_lists: dict[bool, tuple[Sequence[tuple[Binding, int]], Sequence[tuple[str, int]]]] = (
        field(default_factory=dict, repr=False))

    def __post_init__(self) -> None:
        self.inputs = self.graph.inputs

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

    def buffer_of(self, node_id: int) -> Binding:
        """What holds node `node_id`: its buffer, or the slice of an arena or of a shared
        buffer it lies in."""
        found = self._bindings.get(node_id)
        if found is None:
            found = self._bindings[node_id] = binding(self.buffers, self.plan, self.graph,
                                                      node_id)
        return found

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

    def leaf_buffer(self, op: str, name: str) -> Binding:
        """What holds the named leaf of kind `op` ('param', 'input' or 'state')."""
        node_id = self._leaves.get((op, name))
        if node_id is None:
            node_id = self._leaves[op, name] = self.graph.leaves(op)[name].id
        return self.buffer_of(node_id)

    async def run(self, feeds: Mapping[str, bytes], read_captures: bool = True
                  ) -> tuple[HostArray, dict[str, HostArray], bool]:
        """Write `feeds` (every graph input, hidden ones included), run, read back.

        `feeds` are the inputs' bytes, as the handles made them once: the user's data
        checked against its input and copied when the step or run was called
        (:func:`tensorgrad.hostdata.to_bytes`), the library's own scalars packed directly;
        they are written as they are (an index input's values are checked against the
        graph's index bounds). Returns the output array, {capture name: array} and whether
        the step guard let the update through (True for a graph without one)."""
        return await (await self.submit(feeds, read_captures))

    async def submit(self, feeds: Mapping[str, bytes], read_captures: bool = True,
                     states: Mapping[str, bytes] | None = None) -> Coroutine[Any, Any, Ran]:
        """:meth:`run` in two parts: returns once the run is submitted, with a coroutine of
        what :meth:`run` returns (await it exactly once). Whatever runs on this device after
        that (another run, a read, a write) comes after it on the GPU. `states`: bytes to
        write into state leaves {name: bytes} before the run, after the inputs."""
        writes = self._writes(feeds, states)
        reads, captures = self._reads(read_captures)
        async with self.lock:
            with alive_in_use(self):
                if self.upgrading is not None and self.upgrading[1].ready():
                    self._swap_in_upgrade()
                readback = await self.device.submit(self.program, writes, reads)
            if self.upgrade is not None and not self.destroyed:
                self._start_upgrade()
        return self._unpack(readback, captures)

    def submit_now(self, feeds: Mapping[str, bytes], states: Mapping[str, bytes],
                   done: Callable[[Ran | BaseException], None]) -> bool:
        """:meth:`submit` (captures read) without an event loop, where nothing is to be
        waited for: no other submission under way, no tiered start's optimized kernels to
        start or swap in (it runs on the quick ones meanwhile, as :meth:`submit`), a device
        that submits at once (:meth:`GPUDevice.submit_now
        <tensorgrad.gpu.interface.GPUDevice.submit_now>`). True once submitted: `done` is
        then called with what :meth:`run` returns, or the error, when it is in. False:
        nothing was done. Bad feeds raise as in :meth:`submit`, before anything is done."""
        if not self.lock.idle or self.destroyed or self.upgrade is not None or (
                self.upgrading is not None and self.upgrading[1].ready()):
            return False  # (submit starts the optimized kernels, or swaps them in)
        writes = self._writes(feeds, states)
        reads, captures = self._reads(True)

        def unpacked(got: list[memoryview]) -> Ran:
            return self._unpacked(got, captures)

        return self.device.submit_now(self.program, writes, reads, relay(done, unpacked))

    def _writes(self, feeds: Mapping[str, bytes], states: Mapping[str, bytes] | None
                ) -> list[tuple[Binding, HostBytes]]:
        """The buffer writes of a run: every input of `feeds` (checked), then `states`."""
        writes: list[tuple[Binding, HostBytes]] = []
        inputs = self.inputs
        for name, node in inputs.items():
            data = feeds.get(name)
            if data is None:
                raise ShapeError("step", f"missing input '{name}' ({node.dtype}"
                                 f"{list(node.shape)})")
            if name in self.index_bounds:
                _check_index_range(name, memoryview(data), self.index_bounds[name])
            writes.append((self.buffer_of(node.id), data))
        if len(feeds) > len(inputs):  # (every input is there)
            raise ShapeError("step", f"unknown input(s) {sorted(set(feeds) - set(inputs))}; "
                             "the graph takes "
                             f"{sorted(n for n in inputs if not n.startswith('_'))}")
        if states:
            writes += [(self.leaf_buffer("state", name), data) for name, data in states.items()]
        return writes

    def _reads(self, captures: bool) -> tuple[Sequence[tuple[Binding, int]],
                                              Sequence[tuple[str, int]]]:
        """What a run reads back: the output, the step guard's flag, the captures if asked
        (with their names and nodes); made once each way."""
        found = self._read_lists.get(captures)
        if found is None:
            out_node = self.graph[self.output_id]
            reads = [(self.buffer_of(out_node.id), out_node.buffer_bytes)]
            if self.status_id is not None:
                reads.append((self.buffer_of(self.status_id), 4))
            named = list(self.graph.captures.items()) if captures else []
            reads += [(self.buffer_of(i), self.graph[i].buffer_bytes) for _, i in named]
            found = self._read_lists[captures] = (tuple(reads), tuple(named))
        return found

    async def _unpack(self, readback: Awaitable[list[memoryview]],
                      captures: Sequence[tuple[str, int]]) -> Ran:
        return self._unpacked(await readback, captures)

    def _unpacked(self, got: list[memoryview], captures: Sequence[tuple[str, int]]) -> Ran:
        out_node = self.graph[self.output_id]
        out = from_bytes(got[0], out_node.shape, out_node.dtype)
        applied = True
        if self.status_id is not None:
            applied = bytes(got[1][:4]) != b"\x00\x00\x00\x00"  # 1.0f or 0.0f
            got = got[1:]
        caps = {name: from_bytes(d, self.graph[i].shape, self.graph[i].dtype)
                for (name, i), d in zip(captures, got[1:])}
        return out, caps, applied

    @property
    def quick(self) -> bool:
        """Whether it still runs a tiered start's first, quick kernels."""
        return self.upgrade is not None or self.upgrading is not None

    def _start_upgrade(self) -> None:
        """Emit the optimized kernels and start compiling their pipelines (none when the
        quick kernels are already the optimized ones)."""
        emit, self.upgrade = self.upgrade, None
        assert emit is not None
        kernels = emit()
        if [k.wgsl for k in kernels] == [k.wgsl for k in self.kernels]:
            return
        assert self.pipelines is not None
        sources = kernel_sources(dispatches(self.graph, kernels, self.ops))
        self.upgrading = (kernels, self.pipelines.start(sources))

    def _swap_in_upgrade(self) -> None:
        """Run on the optimized kernels from now on: their program replaces the quick one
        (whose pipeline references are dropped). A ShaderCompileError of theirs fails this
        run; later runs go on with the quick kernels."""
        assert self.upgrading is not None and self.pipelines is not None
        (kernels, acquiring), self.upgrading = self.upgrading, None
        dispatched = dispatches(self.graph, kernels, self.ops)
        made = self.pipelines.finish(acquiring)
        wgsls = tuple(kernel.wgsl for _, kernel, _ in dispatched)
        try:
            program = self.device.create_program(
                _program_steps(self.graph, self.plan, self.buffers, dispatched, made),
                self.chunk_size)
        except BaseException:
            self.pipelines.release(wgsls)
            raise
        old_program, old_wgsls = self.program, self.wgsls
        self.program, self.wgsls, self.kernels = program, wgsls, kernels
        self.device.destroy_program(old_program)
        self.pipelines.release(old_wgsls)

    async def read(self, node_ids: list[int]) -> list[HostArray]:
        reads = [(self.buffer_of(i), self.graph[i].buffer_bytes) for i in node_ids]
        async with self.lock:
            with alive_in_use(self):
                data = await self.device.read_buffers(reads)
        return [from_bytes(d, self.graph[i].shape, self.graph[i].dtype)
                for i, d in zip(node_ids, data)]

    def write(self, node_id: int, data: HostBytes) -> None:
        self.device.write_buffer(self.buffer_of(node_id), data)

    def destroy(self) -> None:
        """Free its buffers and program and drop its references on its pipelines (a run in
        flight finishes with what it holds)."""
        if self.destroyed:
            return
        self.destroyed = True
        self.upgrade = None
        self.device.destroy_program(self.program)
        if self.pipelines is not None:
            if self.upgrading is not None:
                self.pipelines.abandon(self.upgrading[1])
                self.upgrading = None
            self.pipelines.release(self.wgsls)
        for buf, own in zip(self.buffers, self.owned):
            if own and not isinstance(buf, BufferSlice):  # what it made: whole buffers
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


def binding(buffers: Sequence[Binding], plan: BufferPlan, graph: Graph, node_id: int
            ) -> Binding:
    """The buffer (or slice) a kernel binds for node `node_id`."""
    buffer = buffers[plan.node_buffer[node_id]]
    offset = plan.node_offset[node_id]
    if offset == 0 and not isinstance(buffer, BufferSlice):
        return buffer
    handle, base, _ = split_slice(buffer)
    return BufferSlice(handle, base + offset, graph[node_id].buffer_bytes)


def dispatch_label(node: Node, ops: Mapping[str, ProgramOp]) -> str:
    """The op a dispatch runs, for profiles and error messages: the IR op, "fused" for an
    elementwise group, or e.g. "matmul+fused" for a matmul (a reduction, ...) with stitched
    prologues or epilogue (`ops`: the op table, to tell the core of a fused program)."""
    if node.op != "fused":
        return node.op
    program = node.attrs["program"]
    core = program.core(lambda n: is_core(n, ops))
    return "fused" if core is None else f"{program.nodes[core].op}+fused"


Dispatched = tuple[Node, Kernel, str]


def dispatches(graph: Graph, kernels: Sequence[Kernel], ops: Mapping[str, ProgramOp]
               ) -> list[Dispatched]:
    """(node, kernel, label) of every node that dispatches a kernel, in graph order (`ops`:
    the op table, for :func:`dispatch_label`)."""
    return [(node, kernel, dispatch_label(node, ops))
            for node, kernel in zip(graph.nodes, kernels) if kernel.threads > 0]


def kernel_sources(dispatched: Sequence[Dispatched]) -> list[tuple[str, str]]:
    """The `(wgsl, label)` of each dispatch, as :meth:`PipelineCache.start` takes them."""
    return [(kernel.wgsl, label) for _, kernel, label in dispatched]


def _program_steps(graph: Graph, plan: BufferPlan, buffers: Sequence[Binding],
                   dispatched: Sequence[Dispatched], made: Sequence[KernelHandle]
                   ) -> list[Dispatch | Copy]:
    """The dispatches (with their pipelines `made`), each zero fill of the plan before the
    first dispatch of a later node, then the writeback copies of a step."""
    steps: list[Dispatch | Copy] = []
    fills = sorted(plan.zero_fills, key=lambda f: f.at)

    def fill_until(node_id: int) -> None:
        while fills and fills[0].at < node_id:
            f = fills.pop(0)
            dst, base, _ = split_slice(buffers[f.dst])
            zeros, zero_base, _ = split_slice(buffers[plan.zeros])
            steps.append(Copy(zeros, dst, f.size, zero_base, base + f.offset))

    for (node, kernel, label), pipeline in zip(dispatched, made):
        fill_until(node.id)
        binds = tuple(binding(buffers, plan, graph, i) for i in (*node.inputs, node.id))
        steps.append(Dispatch(pipeline, binds, dispatch_size(kernel.threads,
                                                             kernel.workgroup_size), label))
    fill_until(len(graph.nodes))
    for wb in plan.writebacks:
        src, src_base, _ = split_slice(buffers[wb.src])
        dst, dst_base, _ = split_slice(buffers[wb.dst])
        steps.append(Copy(src, dst, wb.size, src_base + wb.src_offset,
                          dst_base + wb.dst_offset))
    return steps


def build_executable(device: GPUDevice, graph: Graph, plan: BufferPlan, kernels: list[Kernel],
                     output_id: int, pipelines: PipelineCache, chunk_size: int,
                     ops: Mapping[str, ProgramOp],
                     shared: Mapping[int, Binding] | None = None,
                     status_id: int | None = None,
                     index_bounds: Mapping[str, tuple[IndexBound, ...]] | None = None,
                     acquiring: Acquiring | None = None,
                     upgrade: Callable[[], list[Kernel]] | None = None) -> Executable:
    """Create buffers (reusing `shared` {buffer index: handle}), pipelines and the program.

    The caller hands in what only the op table knows (the runtime does not import it): `ops`,
    to label each dispatch, and `index_bounds`, what each i32 input that indexes may hold
    (checked on every run). `acquiring`: the kernels' pipelines already asked of `pipelines`
    (``pipelines.start``, so that they compile while the caller did other work); `upgrade`:
    a tiered start's emitter of the optimized kernels (see :class:`Executable`)."""
    shared = shared or {}
    dispatched = dispatches(graph, kernels, ops)
    buffers: list[Binding] = []
    owned: list[bool] = []
    acquired = False
    try:
        for idx, spec in enumerate(plan.buffers):
            if idx in shared:
                buffers.append(shared[idx])
                owned.append(False)
                continue
            buf = device.create_buffer(max(4, spec.size), spec.name or f"b{idx}")
            buffers.append(buf)
            owned.append(True)
            init = getattr(spec, "init", 0.0) or 0.0
            if init:
                import struct
                device.write_buffer(buf, struct.pack("<f", init) * (max(4, spec.size) // 4))
        if acquiring is None:
            acquiring = pipelines.start(kernel_sources(dispatched))
        made = pipelines.finish(acquiring)
        acquired = True
        program = device.create_program(
            _program_steps(graph, plan, buffers, dispatched, made), chunk_size)
    except BaseException:  # e.g. ShaderCompileError: free what this call created
        if acquired:
            pipelines.release(kernel.wgsl for _, kernel, _ in dispatched)
        elif acquiring is not None:
            pipelines.abandon(acquiring)
        for held, own in zip(buffers, owned):
            if own and not isinstance(held, BufferSlice):
                device.destroy_buffer(held)
        raise
    return Executable(device, graph, plan, kernels, buffers, owned, program, output_id,
                      status_id, pipelines, tuple(kernel.wgsl for _, kernel, _ in dispatched),
                      index_bounds=dict(index_bounds or {}), chunk_size=chunk_size,
                      upgrade=upgrade, ops=ops)
