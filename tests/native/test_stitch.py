"""Stitched kernels on a real device: each matmul variant and each reduction kernel with
prologues and epilogues against the reference, and training with them."""

from __future__ import annotations

import asyncio

import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target
from tensorgrad.ops import linalg
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
