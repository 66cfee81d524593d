"""Kernel records and the emit loop over a graph."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from math import ceil

from ..gpu.interface import DeviceLimits
from ..ir import LEAF_OPS, Graph, Node

MAX_GROUPS_X = 65_535


@dataclass(frozen=True)
class Kernel:
    """One compute shader for one node. Bindings: the node's inputs in order (read), then
    the output (read_write). `threads` invocations are launched (0: nothing to dispatch)."""

    wgsl: str
    threads: int
    workgroup_size: int = 256
    label: str = ""


@dataclass(frozen=True)
class Target:
    """What the code generator knows about the device it emits for."""

    limits: DeviceLimits = field(default_factory=DeviceLimits)
    # Shared-memory tiles with barriers are slow on CPU-emulated GPUs (SwiftShader, lavapipe).
    prefer_tiled: bool = True


@dataclass(frozen=True)
class EmitContext:
    node: Node
    inputs: tuple[Node, ...]
    target: Target


def dispatch_size(threads: int, workgroup_size: int) -> tuple[int, int, int]:
    """Workgroup grid for `threads` invocations: x up to 65535, the rest in y."""
    groups = ceil(threads / workgroup_size)
    if groups <= MAX_GROUPS_X:
        return (groups, 1, 1)
    return (MAX_GROUPS_X, ceil(groups / MAX_GROUPS_X), 1)


def emit_node(graph: Graph, node: Node, target: Target) -> Kernel:
    """The kernel for one node (an empty kernel for leaves)."""
    from ..ops.registry import OPS

    if node.op in LEAF_OPS:
        return Kernel("", 0, label=node.describe())
    opdef = OPS[node.op]
    if opdef.emit is None:
        raise NotImplementedError(f"op '{node.op}' has no WGSL emitter")
    ctx = EmitContext(node, tuple(graph[i] for i in node.inputs), target)
    kernel = opdef.emit(ctx)
    return Kernel(kernel.wgsl, kernel.threads, kernel.workgroup_size, node.describe())


def emit_graph(graph: Graph, target: Target) -> list[Kernel]:
    """One kernel per node, in graph order. TENSORGRAD_DUMP_WGSL=1 prints each kernel."""
    kernels = [emit_node(graph, n, target) for n in graph.nodes]
    if os.environ.get("TENSORGRAD_DUMP_WGSL"):
        for k in kernels:
            if k.wgsl:
                print(f"// ---- {k.label}  threads={k.threads}\n{k.wgsl}", file=sys.stderr)
    return kernels
