"""Buffer planning: one GPU buffer per node, with intermediates reused by liveness.

Every node maps to a buffer. Leaves (params, inputs, state), param gradients, graph outputs,
captures and writeback sources get a dedicated buffer that lives as long as the runtime.
Other nodes (intermediates) share pooled buffers: walking the nodes in order, an op's output
is allocated first (the smallest free buffer that fits; else the largest free buffer grows to
fit; else a new one), and only then are the inputs whose last reader it is released, so a
kernel never binds one buffer as both an input and its output. An intermediate nobody reads
is released at once. Every buffer holds at least 4 bytes (all dtypes take 4 bytes per
element; bool is stored as u32).

Tensors larger than the device's ``max_storage_buffer_binding_size`` (or ``max_buffer_size``)
fail here, naming the tensor: WebGPU would otherwise report them asynchronously and the step
would silently read back zeros.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from .errors import DeviceLimitError, PlanError
from .gpu.interface import DeviceLimits
from .ir import LEAF_OPS, Graph, Node, Shape

BUFFER_KINDS = ("param", "param_grad", "input", "state", "intermediate", "output", "capture")
_LEAF_KIND = {"param": "param", "input": "input", "state": "state"}


@dataclass(frozen=True)
class BufferSpec:
    """One GPU buffer. `dtype`/`shape` describe its first occupant (pooled buffers hold
    several nodes over a step; `size` is the largest of them). `name` is the leaf, param
    (for a gradient) or capture name; `init` the fill value of a state buffer."""

    id: int
    kind: str
    size: int
    dtype: str
    shape: Shape
    nodes: tuple[int, ...]
    name: str = ""
    init: float = 0.0
    pooled: bool = False


@dataclass(frozen=True)
class ResolvedWriteback:
    """Copy `size` bytes from buffer `src` (node `source`) to buffer `dst` (leaf `dest`)."""

    src: int
    dst: int
    size: int
    source: int
    dest: str
    kind: str


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
    peak_bytes: int = 0
    unpooled_bytes: int = 0

    def bindings(self, node: Node) -> tuple[int, ...]:
        """The buffers a node's kernel binds: its inputs in order, then its output."""
        return (*(self.node_buffer[i] for i in node.inputs), self.node_buffer[node.id])

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
    return f"the result of {node.op} (%{node.id}), {node.dtype}{list(node.shape)}"


def check_limits(graph: Graph, limits: DeviceLimits) -> None:
    """Raise :class:`DeviceLimitError` for the first tensor that exceeds a buffer limit, or
    the first kernel that binds more storage buffers than a shader stage may."""
    caps = (("max_storage_buffer_binding_size", limits.max_storage_buffer_binding_size),
            ("max_buffer_size", limits.max_buffer_size))
    per_stage = limits.max_storage_buffers_per_shader_stage
    for node in graph.nodes:
        if node.op not in LEAF_OPS and len(node.inputs) + 1 > per_stage:
            raise DeviceLimitError(
                node.op, f"%{node.id} binds {len(node.inputs)} inputs and its output, more "
                f"than the device's max_storage_buffers_per_shader_stage of {per_stage}",
                site=node.site)
        for limit_name, cap in caps:
            if node.nbytes > cap:
                raise DeviceLimitError(
                    node.op, f"{_describe(node)} needs {node.nbytes:,} bytes, more than the "
                    f"device's {limit_name} of {cap:,} bytes; use a smaller batch size (or "
                    "smaller inputs / layers) so that every tensor fits", site=node.site)


def _last_use(graph: Graph) -> list[int]:
    last = [-1] * len(graph.nodes)
    for n in graph.nodes:
        for i in n.inputs:
            last[i] = max(last[i], n.id)
    return last


def _view_roots(graph: Graph, view_ops: frozenset[str], special: set[int]) -> dict[int, int]:
    """{view node: the node whose buffer it reads}: the nodes of a view op (reshape) that
    need no buffer of their own, mapped through chains of views to their root."""
    root: dict[int, int] = {}
    for node in graph.nodes:
        if node.op in view_ops and node.id not in special and node.inputs:
            src = node.inputs[0]
            root[node.id] = root.get(src, src)
    return root


def _extend_lifetimes(last: list[int], roots: Mapping[int, int]) -> list[int]:
    """Last uses where a root lives as long as its views are read."""
    last = list(last)
    for view, root in roots.items():
        last[root] = max(last[root], last[view])
    return last


def plan_buffers(graph: Graph, *, grads: Mapping[str, int] | None = None,
                 writebacks: Iterable[Sequence] = (),
                 limits: DeviceLimits | None = None, reuse: bool = True,
                 view_ops: Iterable[str] = ()) -> BufferPlan:
    """Plan the buffers of `graph`. `grads` maps param names to gradient node ids;
    `writebacks` holds ``(source node id, dest leaf name, 'param' | 'state')``.
    `reuse=False` gives every intermediate its own buffer (for debugging and tests).
    Nodes of `view_ops` (ops whose output is input 0's bytes, such as reshape) share their
    input's buffer and run no kernel, unless they need a buffer of their own (a gradient,
    an output, a capture, a writeback source): the plan's `views`."""
    grads = dict(grads or {})
    writebacks = [tuple(wb) for wb in writebacks]
    check_limits(graph, limits or DeviceLimits())
    for name, gid in grads.items():
        if not isinstance(gid, int) or not 0 <= gid < len(graph.nodes):
            raise PlanError(f"gradient of '{name}' is not a node of the graph: {gid!r}")
    for wb in writebacks:
        if len(wb) != 3 or not isinstance(wb[0], int) or not 0 <= wb[0] < len(graph.nodes):
            raise PlanError(f"writeback {wb!r}: expected (source node id, dest name, kind) "
                            "with a source node of the graph")

    grad_of = {gid: name for name, gid in grads.items()}
    output_ids = set(graph.outputs)
    capture_of = {nid: name for name, nid in graph.captures.items()}
    sources = {wb[0] for wb in writebacks}
    special = {*grad_of, *output_ids, *capture_of, *sources}
    roots = _view_roots(graph, frozenset(view_ops), special)
    last = _extend_lifetimes(_last_use(graph), roots)

    sizes: list[int] = []
    kinds: list[str] = []
    names: list[str] = []
    pooled: list[bool] = []
    occupants: list[list[int]] = []
    node_buffer = [-1] * len(graph.nodes)
    free: list[int] = []

    def new_buffer(kind: str, name: str, is_pooled: bool) -> int:
        sizes.append(0)
        kinds.append(kind)
        names.append(name)
        pooled.append(is_pooled)
        occupants.append([])
        return len(sizes) - 1

    def take_free(need: int) -> int | None:
        fits = [b for b in free if sizes[b] >= need]
        if fits:
            best = min(fits, key=lambda b: (sizes[b], b))
        elif free:
            best = max(free, key=lambda b: (sizes[b], -b))  # grows to fit below
        else:
            return None
        free.remove(best)
        return best

    for node in graph.nodes:
        need = max(4, node.nbytes)
        if node.id in roots:  # a view: its root's buffer, which lives as long as the view
            node_buffer[node.id] = node_buffer[roots[node.id]]
            continue
        if node.op in LEAF_OPS:
            buf = new_buffer(_LEAF_KIND[node.op], node.attrs["name"], False)
        elif node.id in grad_of:
            buf = new_buffer("param_grad", grad_of[node.id], False)
        elif node.id in output_ids:
            buf = new_buffer("output", "", False)
        elif node.id in capture_of:
            buf = new_buffer("capture", capture_of[node.id], False)
        elif node.id in sources:
            buf = new_buffer("intermediate", "", False)
        else:
            taken = take_free(need) if reuse else None
            buf = taken if taken is not None else new_buffer("intermediate", "", True)
        sizes[buf] = max(sizes[buf], need)
        occupants[buf].append(node.id)
        node_buffer[node.id] = buf
        # Release after allocating, so the output never shares a buffer with an input.
        for i in dict.fromkeys(roots.get(i, i) for i in node.inputs):
            if pooled[node_buffer[i]] and last[i] == node.id:
                free.append(node_buffer[i])
        if pooled[buf] and last[node.id] < 0:
            free.append(buf)

    buffers = [BufferSpec(b, kinds[b], sizes[b], graph[occ[0]].dtype, graph[occ[0]].shape,
                          tuple(occ), names[b],
                          float(graph[occ[0]].attrs.get("init", 0.0)) if kinds[b] == "state"
                          else 0.0, pooled[b])
               for b, occ in enumerate(occupants)]
    plan = BufferPlan(
        buffers, node_buffer,
        params={n: node_buffer[x.id] for n, x in graph.params.items()},
        inputs={n: node_buffer[x.id] for n, x in graph.inputs.items()},
        states={n: node_buffer[x.id] for n, x in graph.states.items()},
        param_grads={n: node_buffer[g] for n, g in grads.items()},
        outputs=[node_buffer[i] for i in graph.outputs],
        captures={n: node_buffer[i] for n, i in graph.captures.items()},
        views=roots,
        peak_bytes=sum(sizes),
        unpooled_bytes=sum(max(4, n.nbytes) for n in graph.nodes if n.id not in roots))
    plan.writebacks = [_resolve_writeback(graph, plan, wb) for wb in writebacks]
    check_plan(graph, plan)
    return plan


def _resolve_writeback(graph: Graph, plan: BufferPlan, wb: tuple) -> ResolvedWriteback:
    source, dest, kind = wb
    table = {"param": plan.params, "state": plan.states}.get(kind)
    if table is None:
        raise PlanError(f"writeback %{source} -> '{dest}': kind must be 'param' or 'state', "
                        f"got {kind!r}")
    if dest not in table:
        raise PlanError(f"writeback %{source} -> {kind} '{dest}': the graph has no {kind} of "
                        f"that name (known: {sorted(table)})")
    src_node = graph[source]
    dst_node = getattr(graph, f"{kind}s")[dest]
    if (src_node.shape, src_node.dtype) != (dst_node.shape, dst_node.dtype):
        raise PlanError(f"writeback %{source} -> {kind} '{dest}': source is "
                        f"{src_node.dtype}{list(src_node.shape)}, destination is "
                        f"{dst_node.dtype}{list(dst_node.shape)}")
    src, dst = plan.node_buffer[source], table[dest]
    if src == dst:
        raise PlanError(f"writeback %{source} -> {kind} '{dest}' copies a buffer onto itself")
    return ResolvedWriteback(src, dst, max(4, src_node.nbytes), source, dest, kind)


def check_plan(graph: Graph, plan: BufferPlan) -> None:
    """Self-check: occupants of one buffer never overlap in time (a root living as long as
    its views), no kernel binds its output buffer as an input, and every buffer is large
    enough for its occupants."""
    last = _extend_lifetimes(_last_use(graph), plan.views)
    for buf in plan.buffers:
        occ = sorted(buf.nodes)
        if len(occ) > 1 and not buf.pooled:
            raise PlanError(f"dedicated buffer #{buf.id} holds several nodes {occ}")
        for a, b in pairwise(occ):
            end = last[a] if last[a] >= 0 else a
            if b <= end:
                raise PlanError(f"lifetime overlap in buffer #{buf.id}: %{b} is written "
                                f"while %{a} is still read (last by %{end})")
        for i in occ:
            if max(4, graph[i].nbytes) > buf.size:
                raise PlanError(f"buffer #{buf.id} ({buf.size} B) is too small for %{i}")
    for node in graph.nodes:
        if node.op in LEAF_OPS or node.id in plan.views:
            continue
        out = plan.node_buffer[node.id]
        if any(plan.node_buffer[i] == out for i in node.inputs):
            raise PlanError(f"%{node.id} ({node.op}) would read and write buffer #{out}")


__all__ = ["BUFFER_KINDS", "BufferPlan", "BufferSpec",
           "ResolvedWriteback", "check_limits", "check_plan", "plan_buffers"]
