"""Fused and stitched kernels with f16 tensors (mixed precision) on a real device against the
reference: every stitching case and matmul variant of tests/native/test_stitch.py, the vec4
register blocks reading f16 operands as vec4s, split-K over f16 operands. The reference rounds
what each f16 node stores (inside a fused program too) to f16, as the kernels do."""

from __future__ import annotations

import asyncio

import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target, emit_node
from tensorgrad.ops import OPS, linalg
from tensorgrad.ops.linalg import VARIANTS
from tensorgrad.passes import fuse_elementwise, split_k, stitch_kernels
from tests.harness import Arg, Case, build
from tests.kernel_check import check_graph_kernels, half_graph
from tests.native.test_stitch import CASES, VECTOR_CASES


def _stitched_half(case: Case):
    b = build(case, case.grad)
    graph = half_graph(b.graph, {b.loss} if b.loss is not None else set())
    protected = set(b.grads.values())
    fused, r1 = fuse_elementwise(graph, protected)
    stitched, _ = stitch_kernels(fused, {r1[i] for i in protected})
    assert any(n.dtype == "f16" for n in stitched.nodes)
    return b, stitched


@pytest.mark.parametrize("software", [False, True], ids=["gpu", "software"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_stitched_f16_kernels_match_reference(gpu_device, case: Case, software: bool) -> None:
    b, graph = _stitched_half(case)
    assert any(n.op == "fused" and any(p.dtype == "f16" for p in n.attrs["program"].nodes)
               for n in graph.nodes), "no fused program holds an f16 node"
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values,
                                    target=Target(limits=gpu_device.limits, software=software)))


@pytest.mark.parametrize("variant", ["regs8x8vk", "regs4x4vk", "regs8x8v"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in VECTOR_CASES])
def test_vec4_register_blocks_read_f16_as_vec4s(gpu_device, monkeypatch, variant: str,
                                                case: Case) -> None:
    monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
    b, graph = _stitched_half(case)
    target = Target(limits=gpu_device.limits, software=True)
    kernels = [emit_node(graph, n, target, OPS).wgsl for n in graph.nodes
               if n.op == "fused" and "matmul" in {p.op[:6] for p in n.attrs["program"].nodes}]
    assert any("-> vec4<f32>" in k for k in kernels), "no operand was loaded as vec4s"
    if case.name == "input-read-twice":  # w: read as vec4s and by the epilogue: scalars
        assert any("fn load_1(q: u32) -> vec4<f32>" in k for k in kernels)
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values, target=target))


def test_an_f16_input_read_only_as_vec4s_is_bound_as_vec4_f16(gpu_device, monkeypatch) -> None:
    monkeypatch.setattr(linalg, "FORCE_VARIANT", "regs4x4vk")
    case = Case("matmul", lambda x, w: tg.matmul(x, w) * 2.0,
                [Arg((16, 16)), Arg((16, 12))], name="plain-vec4", grad=False)
    b, graph = _stitched_half(case)
    target = Target(limits=gpu_device.limits, software=True)
    wgsl = "\n".join(emit_node(graph, n, target, OPS).wgsl for n in graph.nodes
                     if n.op == "fused")
    assert "array<vec4<f16>>" in wgsl and "vec4<f32>(in" in wgsl
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values, target=target))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_matmul_variant_reads_and_writes_f16(gpu_device, monkeypatch,
                                                   variant: str) -> None:
    monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
    for case in CASES[:3]:
        b, graph = _stitched_half(case)
        asyncio.run(check_graph_kernels(gpu_device, graph, b.values))


def test_split_k_over_f16_operands_matches_reference(gpu_device, monkeypatch) -> None:
    monkeypatch.setattr(split_k, "MIN_WORK", 1)
    monkeypatch.setattr(split_k, "CHUNK", 64)
    case = Case("matmul", lambda x, w: tg.sum(tg.tanh(tg.matmul(x, w))),
                [Arg((512, 24)), Arg((24, 40))], name="split-k")
    b = build(case)
    graph, _ = split_k.split_long_contractions(half_graph(b.graph, {b.loss}),
                                               b.grads.values())
    parts = next(n for n in graph.nodes if n.op == "matmul_batched")
    assert parts.dtype == "f32" and {graph[i].dtype for i in parts.inputs} == {"f16"}
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values))
