"""Optimizer update kernels on a real WebGPU device, against the reference interpreter.

Every primitive case of the unit tests runs kernel by kernel; whole training graphs (Adam(W)
with clipping and normalization, SGD with Nesterov and decay) check the kernels on realistic
operands; large cases cover grad_sumsq's workgroup loop and a 2-D dispatch grid."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tensorgrad import optim
from tensorgrad.codegen.kernel import dispatch_size
from tensorgrad.ops import optim_ops as oo
from tensorgrad.ops.registry import record
from tests.harness import Arg, Case, build
from tests.kernel_check import check_graph_kernels
from tests.unit.test_optim import CASES, P1, P2, XS, YS
from tests.unit.test_optim import build as build_training


def check(device, case: Case, **tol) -> set[str]:
    b = build(case)
    return asyncio.run(check_graph_kernels(device, b.graph, b.values, **tol))


# A pack runs no kernel (the buffer plan places its inputs): the arena training runs on the
# device test it (tests/native/test_api*.py, test_training.py).
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if c.op != "pack"])
def test_case_kernels(gpu_device, case: Case) -> None:
    assert case.op in check(gpu_device, case)


TRAINING = {
    "adamw-clip-normalize": optim.AdamW(0.05, weight_decay=0.1, clip_grad_norm=0.5,
                                        normalize_grads="p2"),
    "adam-split-moments": optim.Adam(0.05, clip_grad_norm=1.0),
    "sgd-nesterov-decay-clip": optim.SGD(0.01, momentum=0.9, nesterov=True, weight_decay=0.05,
                                         clip_grad_norm=1.0),
    "sgd-momentum": optim.SGD(0.01, momentum=0.9, normalize_grads=True),
    "sgd-plain-decay": optim.SGD(0.01, weight_decay=0.2),
}


@pytest.mark.parametrize("arena", [False, True], ids=["per-param", "arena"])
@pytest.mark.parametrize("name", sorted(TRAINING))
def test_training_graph_kernels(gpu_device, name: str, arena: bool) -> None:
    from tensorgrad.gpu.interface import DeviceLimits

    config = TRAINING[name]
    limits = DeviceLimits(max_storage_buffer_binding_size=64) if "split" in name else None
    graph, _, _, plan = build_training(config, limits=limits, arena=arena)
    rng = np.random.default_rng(3)
    feeds = {"p1": P1, "p2": P2, "x": XS[0], "y": YS[0], **plan.host_scalars(config, 3)}
    for state, node in graph.states.items():  # nonzero moments; v must stay positive
        feeds[state] = np.abs(rng.standard_normal(node.shape)) * 0.1
    checked = asyncio.run(check_graph_kernels(gpu_device, graph, feeds))
    assert {"adam_update_p", "sgd_update_p"} & checked


def test_sumsq_long_input(gpu_device) -> None:
    case = Case("grad_sumsq", oo.grad_sumsq, [Arg((100_003,), gen="unit")], grad=False)
    assert check(gpu_device, case) == {"grad_sumsq"}


def test_update_past_the_workgroup_limit(gpu_device) -> None:
    shape = (4097, 4096)  # 16.78M threads: more than 65535 workgroups of 256 -> 2-D grid
    assert dispatch_size(shape[0] * shape[1], 256)[1] > 1
    case = Case("sgd_update_p", lambda p, g, lr: oo.sgd_update_p(p, lr, g=g),
                [Arg(shape, gen="unit"), Arg(shape, gen="unit"), Arg((), gen=np.float32(0.1))],
                grad=False)
    assert check(gpu_device, case) == {"sgd_update_p"}


def test_partials_of_a_gradient_past_the_thread_cap(gpu_device) -> None:
    """GUARD_THREADS_MAX partials (a thread each) over 16.8M elements: each thread scans an
    interleaved slice; a NaN in the last element clears its slice's flag."""
    n = oo.GUARD_THREADS_MAX * oo.GUARD_PER_THREAD + 5
    assert oo.guard_width([n]) == oo.GUARD_THREADS_MAX
    x = np.random.default_rng(0).uniform(-0.9, 0.9, n).astype(np.float32)
    total = Case("sumsq_partials", lambda a: oo.sumsq_total([a]), [Arg((n,), gen=x)],
                 grad=False)
    assert "sumsq_partials" in check(gpu_device, total)
    x[-1] = np.nan
    flags = Case("finite_partials", lambda a: record("finite_partials", [a]),
                 [Arg((n,), gen=x)], grad=False)
    assert check(gpu_device, flags) == {"finite_partials"}
