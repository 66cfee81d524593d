"""dropout / randn / categorical kernels on a real WebGPU device, against the reference
interpreter (same hash, same bits): every unit case's forward+backward graph, a dropout past
the 65535-workgroup limit (2-D dispatch), and large randn / categorical draws."""

from __future__ import annotations

import asyncio

import numpy as np

import tensorgrad as tg
from tensorgrad.codegen.kernel import dispatch_size
from tensorgrad.ops.stochastic import _uniform
from tensorgrad.reference import evaluate
from tests.harness import Arg, Case, build
from tests.kernel_check import check_case as check
from tests.kernel_check import run_node
from tests.unit.test_ops_stochastic import seed_feed


def test_dropout_past_the_workgroup_limit(gpu_device) -> None:
    shape = (4097, 4096)  # 16.78M threads: more than 65535 workgroups of 256 -> 2-D grid
    assert dispatch_size(shape[0] * shape[1], 256)[1] > 1
    case = Case("dropout", lambda x: tg.dropout(x, 0.3), [Arg(shape, gen="unit")],
                grad=False, feeds=seed_feed(77))
    assert check(gpu_device, case) == {"dropout"}


def test_large_randn_and_dropout_backward(gpu_device) -> None:
    check(gpu_device, Case("randn", lambda x: x * tg.randn((300, 700)), [Arg((300, 700))],
                           feeds=seed_feed(-123456789)))
    check(gpu_device, Case("dropout", lambda x: tg.dropout(x, 0.9), [Arg((513, 257))],
                           feeds=seed_feed(2**31 - 1)))


def test_large_categorical(gpu_device) -> None:
    """Rows may differ only where f32 math cannot decide: the two best Gumbel scores closer
    than the log error, or a uniform so close to 1 that log(-log u) is ill-conditioned."""
    case = Case("categorical", lambda lg: tg.categorical(lg * 3.0), [Arg((3000, 50))],
                grad=False, feeds=seed_feed(5))
    b = build(case)
    values = evaluate(b.graph, b.values)
    node = b.graph[b.out]
    got = asyncio.run(run_node(gpu_device, b.graph, node, values))
    want = values[node.id]
    logits = values[node.inputs[0]].astype(np.float64)
    u = np.maximum(1e-10, _uniform(b.values["__prng_seed"], node.attrs["salt"],
                                   logits.shape).astype(np.float64))
    score = np.sort(logits - np.log(-np.log(u)), axis=-1)
    undecidable = (score[:, -1] - score[:, -2] < 1e-4) | np.any(u > 0.999, axis=-1)
    assert np.all((got == want) | undecidable)
    assert np.mean(got == want) > 0.995
