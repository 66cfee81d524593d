"""conv2d / max_pool2d / nearest_upsample2d kernels on a real WebGPU device, against the
reference interpreter: every unit case's forward+backward graph, plus larger cases for both
weight-gradient variants (one workgroup per weight vs one thread per weight), and the
register-tiled kernels of software targets at their tile edges."""

from __future__ import annotations

import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target, emit_node
from tensorgrad.ops import OPS
from tests.harness import Arg, Case, build
from tests.kernel_check import check_case as check
from tests.unit.test_ops_conv import conv_case, pool_case

SOFTWARE = Target(software=True)
CONV_OPS = {"conv2d", "conv2d_input_grad", "conv2d_weight_grad"}


def kernels(case: Case, target: Target) -> dict[str, str]:
    """op -> WGSL of the case's forward+backward graph (the last node of each op)."""
    b = build(case)
    return {n.op: emit_node(b.graph, n, target, OPS).wgsl for n in b.graph.nodes
            if n.op in (*CONV_OPS, "max_pool2d_grad")}


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


# Tiles of the software kernels: conv2d and its input gradient up to 8 channels x 4 rows x 8
# columns per thread, the weight gradient up to 8 output channels x all taps per workgroup.
TILED = [
    # 11 channels, 13x13 outputs: a remainder on every tile axis.
    conv_case((2, 3, 13, 13), (11, 3, 3, 3), padding=1, name="edges-p1"),
    conv_case((1, 4, 15, 17), (6, 4, 3, 3), stride=2, name="s2-p0"),
    conv_case((2, 3, 9, 10), (5, 3, 3, 3), padding=2, name="p2"),
    conv_case((2, 4, 12, 11), (6, 2, 5, 5), stride=2, padding=2, groups=2, name="5x5-s2p2-g2"),
    conv_case((1, 8, 9, 9), (12, 8, 1, 1), name="1x1-b1"),
    conv_case((1, 8, 9, 10), (4, 8, 1, 1), stride=2, name="1x1-s2-b1"),
    conv_case((2, 6, 10, 9), (6, 1, 3, 3), padding=1, groups=6, name="depthwise"),
    conv_case((1, 2, 11, 13), (3, 2, 2, 3), stride=(2, 3), padding=(1, 2), name="pairs"),
    conv_case((1, 3, 6, 7), (2, 3, 2, 2), stride=3, padding=1, name="s3-gaps"),
    # The mnist_cnn conv2 at batch 4: a weight-gradient sum of 784 steps over 32 threads.
    conv_case((4, 16, 14, 14), (32, 16, 3, 3), padding=1, name="mnist-conv2-b4"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in TILED])
def test_tiled_conv_on_software_targets(gpu_device, case: Case) -> None:
    for op, wgsl in kernels(case, SOFTWARE).items():
        tiled = "a0_0_0" in wgsl
        assert tiled, f"{op}: expected the register-tiled kernel"
    target = Target(limits=gpu_device.limits, software=True)
    assert check(gpu_device, case, target=target) >= CONV_OPS


def test_software_target_keeps_direct_kernels_past_unrolled_taps(gpu_device) -> None:
    case = conv_case((1, 1, 14, 13), (2, 1, 12, 12), padding=1, name="144-taps")
    assert not any("a0_0_0" in wgsl for wgsl in kernels(case, SOFTWARE).values())
    target = Target(limits=gpu_device.limits, software=True)
    assert check(gpu_device, case, target=target) >= CONV_OPS


POOL_CELLS = [
    # stride >= kernel: one thread per cell of the padded input
    (pool_case((2, 3, 9, 11), 2, name="k2-odd"), True),   # rows and cols no window covers
    (pool_case((1, 2, 10, 9), 2, 3, 1, name="k2s3p1-gaps"), True),
    (pool_case((1, 2, 7, 8), (2, 3), (3, 3), (1, 0), name="pairs"), True),
    (pool_case((2, 2, 7, 7), 3, 2, 1, name="k3s2p1-overlap"), False),
]


@pytest.mark.parametrize("case, cells", [pytest.param(*c, id=c[0].id) for c in POOL_CELLS])
def test_pool_grad_on_software_targets(gpu_device, case: Case, cells: bool) -> None:
    rescans = "for (var ki" in kernels(case, SOFTWARE)["max_pool2d_grad"]
    assert rescans != cells
    target = Target(limits=gpu_device.limits, software=True)
    assert "max_pool2d_grad" in check(gpu_device, case, target=target)

