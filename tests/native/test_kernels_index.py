"""Index kernels (one_hot, arange, and the gathers built on them) on a real WebGPU device,
against the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgrad as tg
from tests.harness import Arg, Case
from tests.kernel_check import check_case as check

LARGE = [
    Case("one_hot", lambda i: tg.one_hot(i, 1000), [Arg((300,), "i32", "int:-5:1005")],
         grad=False, name="large"),
    Case("one_hot", lambda i: tg.one_hot(i, 7, "bool"), [Arg((50, 40), "i32", "int:-1:8")],
         grad=False, name="bool"),
    Case("arange", lambda: tg.arange(100_000, "f32"), [], grad=False, name="f32"),
    Case("arange", lambda: tg.arange(70_001), [], grad=False, name="i32"),
    Case("embedding", tg.embedding, [Arg((300, 64)), Arg((4, 33), "i32", "int:-2:302")],
         name="large"),
    Case("take_along_axis", lambda x, i: tg.take_along_axis(x, i, 1),
         [Arg((20, 300)), Arg((20, 17), "i32", "int:0:300")], name="large"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in LARGE])
def test_large_cases(gpu_device, case: Case) -> None:
    check(gpu_device, case)


def test_negative_index_never_matches(gpu_device) -> None:
    idx = np.array([-1, 0, 2, -2147483648, 2147483647], np.int32)
    case = Case("one_hot", lambda i: tg.one_hot(i, 3, "i32"), [Arg((5,), "i32", gen=idx)],
                grad=False)
    assert check(gpu_device, case) == {"one_hot"}
