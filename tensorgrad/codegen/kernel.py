"""Kernel records and the emit loop over a graph."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from math import ceil
from typing import Protocol

from ..gpu.interface import AdapterInfo, DeviceLimits
from ..ir import LEAF_OPS, Graph, Node
from .storage import half_storage

MAX_GROUPS_X = 65_535


@dataclass(frozen=True)
class Kernel:
    """One compute shader for one node. Bindings: the node's inputs in order (read), then
    the output (read_write). `threads` invocations are launched (0: nothing to dispatch).
    `vector_inputs`: the input slots bound as `array<vec4<f32>>` (element 4 q + j of the
    input is lane j of `in{slot}[q]`), which a stitched prologue must provide as such.
    `quick_refused`: emitted for a quick target (:attr:`Target.quick`) but the optimized
    kernel all the same, a quick one being too slow to run (a large matmul)."""

    wgsl: str
    threads: int
    workgroup_size: int = 256
    label: str = ""
    vector_inputs: frozenset[int] = frozenset()
    quick_refused: bool = False


@dataclass(frozen=True)
class Target:
    """What the code generator knows about the device it emits for."""

    limits: DeviceLimits = field(default_factory=DeviceLimits)
    # A CPU-emulated GPU (SwiftShader, lavapipe): shared-memory tiles with barriers are slow.
    software: bool = False
    features: frozenset[str] = frozenset()  # optional WebGPU features the device has
    # Shader compiles dear enough that code written out for speed does not pay for itself
    # (SwiftShader: 60-180 ms per matmul kernel, lavapipe 4-8 ms).
    costly_compiles: bool = False
    # The first tier of a tiered start (Options.tiered): kernels chosen for the quickest
    # compile (naive matmuls, ~15 ms a pipeline on SwiftShader against 100-900 ms for a
    # register block with stitched ops), run until the optimized ones are compiled.
    quick: bool = False
    # The second tier of a tiered start: compiled in the background while the first steps
    # run, so its kernels favour speed over compile time where the two differ.
    background: bool = False

    @staticmethod
    def for_device(limits: DeviceLimits, info: AdapterInfo) -> Target:
        """The target of a device, from what it reports about itself."""
        swiftshader = "swiftshader" in f"{info.architecture} {info.description}".lower()
        return Target(limits=limits, software=info.software, features=info.features,
                      costly_compiles=info.software and swiftshader)


@dataclass(frozen=True)
class EmitContext:
    """What an emitter sees: the node, its inputs, the target. `swapped_reads`: the input
    slots a stitched prologue reads from storage whose second-to-last logical axis is the
    contiguous one (a permute's source, e.g. attention heads merged back): an emitter that
    coalesces its loads along one axis may walk that one instead (the values are the same)."""

    node: Node
    inputs: tuple[Node, ...]
    target: Target
    swapped_reads: frozenset[int] = frozenset()


def dispatch_size(threads: int, workgroup_size: int) -> tuple[int, int, int]:
    """Workgroup grid for `threads` invocations: x up to 65535, the rest in y."""
    groups = ceil(threads / workgroup_size)
    if groups <= MAX_GROUPS_X:
        return (groups, 1, 1)
    return (MAX_GROUPS_X, ceil(groups / MAX_GROUPS_X), 1)


class HasEmitter(Protocol):
    """An op-table entry as code generation sees it: its kernel emitter (None: none)."""

    @property
    def emit(self) -> Callable[[EmitContext], Kernel] | None: ...


def emit_node(graph: Graph, node: Node, target: Target, ops: Mapping[str, HasEmitter]
              ) -> Kernel:
    """The kernel for one node (an empty kernel for leaves), from its op's emitter in `ops`
    (the op table, handed in by the caller: code generation does not import the ops). Where
    the node or its inputs are f16, the kernel's reads and writes of them are converted
    (:func:`~tensorgrad.codegen.storage.half_storage`)."""
    if node.op in LEAF_OPS:
        return Kernel("", 0, label=node.describe())
    emit = ops[node.op].emit
    if emit is None:
        raise NotImplementedError(f"op '{node.op}' has no WGSL emitter")
    inputs = tuple(graph[i] for i in node.inputs)
    kernel = emit(EmitContext(node, inputs, target))
    wgsl = half_storage(kernel.wgsl, [k for k, n in enumerate(inputs) if n.dtype == "f16"],
                        kernel.vector_inputs, node.dtype == "f16", node.label)
    return Kernel(wgsl, kernel.threads, kernel.workgroup_size, node.describe(),
                  kernel.vector_inputs, kernel.quick_refused)


def emit_kernels(graph: Graph, target: Target, ops: Mapping[str, HasEmitter],
                 no_kernel: frozenset[int] = frozenset()) -> Iterator[Kernel]:
    """:func:`emit_graph`'s kernels one at a time, in graph order (a caller may stop early)."""
    for n in graph.nodes:
        yield Kernel("", 0, label=n.describe()) if n.id in no_kernel else \
            emit_node(graph, n, target, ops)


def dump_kernels(kernels: Sequence[Kernel]) -> None:
    """Print each kernel's WGSL to stderr when TENSORGRAD_DUMP_WGSL=1."""
    if os.environ.get("TENSORGRAD_DUMP_WGSL"):
        for k in kernels:
            if k.wgsl:
                print(f"// ---- {k.label}  threads={k.threads}\n{k.wgsl}", file=sys.stderr)


def emit_graph(graph: Graph, target: Target, ops: Mapping[str, HasEmitter],
               no_kernel: frozenset[int] = frozenset()) -> list[Kernel]:
    """One kernel per node, in graph order; `no_kernel` (views and packs, whose bytes the
    buffer plan arranges) and leaves get an empty one. TENSORGRAD_DUMP_WGSL=1 prints each
    kernel."""
    kernels = list(emit_kernels(graph, target, ops, no_kernel))
    dump_kernels(kernels)
    return kernels
