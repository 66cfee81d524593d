"""Run single IR nodes on a real GPU device and compare with the reference interpreter."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tensorgrad.codegen.kernel import Target, dispatch_size, emit_node
from tensorgrad.gpu.interface import Dispatch, GPUDevice
from tensorgrad.ir import LEAF_OPS, Graph, Node
from tensorgrad.ops import OPS
from tensorgrad.reference import evaluate
from tests.harness import Case, build

GPU_NP = {"f32": np.float32, "i32": np.int32, "bool": np.uint32, "f16": np.float16}
# f16 results (mixed precision) agree to a unit or two of f16's last place (2^-10).
F16_RTOL = 2e-3


def to_gpu(value: Any, node: Node) -> bytes:
    return np.ascontiguousarray(np.asarray(value).astype(GPU_NP[node.dtype])).tobytes()


def from_gpu(data: Any, node: Node) -> np.ndarray:
    arr = np.frombuffer(bytes(data), dtype=GPU_NP[node.dtype])[: node.size]
    arr = arr.reshape(node.shape)
    return arr.astype(bool) if node.dtype == "bool" else arr


async def run_node(device: GPUDevice, graph: Graph, node: Node, values: list[Any],
                   target: Target | None = None) -> np.ndarray:
    """Dispatch `node`'s kernel once with the given input values; return its output."""
    target = target or Target(limits=device.limits)
    kernel = emit_node(graph, node, target, OPS)
    buffers = []
    for i in node.inputs:
        inp = graph[i]
        buf = device.create_buffer(max(4, inp.nbytes), f"in%{i}")
        device.write_buffer(buf, to_gpu(values[i], inp))
        buffers.append(buf)
    out = device.create_buffer(max(4, node.nbytes), f"out%{node.id}")
    try:
        if kernel.threads == 0:
            raise AssertionError(f"{node.describe()} emitted no dispatch")
        pipeline = device.create_kernel(kernel.wgsl, node.op)
        program = device.create_program(
            [Dispatch(pipeline, (*buffers, out),
                      dispatch_size(kernel.threads, kernel.workgroup_size), node.op)], 0)
        (data,) = await device.execute(program, [], [(out, max(4, node.nbytes))])
        return from_gpu(data, node)
    finally:
        for b in (*buffers, out):
            device.destroy_buffer(b)


async def check_graph_kernels(device: GPUDevice, graph: Graph, feeds: dict[str, Any],
                              rtol: float = 2e-4, atol: float = 2e-5,
                              target: Target | None = None) -> set[str]:
    """Every non-leaf node of `graph` run on the GPU from reference inputs must match the
    reference output. Returns the op kinds checked."""
    values = evaluate(graph, feeds)
    checked = set()
    for node in graph.nodes:
        if node.op in LEAF_OPS or OPS[node.op].pack:  # a pack runs no kernel: it is placed
            continue
        got = await run_node(device, graph, node, values, target)
        want = values[node.id]
        if node.dtype in ("f32", "f16"):
            half = node.dtype == "f16"
            finite = np.abs(want[np.isfinite(want)]) if want.size else want
            scale = max(1.0, float(np.max(finite)) if finite.size else 1.0)
            np.testing.assert_allclose(
                got.astype(np.float32), want.astype(np.float32),
                rtol=F16_RTOL if half else rtol, atol=(F16_RTOL if half else atol) * scale,
                err_msg=f"kernel for {node.describe()}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"kernel for {node.describe()}")
        checked.add(node.op)
    return checked


def half_graph(graph: Graph, keep: set[int]) -> Graph:
    """`graph` with every f32 tensor of more than one element stored as f16 (its leaves too,
    so that every kernel reads f16), but the nodes in `keep` and the results of the ops mixed
    precision keeps f32 (:data:`tensorgrad.passes.precision.F32_OPS`): the most f16 any
    kernel sees."""
    from dataclasses import replace

    from tensorgrad.passes.precision import F32_OPS

    out = Graph(outputs=list(graph.outputs), captures=dict(graph.captures))
    out.nodes = [replace(n, dtype="f16") if n.dtype == "f32" and n.size > 1 and
                 n.id not in keep and n.op not in F32_OPS else n for n in graph.nodes]
    return out


def check_case(device: GPUDevice, case: Case, with_grad: bool | None = None,
               half: bool = False, **kwargs: Any) -> set[str]:
    """Build `case` (with its backward graph unless `with_grad=False`) and check every kernel
    of it against the reference; returns the op kinds checked. `half`: with f16 tensors
    (:func:`half_graph`, the loss kept f32)."""
    b = build(case, with_grad)
    graph = half_graph(b.graph, {b.loss} if b.loss is not None else set()) if half else b.graph
    return asyncio.run(check_graph_kernels(device, graph, b.values, **kwargs))
