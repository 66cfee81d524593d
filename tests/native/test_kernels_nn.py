"""rope / cross_entropy / nll_loss / capture graphs on a real WebGPU device, kernel by kernel
against the reference interpreter (they compose other families' primitives), plus a large
language-model-sized loss and rope."""

from __future__ import annotations

import tensorgrad as tg
from tests.harness import Arg, Case
from tests.kernel_check import check_case as check


def test_large_cross_entropy(gpu_device) -> None:
    case = Case("cross_entropy", tg.cross_entropy,
                [Arg((4, 128, 300)), Arg((4, 128), "i32", "int:0:300")], name="large")
    assert {"log_softmax_last", "one_hot"} <= check(gpu_device, case)


def test_large_rope(gpu_device) -> None:
    case = Case("rope", tg.rope, [Arg((4, 8, 64, 32)), Arg((4, 8, 64, 32))], name="large")
    assert {"sin", "cos", "concat", "slice_range"} <= check(gpu_device, case)
