"""Fused elementwise kernels on a real device: each fused node against the reference, and
training with fusion on tracks training with it off."""

from __future__ import annotations

import asyncio
import random

import pytest

import tensorgrad as tg
from tensorgrad.passes import fuse_elementwise
from tests.harness import Arg, Case, build
from tests.kernel_check import check_graph_kernels
from tests.models import demo
from tests.unit.test_ops_elementwise import CASES

FUSION_CASES = [c for c in CASES if c.grad] + [
    Case("gelu", lambda x, y: tg.gelu(x * y + 1.0) * tg.sigmoid(y), [Arg((5, 7)), Arg((7,))],
         name="broadcast-erf"),
    Case("where", lambda x, y: tg.where(x > y, tg.exp(x), -y) + 2.0,
         [Arg((3, 1, 4)), Arg((2, 4))], name="bool-3d"),
    Case("reshape", lambda x, b: tg.exp(tg.reshape(tg.relu(x), (4, 3)) + b) * 0.5,
         [Arg((2, 6)), Arg((3,))], name="through-a-reshape"),
    Case("reshape", lambda x, y: tg.reshape(tg.sin(x) * y, (24,)) - 1.0,
         [Arg((3, 2, 4)), Arg((2, 4))], name="broadcast-then-reshape"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in FUSION_CASES])
def test_fused_kernels_match_reference(gpu_device, case: Case) -> None:
    b = build(case)
    fused, _ = fuse_elementwise(b.graph, b.grads.values())
    ops = asyncio.run(check_graph_kernels(gpu_device, fused, b.values))
    if len(fused.nodes) < len(b.graph.nodes):
        assert "fused" in ops


async def train_losses(device, mod, model: tg.Module, fuse: bool, steps: int
                       ) -> tuple[list[float], int]:
    """The losses of `steps` training steps of a demo module's model (seed 3), and the
    kernel count, with fusion (and stitching) on or off."""
    train = await tg.compile(model=model, loss=mod.loss_fn, inputs=mod.INPUTS,
                             optimizer=mod.optimizer(), device=device, seed=3, fuse=fuse)
    rng = random.Random(3)
    out = []
    for _ in range(steps):
        r = await train.step(**mod.batch(rng))
        assert r.kind == "completed", r
        out.append(r.loss)
    count = train.kernel_count
    train.destroy()
    return out, count


def test_training_with_and_without_fusion_agree(gpu_device) -> None:
    mod = demo("mlp_sin")
    fused, n_fused = asyncio.run(train_losses(gpu_device, mod, mod.MLP(), True, 15))
    plain, n_plain = asyncio.run(train_losses(gpu_device, mod, mod.MLP(), False, 15))
    assert n_fused < n_plain
    assert fused == pytest.approx(plain, rel=1e-5)
