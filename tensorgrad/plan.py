"""Buffer planning: where each node's bytes lie, in a few GPU buffers.

Leaves (params, inputs, state), graph outputs and captures get a dedicated buffer that lives
as long as the runtime, the f32 params one arena shared with the param store. Every other
node goes to the pool: a node is a block of bytes alive from its own step to the last step
that reads it (a view reads its source's bytes; a pack's arena is one block with the tensors
it holds), and gradients and writeback sources, which are read after the step or copied at
its end, stay alive past the last step (until the next run writes them again). The blocks
are packed at byte offsets into as few buffers as the device's max_buffer_size allows
(:mod:`tensorgrad.packing`): blocks alive at the same step never share bytes, every offset
is a multiple of 256 (min_storage_buffer_offset_alignment), and a kernel's output never lies
in the buffer of one of its inputs (WebGPU forbids binding one buffer both read-only and
writable in a dispatch). Every node takes at least 4 bytes and a multiple of 4 (dtypes take
4 bytes per element, bool stored as u32, but f16, which takes 2).

Tensors larger than the device's ``max_storage_buffer_binding_size`` (or ``max_buffer_size``)
fail here, naming the tensor: WebGPU would otherwise report them asynchronously and the step
would silently read back zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Protocol

from .errors import DeviceLimitError, PlanError
from .gpu.interface import DeviceLimits
from .ir import LEAF_OPS, DType, Graph, Node, Shape
from .packing import Block, Packing, pack_blocks

BUFFER_KINDS = ("param", "param_grad", "input", "state", "intermediate", "output", "capture",
                "param_arena", "grad_arena", "arena", "zeros")
_LEAF_KIND = {"param": "param", "input": "input", "state": "state"}
OFFSET_ALIGN = 256
"""Bytes: where a block of the pool may start (WebGPU's min_storage_buffer_offset_alignment,
256 by default and at most)."""


@dataclass(frozen=True)
class BufferSpec:
    """One GPU buffer. `dtype`/`shape` describe its first occupant (pooled buffers hold
    several nodes over a step; `size` is the largest of them). `name` is the leaf, param
    (for a gradient) or capture name; `init` the fill value of a state buffer."""

    id: int
    kind: str
    size: int
    dtype: DType
    shape: Shape
    nodes: tuple[int, ...]
    name: str = ""
    init: float = 0.0
    pooled: bool = False


@dataclass(frozen=True)
class ResolvedWriteback:
    """Copy `size` bytes from buffer `src` (node `source`) to buffer `dst` (leaf `dest`, or
    for kind 'node' the node id), at these byte offsets."""

    src: int
    dst: int
    size: int
    source: int
    dest: str
    kind: str
    src_offset: int = 0
    dst_offset: int = 0


@dataclass(frozen=True)
class ZeroFill:
    """Copy `size` zero bytes into buffer `dst` at byte `offset` once the nodes before node
    `at` have run: the padding between the tensors of a pack in the pool, which the readers
    of the whole arena (the optimizer's norms and updates) read as zeros (a dedicated buffer
    is created zeroed; the pool holds what earlier tensors left). `at` is the pack, or 0
    where no node before it has bytes there: the copy then opens the step instead of
    splitting a compute pass (the same bytes where the pack is read, less host cost)."""

    at: int
    dst: int
    offset: int
    size: int


@dataclass
class BufferPlan:
    """Buffers, the buffer of each node, the named buffers and the writeback copies.

    `peak_bytes` is the memory of all buffers together (they all live for the runtime);
    `unpooled_bytes` is what one buffer per node (views aside) would take."""

    buffers: list[BufferSpec]
    node_buffer: list[int]
    params: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, int] = field(default_factory=dict)
    states: dict[str, int] = field(default_factory=dict)
    param_grads: dict[str, int] = field(default_factory=dict)
    outputs: list[int] = field(default_factory=list)
    captures: dict[str, int] = field(default_factory=dict)
    writebacks: list[ResolvedWriteback] = field(default_factory=list)
    views: dict[int, int] = field(default_factory=dict)  # view node -> the node it reads
    packed: frozenset[int] = frozenset()  # pack nodes: their inputs sit in their buffer
    node_offset: list[int] = field(default_factory=list)  # byte offset in node_buffer's
    persistent: frozenset[int] = frozenset()  # pooled nodes whose bytes outlive the step
    zero_fills: list[ZeroFill] = field(default_factory=list)
    zeros: int = -1  # the buffer of zeros the fills copy from (-1: none)
    peak_bytes: int = 0
    unpooled_bytes: int = 0

    def bindings(self, node: Node) -> tuple[int, ...]:
        """The buffers a node's kernel binds: its inputs in order, then its output."""
        return (*(self.node_buffer[i] for i in node.inputs), self.node_buffer[node.id])

    @property
    def no_kernel(self) -> frozenset[int]:
        """The nodes whose bytes the plan arranges, so that they run no kernel."""
        return frozenset(self.views) | self.packed

    def __str__(self) -> str:
        head = (f"buffer plan: {len(self.buffers)} buffers for {len(self.node_buffer)} nodes "
                f"({len(self.views)} views), {_mib(self.peak_bytes)} (without reuse "
                f"{_mib(self.unpooled_bytes)})")
        lines = [head]
        for b in self.buffers:
            what = f"'{b.name}'" if b.name else f"{b.dtype}{list(b.shape)}"
            occupants = ", ".join(f"%{i}" for i in b.nodes[:6])
            if len(b.nodes) > 6:
                occupants += f", ... ({len(b.nodes)} nodes)"
            lines.append(f"  #{b.id:<4} {b.kind:<12} {b.size:>10} B  {what}  <- {occupants}")
        lines += [f"  writeback #{w.src} -> #{w.dst} ({w.size} B, {w.kind} '{w.dest}')"
                  for w in self.writebacks]
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n} B"


def _describe(node: Node) -> str:
    if node.op in LEAF_OPS:
        return f"{node.op} '{node.attrs['name']}' {node.dtype}{list(node.shape)}"
    return f"the result of {node.label} (%{node.id}), {node.dtype}{list(node.shape)}"


def check_bytes(op: str, what: str, nbytes: int, limits: DeviceLimits, *,
                bound: bool = True, site: str | None = None) -> None:
    """Raise :class:`DeviceLimitError` (`op`: its op; `what`: the tensor, e.g. "param 'w'
    f32[8]") when `nbytes` exceed the device's max_buffer_size or, for a tensor a kernel binds
    (`bound`), its max_storage_buffer_binding_size."""
    caps = (("max_storage_buffer_binding_size", limits.max_storage_buffer_binding_size),
            ("max_buffer_size", limits.max_buffer_size))
    for limit_name, cap in caps[0 if bound else 1:]:
        if nbytes > cap:
            raise DeviceLimitError(
                op, f"{what} needs {nbytes:,} bytes, more than the device's {limit_name} of "
                f"{cap:,} bytes; use a smaller batch size (or smaller inputs / layers) so that "
                "every tensor fits", site=site)


def check_limits(graph: Graph, limits: DeviceLimits, no_kernel: Iterable[int] = ()) -> None:
    """Raise :class:`DeviceLimitError` for the first tensor that exceeds a buffer limit, or
    the first kernel that binds more storage buffers than a shader stage may (nodes in
    `no_kernel` bind nothing)."""
    no_kernel = set(no_kernel)
    per_stage = limits.max_storage_buffers_per_shader_stage
    for node in graph.nodes:
        if node.op not in LEAF_OPS and node.id not in no_kernel and \
                len(node.inputs) + 1 > per_stage:
            raise DeviceLimitError(
                node.label, f"%{node.id} binds {len(node.inputs)} inputs and its output, more "
                f"than the device's max_storage_buffers_per_shader_stage of {per_stage}",
                site=node.site)
        check_bytes(node.label, _describe(node), node.nbytes, limits, site=node.site)


def _last_use(graph: Graph) -> list[int]:
    last = [-1] * len(graph.nodes)
    for n in graph.nodes:
        for i in n.inputs:
            last[i] = max(last[i], n.id)
    return last


class LayoutOp(Protocol):
    """An op-table entry as the planner sees it: a view (`view(node, input)` gives the byte
    offset of the output in input 0's bytes, or None) or a pack (`pack`: its inputs are
    placed in its buffer at ``attrs["offsets"]``)."""

    @property
    def view(self) -> Callable[[Node, Node], int | None] | None: ...

    @property
    def pack(self) -> bool: ...


def _views(graph: Graph, layout_ops: Mapping[str, LayoutOp], special: set[int]
           ) -> dict[int, tuple[int, int]]:
    """{view node: (the node whose buffer it reads, byte offset there)}, through chains of
    views: nodes of a view op that need no buffer of their own."""
    views: dict[int, tuple[int, int]] = {}
    for node in graph.nodes:
        op = layout_ops.get(node.op)
        if op is None or op.view is None or node.id in special or not node.inputs or \
                node.dtype != graph[node.inputs[0]].dtype:  # (a view never converts)
            continue
        offset = op.view(node, graph[node.inputs[0]])
        if offset is not None:
            src, base = views.get(node.inputs[0], (node.inputs[0], 0))
            views[node.id] = (src, base + offset)
    return views


def _placements(graph: Graph, layout_ops: Mapping[str, LayoutOp],
                views: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """{node: (pack node, byte offset in the pack)} for every input of a pack."""
    placed: dict[int, tuple[int, int]] = {}
    for node in graph.nodes:
        op = layout_ops.get(node.op)
        if op is None or not op.pack:
            continue
        for x, offset in zip(node.inputs, node.attrs["offsets"]):
            what = graph[x]
            if x in placed or x in views or what.op in ("input", "state"):
                raise PlanError(f"pack %{node.id}: its input %{x} ({what.op}) cannot be placed "
                                "(it is a view, an input or a state, or placed twice)")
            placed[x] = (node.id, 4 * int(offset))
    return placed


def _extend_lifetimes(last: list[int], views: Mapping[int, tuple[int, int]]) -> list[int]:
    """Last uses where a view's source lives as long as the view is read."""
    last = list(last)
    for view, (src, _) in views.items():
        last[src] = max(last[src], last[view])
    return last


def _arena_kind(graph: Graph, pack: Node, grads: set[int]) -> str:
    first = graph[pack.inputs[0]]
    if first.op == "param":
        return "param_arena"
    return "grad_arena" if first.id in grads else "arena"


# A writeback as the optimizer gives it: ``(source node id, dest leaf name, 'param' |
# 'state')`` or ``(source node id, dest node id, 'node', byte offset)``.
WritebackArg = Sequence[int | str]


def _check_args(graph: Graph, grads: Mapping[str, int],
                writebacks: Sequence[tuple[int | str, ...]]) -> None:
    """PlanError for a gradient or writeback source that is not a node of `graph`."""
    for name, gid in grads.items():
        if not isinstance(gid, int) or not 0 <= gid < len(graph.nodes):
            raise PlanError(f"gradient of '{name}' is not a node of the graph: {gid!r}")
    for wb in writebacks:
        if len(wb) not in (3, 4) or not isinstance(wb[0], int) or \
                not 0 <= wb[0] < len(graph.nodes):
            raise PlanError(f"writeback {wb!r}: expected (source node id, dest name, kind) "
                            "with a source node of the graph")


class _Planner:
    """The buffers of one graph as they are assigned (see the module docstring): dedicated
    buffers for the special nodes and the param arena, then the blocks of the pool (a pooled
    node, or an arena with what it holds) packed at offsets into a few buffers."""

    def __init__(self, graph: Graph, grads: Mapping[str, int], writebacks: Sequence[
            tuple[int | str, ...]], layout_ops: Mapping[str, LayoutOp], limits: DeviceLimits,
            reuse: bool) -> None:
        self.graph, self.reuse, self.limits = graph, reuse, limits
        self.grad_of = {gid: name for name, gid in grads.items()}
        self.output_ids = set(graph.outputs)
        self.capture_of = {nid: name for name, nid in graph.captures.items()}
        self.sources = {int(wb[0]) for wb in writebacks}
        self.copies = [(int(wb[0]), wb[1]) for wb in writebacks if wb[2] == "node"]
        special = {*self.grad_of, *self.output_ids, *self.capture_of, *self.sources}
        self.views = _views(graph, layout_ops, special)
        self.placed = _placements(graph, layout_ops, self.views)
        self.packs = {p for p, _ in self.placed.values()}
        check_limits(graph, limits, no_kernel={*self.views, *self.packs})
        self.last = _extend_lifetimes(_last_use(graph), self.views)
        # Outliving the step: read after it (gradients) or copied at its end (writebacks).
        self.persistent = {*self.grad_of, *self.sources,
                           *(int(d) for _, d in self.copies if isinstance(d, int))}
        self.sizes: list[int] = []
        self.kinds: list[str] = []
        self.names: list[str] = []
        self.pooled: list[bool] = []
        self.occupants: list[list[int]] = []
        self.node_buffer = [-1] * len(graph.nodes)
        self.node_offset = [0] * len(graph.nodes)
        self.arena_of: dict[int, int | None] = {}  # pack node -> its dedicated buffer
        self.block_of: dict[int, int] = {}  # pooled node -> its block
        self.members: list[list[int]] = []  # the nodes of each block
        self.fills: list[ZeroFill] = []
        self.zeros = -1

    def new_buffer(self, kind: str, name: str, is_pooled: bool) -> int:
        self.sizes.append(0)
        self.kinds.append(kind)
        self.names.append(name)
        self.pooled.append(is_pooled)
        self.occupants.append([])
        return len(self.sizes) - 1

    def arena(self, pack: int) -> int | None:
        """The dedicated buffer of a param arena (shared with the param store), or of any
        arena without reuse; None for an arena of the pool."""
        if pack not in self.arena_of:
            kind = _arena_kind(self.graph, self.graph[pack], set(self.grad_of))
            buf = None
            if kind == "param_arena" or not self.reuse:
                buf = self.new_buffer(kind, "params" if kind == "param_arena" else "", False)
                self.sizes[buf] = self.graph[pack].buffer_bytes
            self.arena_of[pack] = buf
        return self.arena_of[pack]

    def buffer_for(self, node: Node) -> int | None:
        """The dedicated buffer of node's output (its offset set where it is not 0), or None
        for a node of the pool."""
        if node.id in self.placed:  # in its pack's buffer, at its offset
            pack, offset = self.placed[node.id]
            self.node_offset[node.id] = offset
            return self.arena(pack)
        if node.id in self.packs:
            return self.arena(node.id)
        if node.op in LEAF_OPS:
            return self.new_buffer(_LEAF_KIND[node.op], node.attrs["name"], False)
        if node.id in self.grad_of and not self.reuse:
            return self.new_buffer("param_grad", self.grad_of[node.id], False)
        if node.id in self.output_ids:
            return self.new_buffer("output", "", False)
        if node.id in self.capture_of:
            return self.new_buffer("capture", self.capture_of[node.id], False)
        if node.id in self.sources and not self.reuse:
            return self.new_buffer("intermediate", "", False)
        return None

    def place(self, node: Node) -> None:
        """Assign node's dedicated buffer, or its block of the pool (views: later, with
        their source's)."""
        if node.id in self.views:
            return
        buf = self.buffer_for(node)
        if buf is None:
            pack = self.placed[node.id][0] if node.id in self.placed else node.id
            if pack not in self.block_of:
                self.block_of[pack] = len(self.members)
                self.members.append([])
            self.block_of[node.id] = self.block_of[pack]
            self.members[self.block_of[pack]].append(node.id)
            return
        self.sizes[buf] = max(self.sizes[buf], self.node_offset[node.id] + node.buffer_bytes)
        self.occupants[buf].append(node.id)
        self.node_buffer[node.id] = buf

    def blocks(self) -> list[Block]:
        """Each block's size and lifetime: from its first node's step to the last step that
        reads one of them (a view's reads count for its source), or past the last step for
        a block that outlives the step."""
        end = len(self.graph.nodes)
        out = []
        for members in self.members:
            pack = max(members)  # an arena's pack node comes after what it holds
            size = (self.graph[pack].buffer_bytes if pack in self.packs else
                    self.graph[members[0]].buffer_bytes)
            last = max(end if i in self.persistent else max(i, self.last[i]) for i in members)
            out.append(Block(size, min(members), last))
        return out

    def conflicts(self) -> set[tuple[int, int]]:
        """Pairs of blocks a kernel reads one of and writes the other (or a writeback copies
        between): they must lie in different buffers."""
        pairs: set[tuple[int, int]] = set()
        edges = [(i, n.id) for n in self.graph.nodes if n.op not in LEAF_OPS
                 and n.id not in self.views and n.id not in self.packs for i in n.inputs]
        edges += [(src, int(dst)) for src, dst in self.copies if isinstance(dst, int)]
        for i, out in edges:
            a = self.block_of.get(self.views.get(i, (i, 0))[0])
            b = self.block_of.get(out)
            if a is None or b is None:
                continue
            if a == b:
                raise PlanError(f"%{out} ({self.graph[out].op}) would read and write the "
                                f"arena that holds %{i}")
            pairs.add((min(a, b), max(a, b)))
        return pairs

    def pack_pool(self) -> None:
        """Pack the blocks into the pool's buffers (without reuse: one buffer each) and
        put each pooled node, then each view, at its byte offset."""
        blocks = self.blocks()
        if self.reuse:
            cap = self.limits.max_buffer_size - self.limits.max_buffer_size % 4
            packing = pack_blocks(blocks, sorted(self.conflicts()), cap, OFFSET_ALIGN)
        else:
            packing = Packing(tuple(range(len(blocks))), (0,) * len(blocks),
                              tuple(b.size for b in blocks))
        heaps = [self.new_buffer("intermediate", "", True) for _ in packing.sizes]
        for buf, size in zip(heaps, packing.sizes):
            self.sizes[buf] = size
        for k, members in enumerate(self.members):
            buf = heaps[packing.heap[k]]
            for i in members:
                self.node_buffer[i] = buf
                self.node_offset[i] += packing.offset[k]
                self.occupants[buf].append(i)
        for buf in heaps:
            self.occupants[buf].sort()
        for view, (src, offset) in self.views.items():
            self.node_buffer[view] = self.node_buffer[src]
            self.node_offset[view] = self.node_offset[src] + offset
        self.fills = [self.hoisted(fill) for p in sorted(self.packs) if p in self.block_of
                      for fill in self.padding(p)]
        if self.fills:
            self.zeros = self.new_buffer("zeros", "", False)
            self.sizes[self.zeros] = max(f.size for f in self.fills)

    def padding(self, pack: int) -> list[ZeroFill]:
        """The fills of the bytes of pooled `pack` that none of its tensors covers."""
        base, buf = self.node_offset[pack], self.node_buffer[pack]
        fills, low = [], base
        for lo, hi in sorted((self.node_offset[x], self.node_offset[x] + self.graph[x].buffer_bytes)
                             for x in self.graph[pack].inputs):
            if lo > low:
                fills.append(ZeroFill(pack, buf, low, lo - low))
            low = max(low, hi)
        end = base + self.graph[pack].buffer_bytes
        return fills + ([ZeroFill(pack, buf, low, end - low)] if end > low else [])

    def hoisted(self, fill: ZeroFill) -> ZeroFill:
        """`fill` at the step's start when no node before its pack has bytes there: the
        nodes after the pack write there only once it is read no more (the packing keeps
        blocks alive at once apart), so the bytes are the same where the pack is read."""
        end = fill.offset + fill.size
        for i in self.occupants[fill.dst]:
            if i >= fill.at:
                break  # (occupants are sorted)
            lo = self.node_offset[i]
            if lo < end and lo + self.graph[i].buffer_bytes > fill.offset:
                return fill
        return ZeroFill(0, fill.dst, fill.offset, fill.size)

    def plan(self, grads: Mapping[str, int]) -> BufferPlan:
        """The plan once every node is placed (writebacks not resolved yet)."""
        graph, nb = self.graph, self.node_buffer
        buffers = [BufferSpec(b, self.kinds[b], self.sizes[b], graph[occ[0]].dtype,
                              graph[occ[0]].shape, tuple(occ), self.names[b],
                              float(graph[occ[0]].attrs.get("init", 0.0))
                              if self.kinds[b] == "state" else 0.0, self.pooled[b]) if occ else
                   BufferSpec(b, self.kinds[b], self.sizes[b], "f32", (self.sizes[b] // 4,), ())
                   for b, occ in enumerate(self.occupants)]
        return BufferPlan(
            buffers, nb,
            params={n: nb[x.id] for n, x in graph.params.items()},
            inputs={n: nb[x.id] for n, x in graph.inputs.items()},
            states={n: nb[x.id] for n, x in graph.states.items()},
            param_grads={n: nb[g] for n, g in grads.items()},
            outputs=[nb[i] for i in graph.outputs],
            captures={n: nb[i] for n, i in graph.captures.items()},
            views={v: src for v, (src, _) in self.views.items()},
            packed=frozenset(self.packs), node_offset=self.node_offset,
            persistent=frozenset(i for i in self.persistent if i in self.block_of),
            zero_fills=self.fills, zeros=self.zeros,
            peak_bytes=sum(self.sizes),
            unpooled_bytes=sum(n.buffer_bytes for n in graph.nodes
                               if n.id not in self.views and n.id not in self.placed))


def plan_buffers(graph: Graph, *, grads: Mapping[str, int] | None = None,
                 writebacks: Iterable[WritebackArg] = (),
                 limits: DeviceLimits | None = None, reuse: bool = True,
                 layout_ops: Mapping[str, LayoutOp] | None = None) -> BufferPlan:
    """Plan the buffers of `graph`. `grads` maps param names to gradient node ids;
    `writebacks` holds ``(source node id, dest leaf name, 'param' | 'state')`` or
    ``(source node id, dest node id, 'node', byte offset)``. `reuse=False` gives every
    intermediate, gradient and writeback source its own buffer (for debugging and tests).
    `layout_ops` (op name → op, the op table's views and packs) lets views share their
    input's buffer and packs hold their inputs, with no kernel: the plan's `views` and
    `packed`."""
    grads = dict(grads or {})
    wbs = [tuple(wb) for wb in writebacks]
    _check_args(graph, grads, wbs)
    planner = _Planner(graph, grads, wbs, dict(layout_ops or {}), limits or DeviceLimits(),
                       reuse)
    for node in graph.nodes:
        planner.place(node)
    planner.pack_pool()
    plan = planner.plan(grads)
    plan.writebacks = [_resolve_writeback(graph, plan, wb) for wb in wbs]
    check_plan(graph, plan)
    return plan


def _resolve_writeback(graph: Graph, plan: BufferPlan, wb: tuple[int | str, ...]
                       ) -> ResolvedWriteback:
    source, dest, kind = wb[:3]
    if not isinstance(source, int):  # (checked by _check_args)
        raise PlanError(f"writeback {wb!r}: the source must be a node id")
    src_node = graph[source]
    if kind == "node":
        offset = int(wb[3]) if len(wb) > 3 else 0
        if not isinstance(dest, int) or not 0 <= dest < len(graph.nodes):
            raise PlanError(f"writeback %{source} -> node {dest!r}: not a node of the graph")
        if offset + src_node.nbytes > graph[dest].nbytes or offset % 4:
            raise PlanError(f"writeback %{source} -> %{dest} at {offset}: "
                            f"{src_node.nbytes} bytes do not fit in {graph[dest].nbytes}")
        src, dst = plan.node_buffer[source], plan.node_buffer[dest]
        return ResolvedWriteback(src, dst, src_node.buffer_bytes, source, str(dest), str(kind),
                                 plan.node_offset[source], plan.node_offset[dest] + offset)
    table = {"param": plan.params, "state": plan.states}.get(str(kind))
    if table is None:
        raise PlanError(f"writeback %{source} -> '{dest}': kind must be 'param' or 'state', "
                        f"got {kind!r}")
    if not isinstance(dest, str) or dest not in table:
        raise PlanError(f"writeback %{source} -> {kind} '{dest}': the graph has no {kind} of "
                        f"that name (known: {sorted(table)})")
    dst_node = getattr(graph, f"{kind}s")[dest]
    if (src_node.shape, src_node.dtype) != (dst_node.shape, dst_node.dtype):
        raise PlanError(f"writeback %{source} -> {kind} '{dest}': source is "
                        f"{src_node.dtype}{list(src_node.shape)}, destination is "
                        f"{dst_node.dtype}{list(dst_node.shape)}")
    src, dst = plan.node_buffer[source], table[dest]
    if src == dst:
        raise PlanError(f"writeback %{source} -> {kind} '{dest}' copies a buffer onto itself")
    return ResolvedWriteback(src, dst, src_node.buffer_bytes, source, dest, str(kind),
                             plan.node_offset[source], plan.node_offset[dst_node.id])


ARENA_KINDS = ("param_arena", "grad_arena", "arena")


def _groups(graph: Graph, plan: BufferPlan, buf: BufferSpec, last: Sequence[int]
            ) -> list[tuple[int, int, int, int, int]]:
    """(first step, last step, first byte, end byte, node) of each block of a pooled buffer:
    a node, or a pack with the nodes it holds (from the first one's step on)."""
    pack_of = {x: p for p in plan.packed for x in graph[p].inputs}
    end = len(graph.nodes)
    spans: dict[int, list[int]] = {}
    for i in buf.nodes:
        key = pack_of.get(i, i)
        alive = end if i in plan.persistent else max(i, last[i])
        span = spans.setdefault(key, [i, alive])
        span[0], span[1] = min(span[0], i), max(span[1], alive)
    return [(s, e, plan.node_offset[k], plan.node_offset[k] + graph[k].buffer_bytes, k)
            for k, (s, e) in spans.items()]


def _check_pool(graph: Graph, plan: BufferPlan, buf: BufferSpec, last: Sequence[int]) -> None:
    """PlanError where two blocks of pooled buffer `buf` share bytes while both are alive,
    or a block starts at an unaligned offset."""
    alive: list[tuple[int, int, int, int, int]] = []
    for group in sorted(_groups(graph, plan, buf, last)):
        start, _, lo, hi, k = group
        if lo % OFFSET_ALIGN:
            raise PlanError(f"buffer #{buf.id}: %{k} starts at byte {lo}, not a multiple of "
                            f"{OFFSET_ALIGN}")
        alive = [a for a in alive if a[1] >= start]
        for _, end, a_lo, a_hi, a in alive:
            if lo < a_hi and a_lo < hi:
                raise PlanError(f"lifetime overlap in buffer #{buf.id}: %{k} (bytes {lo} to "
                                f"{hi}) is written while %{a} (bytes {a_lo} to {a_hi}) is "
                                f"still alive (until step {end})")
        alive.append(group)


def check_plan(graph: Graph, plan: BufferPlan) -> None:
    """Self-check: blocks of a pooled buffer alive at the same step never share bytes (a
    source living as long as its views, a gradient or writeback source past the step), the
    tensors of an arena never overlap, no kernel binds its output's buffer as an input, and
    every buffer is large enough for its occupants."""
    last = _extend_lifetimes(_last_use(graph), {v: (s, 0) for v, s in plan.views.items()})
    for p in plan.packed:
        spans = sorted((plan.node_offset[i], plan.node_offset[i] + graph[i].nbytes, i)
                       for i in graph[p].inputs)
        for (_, end, a), (start, _, b) in pairwise(spans):
            if start < end:
                raise PlanError(f"arena %{p}: %{a} and %{b} overlap")
    for buf in plan.buffers:
        if buf.pooled:
            _check_pool(graph, plan, buf, last)
        elif len(buf.nodes) > 1 and buf.kind not in ARENA_KINDS:
            raise PlanError(f"dedicated buffer #{buf.id} holds several nodes {list(buf.nodes)}")
        for i in buf.nodes:
            if plan.node_offset[i] + graph[i].buffer_bytes > buf.size:
                raise PlanError(f"buffer #{buf.id} ({buf.size} B) is too small for %{i}")
    for node in graph.nodes:
        if node.op in LEAF_OPS or node.id in plan.views or node.id in plan.packed:
            continue
        out = plan.node_buffer[node.id]
        if any(plan.node_buffer[i] == out for i in node.inputs):
            raise PlanError(f"%{node.id} ({node.op}) would read and write buffer #{out}")


__all__ = ["ARENA_KINDS", "BUFFER_KINDS", "BufferPlan", "BufferSpec", "ResolvedWriteback",
           "ZeroFill", "check_bytes", "check_limits", "check_plan", "plan_buffers"]
