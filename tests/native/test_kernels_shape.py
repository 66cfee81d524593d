"""Shape kernels (reshape, permute, slice_range, scatter_axis, concat) on a real WebGPU
device, against the reference interpreter: every unit case's forward+backward graph, plus
larger cases, one past the 65535-workgroup limit (2-D dispatch)."""

from __future__ import annotations

import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import dispatch_size
from tests.harness import Arg, Case
from tests.kernel_check import check_case as check

LARGE = [
    Case("permute", lambda x: tg.permute(x, (2, 0, 1)), [Arg((30, 70, 50))], name="large"),
    Case("swap_axes", lambda x: tg.swap_axes(x, 0, 1), [Arg((513, 300))], name="large"),
    Case("narrow", lambda x: tg.narrow(x, 1, 100, 333), [Arg((64, 1000))], name="large"),
    Case("concat", lambda *xs: tg.concat(list(xs), 1), [Arg((40, 100 + k)) for k in range(7)],
         name="7-large"),
    Case("concat", lambda *xs: tg.concat(list(xs), 0), [Arg((3, 500))] * 15, name="15-large"),
    Case("stack", lambda a, b: tg.stack([a, b], -1), [Arg((200, 300)), Arg((200, 300))],
         name="large"),
    Case("split", lambda x: tg.split(x, [100, 411, 1], -1), [Arg((30, 512))], name="large"),
    Case("split_heads", lambda x: tg.split_heads(x, 8), [Arg((4, 128, 256))], name="large"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in LARGE])
def test_large_cases(gpu_device, case: Case) -> None:
    check(gpu_device, case)


def test_reshape_past_the_workgroup_limit(gpu_device) -> None:
    shape = (4097, 4096)  # 16.78M threads: more than 65535 workgroups of 256 -> 2-D grid
    assert dispatch_size(shape[0] * shape[1], 256)[1] > 1
    case = Case("reshape", lambda x: tg.reshape(x, (-1,)), [Arg(shape, gen="unit")],
                grad=False)
    assert check(gpu_device, case) == {"reshape"}
