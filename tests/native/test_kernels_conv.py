"""conv2d / max_pool2d / nearest_upsample2d kernels on a real WebGPU device, against the
reference interpreter: every unit case's forward+backward graph, plus larger cases for both
weight-gradient variants (one workgroup per weight vs one thread per weight)."""

from __future__ import annotations

import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target, emit_node
from tensorgrad.ops import OPS
from tests.harness import Arg, Case, build
from tests.kernel_check import check_case as check
from tests.unit.test_ops_conv import conv_case, pool_case


def weight_grad_variant(case: Case) -> str:
    b = build(case)
    node = next(n for n in b.graph.nodes if n.op == "conv2d_weight_grad")
    wgsl = emit_node(b.graph, node, Target(), OPS).wgsl
    return "workgroup" if "workgroupBarrier" in wgsl else "thread"


LARGE = [
    # B*Ho*Wo = 512 >= 256 and 144 weights: one workgroup per weight.
    (conv_case((2, 4, 16, 16), (8, 2, 3, 3), padding=1, groups=2, name="wg-weight-grad"),
     "workgroup"),
    (conv_case((2, 16, 24, 24), (24, 16, 3, 3), stride=2, padding=1, name="wg-s2"),
     "workgroup"),
    # 36864 weights: one thread per weight, serial over B*Ho*Wo.
    (conv_case((1, 64, 6, 6), (64, 64, 3, 3), padding=1, name="thread-weight-grad"),
     "thread"),
    (conv_case((3, 3, 9, 9), (6, 1, 2, 2), groups=3, name="thread-depthwise"), "thread"),
]


@pytest.mark.parametrize("case, variant", [pytest.param(*c, id=c[0].id) for c in LARGE])
def test_large_conv(gpu_device, case: Case, variant: str) -> None:
    assert weight_grad_variant(case) == variant
    assert {"conv2d", "conv2d_input_grad", "conv2d_weight_grad"} <= check(gpu_device, case)


def test_large_pool_and_upsample(gpu_device) -> None:
    assert "max_pool2d_grad" in check(gpu_device, pool_case((4, 8, 33, 31), 3, 2, 1,
                                                            name="large"))
    check(gpu_device, Case("nearest_upsample2d", lambda x: tg.nearest_upsample2d(x, 4),
                           [Arg((2, 8, 30, 20))], name="large"))
