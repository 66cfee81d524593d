"""A tiered start (``tg.compile(..., tiered=True)``; the default where shader compiles are
dear, SwiftShader): the step starts on quick-to-compile kernels (naive matmuls) and swaps in
the optimized ones once their pipelines are compiled, with the same buffers and the same
results. Forced on here (lavapipe compiles fast, so it is off by default)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import tensorgrad as tg
from tests.models import addition_transformer, mlp_sin


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _train(demo: Any, model: Any, device: Any, tiered: bool, steps: int
                 ) -> tuple[list[float], dict[str, Any], list[bool], list[list[str]]]:
    """Losses of `steps` steps on the demo's batches (seeded), the params after them, and
    before each step whether the graph still holds its quick kernels and their WGSL (the
    swap happens inside the step that finds the optimized ones compiled)."""
    train = await tg.compile(model=model, loss=demo.loss_fn, inputs=demo.INPUTS,
                             optimizer=demo.optimizer(), device=device, seed=3, tiered=tiered)
    rng = random.Random(5)
    losses, quick, kernels = [], [], []
    for _ in range(steps):
        quick.append(train._exe.quick)
        kernels.append(train.kernels)
        result = await train.step(**demo.batch(rng))
        assert result.kind == "completed", result
        losses.append(result.loss)
    params = await train.download_params()
    train.destroy()
    return losses, params, quick, kernels


def test_tiered_start_gives_the_losses_and_params_of_the_normal_path(gpu_device: Any) -> None:
    """The MLP and the addition transformer: the first step runs naive matmuls, the second
    (here, where pipelines compile at once) swaps in the optimized kernels, and every loss and the params after the steps are the same as
    without tiering (bit for bit here: both kernels add along K in the same order)."""
    for demo, model, steps in ((mlp_sin(), "MLP", 5), (addition_transformer(),
                                                      "AdditionTransformer", 3)):
        plain = run(_train(demo, getattr(demo, model)(), gpu_device, False, steps))
        tiered = run(_train(demo, getattr(demo, model)(), gpu_device, True, steps))
        assert tiered[0] == plain[0], (model, tiered[0], plain[0])
        for name, value in plain[1].items():
            assert bytes(memoryview(tiered[1][name])) == bytes(memoryview(value)), name
        assert plain[2] == [False] * steps
        assert tiered[2] == [True, True] + [False] * (steps - 2), tiered[2]
        assert tiered[3][2:] == plain[3][2:] and tiered[3][0] != plain[3][0], model
        # the kernels that differ are the quick matmuls (4 x 4 register blocks)
        changed = [k for k in tiered[3][0] if k not in plain[3][0]]
        assert changed and all("var c3_3 = 0.0f;" in k and "c4_" not in k for k in changed), changed


def test_tiered_start_releases_what_it_held(gpu_device: Any) -> None:
    """Destroyed before the swap (its optimized pipelines asked for, not yet taken) or after
    it, a tiered graph leaves no buffer, pipeline or program behind beyond the cache's
    unused ones (a second identical compile reuses them all)."""
    demo = mlp_sin()
    before = dict(gpu_device.live_objects())

    async def go(steps: int) -> None:
        train = await tg.compile(model=demo.MLP(), loss=demo.loss_fn, inputs=demo.INPUTS,
                                 optimizer=demo.optimizer(), device=gpu_device, seed=3,
                                 tiered=True)
        rng = random.Random(5)
        for _ in range(steps):
            assert (await train.step(**demo.batch(rng))).kind == "completed"
        assert (train._exe.upgrading is not None) == (steps == 1)
        train.destroy()

    for steps in (1, 3, 1):
        run(go(steps))
    after = gpu_device.live_objects()
    assert after["buffers"] == before["buffers"], (before, after)
    assert after["programs"] == before["programs"], (before, after)
    # what stays: at most the cache's unused pipelines of both tiers of this one model
    assert after["pipelines"] - before["pipelines"] <= 2 * len(demo.MLP().named_params()) + 40


def test_attached_forward_of_a_tiered_training_predicts_alike(gpu_device: Any) -> None:
    """An attached forward compiled with tiering on runs its quick kernels first and the
    optimized ones next, with the same output each time."""
    demo = mlp_sin()

    async def go() -> list[bytes]:
        train = await tg.compile(model=demo.MLP(), loss=demo.loss_fn, inputs=demo.INPUTS,
                                 optimizer=demo.optimizer(), device=gpu_device, seed=3,
                                 tiered=True)
        predict = await train.attach(forward=demo.predict_fn, inputs=demo.PREDICT_INPUTS)
        outs = []
        for k in range(3):
            result = await predict.run(x=demo.plot_xs(64))
            assert result.kind == "completed", result
            outs.append(bytes(memoryview(result.output)))
            assert next(iter(predict._cache.values()))[0].quick == (k == 0)
        train.destroy()
        return outs

    outs = run(go())
    assert outs[0] == outs[1] == outs[2]


def test_an_automatic_tiered_start_gives_up_at_the_first_refused_kernel(
        gpu_device: Any, monkeypatch: Any) -> None:
    """Where the tiering is chosen automatically (dear shader compiles) and the quick tier
    refuses a kernel (the transformer's large matmuls), the quick tier is not emitted past
    it: the step's kernels are emitted about once, not twice, and none is a quick one."""
    from dataclasses import replace

    from tensorgrad.codegen import kernel
    from tensorgrad.codegen.kernel import Target
    from tensorgrad.compiler import Options, Request, compile_graph

    emitted: list[bool] = []  # per emit_node call: for the quick tier?
    real = kernel.emit_node

    def counted(graph: Any, node: Any, target: Target, ops: Any) -> Any:
        emitted.append(target.quick)
        return real(graph, node, target, ops)

    monkeypatch.setattr(kernel, "emit_node", counted)
    demo = addition_transformer()
    target = replace(Target.for_device(gpu_device.limits, gpu_device.info),
                     costly_compiles=True)
    c = compile_graph(Request("training", demo.AdditionTransformer(), demo.loss_fn,
                              demo.INPUTS, optimizer=demo.optimizer(), seed=1),
                      Options(device=gpu_device, limits=gpu_device.limits, target=target),
                      until="emit")
    assert not c.tiered
    nodes = len(c.graph.nodes)
    assert 0 < emitted.count(True) < nodes // 4, (emitted.count(True), nodes)
    assert emitted.count(False) <= nodes
    assert all(not k.quick_refused for k in c.kernels)


def test_the_background_tier_keeps_its_stores_written_out(gpu_device: Any,
                                                          monkeypatch: Any) -> None:
    """Where compiles are dear, register blocks store through one loop (an epilogue compiled
    once) in kernels a compile waits for (the quick tier here), not in the optimized tier a
    tiered start compiles in the background (faster steps: the MLP's were 2-4% slower with
    the loop on SwiftShader)."""
    from dataclasses import replace

    from tensorgrad.codegen.kernel import Target

    real = Target.for_device
    monkeypatch.setattr(Target, "for_device", staticmethod(
        lambda limits, info: replace(real(limits, info), costly_compiles=True)))
    demo = mlp_sin()
    _, _, quick, kernels = run(_train(demo, demo.MLP(), gpu_device, True, 3))
    assert quick == [True, True, False]
    assert any("var acc = array<f32," in k for k in kernels[0])
    assert kernels[2] != kernels[0] and not any("var acc = array<f32," in k for k in kernels[2])
