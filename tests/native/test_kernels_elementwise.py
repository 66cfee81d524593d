"""Elementwise kernels (and broadcast_to / sum_to_shape) on a real WebGPU device, against
the reference interpreter: every unit case's forward+backward graph, kernel by kernel, plus
shapes that need 2D dispatch and both sum_to_shape variants."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target, emit_node
from tensorgrad.ops import OPS, sum_to_shape
from tests.harness import Arg, Case, build
from tests.kernel_check import check_case as check


def test_two_d_dispatch(gpu_device) -> None:
    # 17M elements > 65535 workgroups * 256 threads: the grid spills into y.
    case = Case("add", lambda x: tg.exp(x) + 1.0, [Arg((4, 4_200_001), gen="unit")],
                grad=False, name="2d")
    b = build(case, with_grad=False)
    node = b.graph[b.out]
    assert emit_node(b.graph, node, Target(), OPS).threads > 65_535 * 256
    assert {"exp", "add_scalar"} <= check(gpu_device, case, with_grad=False)


@pytest.mark.parametrize("shape, target, variant", [
    ((3, 700, 5), (1, 5), "workgroup"),     # few outputs, long reduction
    ((70000, 3), (3,), "workgroup"),
    ((40000, 2), (40000, 1), "thread"),      # many outputs, short reduction
    ((6, 1, 7, 5), (7, 1), "thread"),
])
def test_sum_to_shape_variants(gpu_device, shape, target, variant) -> None:
    case = Case("sum_to_shape", lambda x: sum_to_shape(x, target), [Arg(shape)],
                grad=False, name=variant)
    b = build(case, with_grad=False)
    wgsl = emit_node(b.graph, b.graph[b.out], Target(), OPS).wgsl
    assert ("workgroupBarrier" in wgsl) == (variant == "workgroup")
    check(gpu_device, case, with_grad=False)


def test_bool_and_i32_kernels(gpu_device) -> None:
    ints = np.array([-3, 0, 2, 7], np.int32)
    case = Case("where", lambda a, b: tg.where(a > b, a, b * 2),
                [Arg((4,), "i32", ints), Arg((4,), "i32", ints[::-1].copy())], grad=False)
    assert {"greater", "where", "mul_scalar"} <= check(gpu_device, case, with_grad=False)


@pytest.mark.parametrize("fn", [tg.log, tg.sqrt, tg.rsqrt])
def test_negative_domain_gives_nan(gpu_device, fn) -> None:
    # WGSL leaves these indeterminate; the kernels must give NaN like NumPy, on any driver.
    xs = np.array([-2.0, -1e-30, 0.5, 4.0], np.float32)
    case = Case(fn.__name__, fn, [Arg((4,), gen=xs)], grad=False)
    b = build(case, with_grad=False)
    from tests.kernel_check import run_node
    got = asyncio.run(run_node(gpu_device, b.graph, b.graph[b.out],
                               [b.values.get(n.attrs.get("name")) for n in b.graph.nodes]))
    assert np.isnan(got[:2]).all() and np.isfinite(got[2:]).all(), got


class _Probs(tg.Module):
    def __init__(self) -> None:
        self.p = tg.Linear(2, 2)


def test_a_nan_through_a_fused_clamp_fails_the_step(gpu_device) -> None:
    """log of a negative value, clamped: the NaN must reach the loss through the fused
    kernel's max and min (several drivers let the bound win), so the step guard skips the
    update instead of training on a finite loss made of clamped NaNs."""
    async def go() -> tuple[tg.Result, int]:
        train = await tg.compile(
            model=_Probs(), loss=lambda m, x: tg.sum(tg.clamp(tg.log(m.p(x)), -1.0, 1.0)),
            inputs={"x": (1, 2)}, optimizer=tg.optim.SGD(lr=0.1), seed=0, device=gpu_device)
        await train.upload_params({"p.W": np.eye(2, dtype=np.float32),
                                   "p.b": np.zeros(2, np.float32)})
        result = await train.step(x=np.array([[-1.0, 2.0]], np.float32))
        count = train.step_count
        train.destroy()
        return result, count

    result, count = asyncio.run(go())
    assert isinstance(result, tg.Failed) and isinstance(result.error, FloatingPointError), result
    assert "loss is nan" in result.message and count == 0
