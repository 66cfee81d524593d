"""Stitched kernels on a real device: each matmul variant and each reduction kernel with
prologues and epilogues against the reference, and training with them."""

from __future__ import annotations

import asyncio

import pytest

import tensorgrad as tg
import tensorgrad.codegen.program as program_module
from tensorgrad.codegen.kernel import Target, emit_node
from tensorgrad.codegen.program import contiguous_axis, is_core
from tensorgrad.ops import OPS, linalg
from tensorgrad.ops.linalg import VARIANTS
from tensorgrad.passes import fuse_elementwise, stitch_kernels
from tests.harness import Arg, Case, build
from tests.kernel_check import check_graph_kernels
from tests.models import demo
from tests.native.test_fusion import train_losses

COVERS = {"fused"}

CASES = [
    Case("matmul", lambda x, w, b: tg.relu(tg.matmul(x, w) + b) * 2.0,
         [Arg((37, 19)), Arg((19, 23)), Arg((23,))], name="bias-relu-epilogue", grad=False),
    Case("matmul", lambda x, w: tg.matmul(tg.tanh(x), w),
         [Arg((33, 20)), Arg((20, 18))], name="tanh-prologue"),
    Case("matmul", lambda q, k: tg.matmul(tg.permute(q, (0, 2, 1, 3)),
                                          tg.permute(k, (0, 2, 3, 1))) * 0.25,
         [Arg((2, 9, 3, 5)), Arg((2, 9, 3, 5))], name="attention-permutes"),
    Case("sum", lambda x, y: tg.sum(tg.exp(x) * y, axis=-1) * 0.5,
         [Arg((6, 300)), Arg((300,))], name="workgroup-rows"),
    Case("mean", lambda x, y: tg.mean((x - y) * (x - y)) + 1.0,
         [Arg((40, 3)), Arg((40, 3))], name="loss"),
    Case("softmax_causal", lambda s: tg.softmax_causal(s * 0.5) * 3.0,
         [Arg((2, 7, 7))], name="scaled"),
    Case("layer_norm", lambda x, w, b: tg.layer_norm(x * 2.0, w, b) * 3.0,
         [Arg((5, 6)), Arg((6,)), Arg((6,))], name="around"),
    Case("rms_norm", lambda x, w: tg.rms_norm(tg.tanh(x), w) + x,
         [Arg((4, 300)), Arg((300,))], name="workgroup-rows"),
]
CORES = ("matmul", "matmul_batched", "sum_last", "softmax_causal_last", "normalize_last",
         "normalize_last_grad")


def _stitched(case: Case):
    b = build(case, case.grad)
    protected = set(b.grads.values())
    fused, r1 = fuse_elementwise(b.graph, protected)
    stitched, _ = stitch_kernels(fused, {r1[i] for i in protected})
    return b, stitched


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_stitched_kernels_match_reference(gpu_device, case: Case) -> None:
    b, graph = _stitched(case)
    cores = [n for n in graph.nodes if n.op == "fused" and
             any(p.op in CORES for p in n.attrs["program"].nodes)]
    assert cores, "nothing was stitched"
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values))
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values,
                                    target=Target(limits=gpu_device.limits, software=False)))


# Sizes the vec4-reading register blocks read as vec4s: a prologue on a vec4 operand, an
# input the epilogue reads too (its vec4s are then
# gathered from a scalar binding), permuted operands.
VECTOR_CASES = [
    Case("matmul", lambda x, w: tg.matmul(tg.tanh(x), tg.tanh(w)),
         [Arg((32, 20)), Arg((20, 24))], name="tanh-prologues-vec4", grad=False),
    Case("matmul", lambda x, w: tg.matmul(x, w) + w, [Arg((16, 16)), Arg((16, 16))],
         name="input-read-twice"),
    Case("matmul", lambda q, k: tg.matmul(tg.permute(q, (0, 2, 1, 3)),
                                          tg.permute(k, (0, 2, 3, 1))) * 0.25,
         [Arg((2, 8, 3, 4)), Arg((2, 8, 3, 4))], name="attention-permutes-vec4"),
]


@pytest.mark.parametrize("variant", ["regs8x8vk", "regs4x4vk", "regs8x8v"])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in VECTOR_CASES])
def test_vec4_register_blocks_take_prologues_and_epilogues(gpu_device, monkeypatch,
                                                          variant: str, case: Case) -> None:
    """A stitched operand read as vec4s gets a load function returning vec4s (its prologue
    at four elements); an input read only as vec4s stays bound as vec4s, one the epilogue
    reads too is bound as scalars and its vec4s gathered by a load function."""
    monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
    b, graph = _stitched(case)
    target = Target(limits=gpu_device.limits, software=True)
    kernels = [emit_node(graph, n, target, OPS).wgsl for n in graph.nodes
               if n.op == "fused" and "matmul" in {p.op[:6] for p in n.attrs["program"].nodes}]
    assert any("-> vec4<f32>" in k for k in kernels), "no operand was loaded as vec4s"
    if case.name == "input-read-twice":  # w: the vec4 operand B and an epilogue input
        assert any("fn load_1(q: u32) -> vec4<f32>" in k for k in kernels)
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values, target=target))


@pytest.mark.parametrize("variant", ["regs16x8v", "regs8x8v", "regs4x8v", "regs8x1v"])
@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES[:3] + VECTOR_CASES])
def test_costly_compile_targets_store_blocks_in_one_loop(gpu_device, monkeypatch, variant: str,
                                                        background: bool, case: Case) -> None:
    """Where shader compiles are dear (SwiftShader), a register block of 16 outputs or more
    stores them in one loop, so its epilogue is compiled once (a tiered start's background
    tier keeps a store per output); values unchanged, ragged blocks (37 x 23 outputs) skip
    what lies outside."""
    monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
    b, graph = _stitched(case)
    target = Target(limits=gpu_device.limits, software=True, costly_compiles=True,
                    background=background)
    kernels = [emit_node(graph, n, target, OPS).wgsl for n in graph.nodes
               if n.op == "fused" and "matmul" in {p.op[:6] for p in n.attrs["program"].nodes}]
    looped = variant != "regs8x1v" and not background
    outputs = {"regs16x8v": 128, "regs8x8v": 64, "regs4x8v": 32, "regs8x1v": 8}[variant]
    assert kernels and all(("var acc = array<f32," in k) == looped for k in kernels)
    calls = [k.count("epilogue(") - 1 for k in kernels if "fn epilogue(" in k]
    assert calls == [1 if looped else outputs] * len(calls)
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values, target=target))


# Operands read through a permute from storage whose other trailing axis is contiguous:
# attention heads merged back from [B, H, D, T] (A; its weight gradient reads it transposed),
# a weight stored [N, K] (B).
SWAPPED_CASES = [
    Case("matmul", lambda o, w: tg.matmul(tg.reshape(tg.permute(o, (0, 3, 1, 2)), (40, 18)),
                                          w) * 0.5,
         [Arg((2, 3, 6, 20)), Arg((18, 21))], name="merged-heads"),
    Case("matmul", lambda x, v: tg.relu(tg.matmul(x, tg.permute(v * 2.0, (1, 0)))),
         [Arg((33, 19)), Arg((23, 19))], name="weight-stored-transposed"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in SWAPPED_CASES])
def test_tiled_matmuls_coalesce_along_a_permuted_operands_contiguous_axis(
        gpu_device, monkeypatch, case: Case) -> None:
    """A stitched operand whose storage has its second-to-last axis contiguous is loaded
    into the tiles along that axis (other code than with the axis unknown), with the same
    values, for every tiled variant on a GPU target."""
    b, graph = _stitched(case)
    cores = [n for n in graph.nodes if n.op == "fused" and
             any(p.op.startswith("matmul") for p in n.attrs["program"].nodes)]
    swapped = set()
    for node in cores:
        program = node.attrs["program"]
        core = program.core(lambda n: is_core(n, OPS))
        for slot, ref in enumerate(program.nodes[core].inputs):
            if contiguous_axis(program, ref, lambda k, n=node: graph[n.inputs[k]].shape) == -2:
                swapped.add(slot)
    assert swapped == ({0} if case.name == "merged-heads" else {1}), swapped
    target = Target(limits=gpu_device.limits, software=False)
    for variant in [v for v in VARIANTS if v.startswith("tiled")]:
        monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
        emitted = [emit_node(graph, n, target, OPS).wgsl for n in cores]
        with monkeypatch.context() as m:
            m.setattr(program_module, "contiguous_axis", lambda *a: -1)
            unknown = [emit_node(graph, n, target, OPS).wgsl for n in cores]
        assert emitted != unknown, variant
        asyncio.run(check_graph_kernels(gpu_device, graph, b.values, target=target))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_matmul_variant_takes_prologues_and_epilogues(gpu_device, monkeypatch,
                                                            variant: str) -> None:
    monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
    for case in CASES[:3]:
        b, graph = _stitched(case)
        asyncio.run(check_graph_kernels(gpu_device, graph, b.values))


def test_training_the_transformer_with_and_without_fusion_agrees(gpu_device) -> None:
    mod = demo("addition_transformer")
    fused, n_fused = asyncio.run(train_losses(gpu_device, mod, mod.AdditionTransformer(),
                                              True, 4))
    plain, n_plain = asyncio.run(train_losses(gpu_device, mod, mod.AdditionTransformer(),
                                              False, 4))
    assert n_fused <= 200 < n_plain
    assert fused == pytest.approx(plain, rel=1e-4)


def test_split_k_weight_gradient_matches_reference(gpu_device, monkeypatch) -> None:
    from tensorgrad.passes import split_k

    monkeypatch.setattr(split_k, "MIN_WORK", 1)
    monkeypatch.setattr(split_k, "CHUNK", 64)
    case = Case("matmul", lambda x, w: tg.sum(tg.tanh(tg.matmul(x, w))),
                [Arg((512, 24)), Arg((24, 40))], name="split-k")
    b = build(case)
    graph, _ = split_k.split_long_contractions(b.graph, b.grads.values())
    assert any(n.op == "matmul_batched" for n in graph.nodes)
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values))


def test_split_column_sum_matches_reference(gpu_device, monkeypatch) -> None:
    from tensorgrad.passes import split_reduce

    monkeypatch.setattr(split_reduce, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(split_reduce, "FILL_THREADS", 256)
    monkeypatch.setattr(split_reduce, "MIN_ROWS", 4)
    case = Case("add", lambda x, b: tg.sum(tg.tanh(tg.reshape(x, (6, 64, 10)) + b)),
                [Arg((384, 10)), Arg((10,))], name="split-bias")
    b = build(case)
    graph, _ = split_reduce.split_column_sums(b.graph, b.grads.values())
    part = next(n for n in graph.nodes if n.op == "sum_partials")
    assert part.shape == (32, 10) and part.attrs["rows"] == 384
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values))
