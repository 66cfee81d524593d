"""The stitching pass: prologues and epilogues merged into matmul and reduction kernels, with
the values of the unstitched graph."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target
from tensorgrad.compiler import Options, Request, compile_graph
from tensorgrad.ir import Graph
from tensorgrad.passes import fuse_elementwise, stitch_kernels
from tensorgrad.reference import evaluate
from tensorgrad.tensor import leaf, tracing
from tests.models import demo
from tests.unit.test_fuse import _training_graph

COVERS = {"fused"}


def _both(graph: Graph, protected: set[int]) -> tuple[Graph, dict[int, int]]:
    fused, remap1 = fuse_elementwise(graph, protected)
    stitched, remap2 = stitch_kernels(fused, {remap1[i] for i in protected})
    return stitched, {old: remap2[new] for old, new in remap1.items() if new in remap2}


def _kernels(graph: Graph) -> list[str]:
    return [n.label for n in graph.nodes if n.op not in ("param", "input", "state")]


def _programs(graph: Graph) -> list[str]:
    return [str(n.attrs["program"]) for n in graph.nodes if n.op == "fused"]


@pytest.mark.parametrize("name", ["mlp_sin", "addition_transformer"])
def test_stitched_training_graph_computes_the_same(name: str) -> None:
    tr, opt, feeds = _training_graph(name)
    protected = {*tr.grads.values(), *(wb.source for wb in opt.writebacks)}
    fused, _ = fuse_elementwise(tr.graph, protected)
    stitched, remap = _both(tr.graph, protected)
    assert len(stitched.nodes) < len(fused.nodes)
    before = evaluate(tr.graph, feeds)
    after = evaluate(stitched, feeds)
    for i in [tr.loss, *protected]:
        np.testing.assert_allclose(after[remap[i]], before[i], rtol=1e-6, atol=1e-7,
                                   err_msg=tr.graph[i].describe())


def test_bias_and_relu_become_the_matmul_epilogue() -> None:
    with tracing() as st:
        x = leaf("input", "x", (8, 4))
        w = leaf("param", "w", (4, 3))
        b = leaf("param", "b", (3,))
        y = tg.relu(tg.matmul(x, w) + b)
    st.graph.outputs = [y.id]
    out, remap = _both(st.graph, set())
    assert _kernels(out) == ["fused(matmul, add, relu)"]
    assert _programs(out) == ["relu(add(matmul(x0, x1), x2))"]
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 4)),
             "w": np.random.default_rng(1).standard_normal((4, 3)),
             "b": np.array([0.5, -1.0, 0.0])}
    np.testing.assert_array_equal(evaluate(out, feeds)[remap[y.id]],
                                  evaluate(st.graph, feeds)[y.id])


def test_a_reduction_takes_its_elementwise_input_and_its_scale() -> None:
    with tracing() as st:
        x = leaf("input", "x", (5, 6))
        y = leaf("input", "y", (5, 6))
        loss = tg.mean((x - y) * (x - y))     # sum_last of a product, then a mul_scalar
    st.graph.outputs = [loss.id]
    out, _ = _both(st.graph, set())
    assert _kernels(out) == ["fused(sub, mul, sum_last, mul_scalar)"]


def test_an_epilogue_runs_with_its_core_unless_it_reads_a_later_value() -> None:
    """A stitched kernel goes where its core was when the epilogue's other inputs exist by
    then (the core's inputs then die there, not at the consumer), else after the last of
    them; values unchanged."""
    with tracing() as st:
        x = leaf("input", "x", (8, 4))
        s = leaf("input", "s", ())
        z = leaf("input", "z", (5,))
        w = leaf("param", "w", (4, 3))
        h = tg.matmul(x, w)
        t = tg.sum(tg.tanh(z))                  # other work, made after the core
        y = h * s                               # the consumer comes after it
        h2 = tg.matmul(x, w * 2.0)
        u = tg.sum(tg.exp(z))
        y2 = h2 * u                             # reads a value made after its core
    st.graph.outputs = [y.id, t.id, y2.id]
    out, remap = _both(st.graph, set())
    assert _kernels(out) == ["fused(matmul, mul)", "fused(tanh, sum_last)",
                             "fused(exp, sum_last)", "fused(mul_scalar, matmul, mul)"]
    assert remap[y.id] < remap[t.id] < remap[u.id] < remap[y2.id]
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((8, 4)), "s": np.array(0.5), "z": rng.standard_normal(5),
             "w": rng.standard_normal((4, 3))}
    want, got = evaluate(st.graph, feeds), evaluate(out, feeds)
    for v in (y, t, y2):
        np.testing.assert_array_equal(got[remap[v.id]], want[v.id])


def test_a_needed_core_result_takes_no_epilogue() -> None:
    with tracing() as st:
        x = leaf("input", "x", (8, 4))
        w = leaf("param", "w", (4, 3))
        h = tg.matmul(x, w)
        y = tg.tanh(h)
    st.graph.outputs = [y.id]
    out, _ = _both(st.graph, {h.id})        # h is kept (say, a gradient): tanh runs apart
    assert _kernels(out) == ["matmul", "tanh"]


def test_a_consumer_reading_the_core_elsewhere_is_no_epilogue() -> None:
    with tracing() as st:
        a = leaf("input", "a", (3, 3))
        h = tg.matmul(a, a)
        y = h + tg.permute(h, (1, 0))           # h read at two indices
    st.graph.outputs = [y.id]
    out, remap = _both(st.graph, set())
    assert "matmul" in _kernels(out)
    feeds = {"a": np.arange(9.0).reshape(3, 3)}
    np.testing.assert_array_equal(evaluate(out, feeds)[remap[y.id]],
                                  evaluate(st.graph, feeds)[y.id])


def test_permutes_are_copied_into_every_matmul_that_reads_them() -> None:
    with tracing() as st:
        q = leaf("input", "q", (2, 4, 3, 5))
        k = leaf("input", "k", (2, 4, 3, 5))
        qt = tg.permute(q, (0, 2, 1, 3))        # [2, 3, 4, 5], read by two matmuls
        kt = tg.permute(k, (0, 2, 3, 1))        # [2, 3, 5, 4]
        s1 = tg.matmul(qt, kt)
        s2 = tg.matmul(qt, tg.permute(qt, (0, 1, 3, 2)))
    st.graph.outputs = [s1.id, s2.id]
    out, remap = _both(st.graph, set())
    assert _kernels(out) == ["fused(permute, matmul_batched)"] * 2
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((2, 4, 3, 5)), "k": rng.standard_normal((2, 4, 3, 5))}
    before, after = evaluate(st.graph, feeds), evaluate(out, feeds)
    for t in (s1, s2):
        np.testing.assert_array_equal(after[remap[t.id]], before[t.id])


def test_software_targets_keep_permutes_out_of_plain_matmuls() -> None:
    """For a CPU-emulated GPU a plain matmul reads merged heads from a kernel of their own
    (the permute's index arithmetic at every read is dear there); a batched matmul still
    takes its permutes, and a GPU target stitches both. Values are unchanged."""
    with tracing() as st:
        a = leaf("input", "a", (2, 3, 4, 5))
        w = leaf("param", "w", (15, 6))
        b = leaf("input", "b", (2, 4, 3, 5))
        merged = tg.reshape(tg.permute(a, (0, 2, 1, 3)), (2, 4, 15))   # merge heads
        y = tg.matmul(merged, w)
        z = tg.matmul(tg.permute(b, (0, 2, 1, 3)), tg.permute(a, (0, 1, 3, 2)))
    st.graph.outputs = [y.id, z.id]

    def stitched(software: bool) -> tuple[Graph, dict[int, int]]:
        fused, remap1 = fuse_elementwise(st.graph, set())
        out, remap2 = stitch_kernels(fused, set(), software=software)
        return out, {old: remap2[new] for old, new in remap1.items() if new in remap2}

    gpu, _ = stitched(False)
    assert sorted(_kernels(gpu)) == ["fused(permute, matmul)", "fused(permute, matmul_batched)"]
    software, remap = stitched(True)
    assert sorted(_kernels(software)) == ["fused(permute, matmul_batched)", "matmul",
                                          "permute", "reshape"]   # (a reshape is a view)
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((2, 3, 4, 5)), "w": rng.standard_normal((15, 6)),
             "b": rng.standard_normal((2, 4, 3, 5))}
    before, after = evaluate(st.graph, feeds), evaluate(software, feeds)
    for t in (y, z):
        np.testing.assert_array_equal(after[remap[t.id]], before[t.id])
    # compiled for a software target, the transformer's step reads merged heads stored once
    mod = demo("addition_transformer")
    c = compile_graph(Request("training", mod.AdditionTransformer(), mod.loss_fn, mod.INPUTS,
                              optimizer=mod.optimizer(), seed=1),
                      Options(target=Target(software=True)), until="emit")
    assert not [n for n in c.graph.nodes if n.op == "fused" and "matmul(" in
                str(n.attrs["program"]) and "permute" in str(n.attrs["program"])
                and not any(m.op == "matmul_batched" for m in n.attrs["program"].nodes)]


def test_matmul_prologues_are_held_to_one_arithmetic_op() -> None:
    with tracing() as st:
        x = leaf("input", "x", (8, 4))
        w = leaf("param", "w", (4, 3))
        y = tg.matmul(tg.exp(tg.sin(x)), w)     # two ops: recomputed per read, so not moved
        z = tg.matmul(tg.exp(x), w)             # one op: moved
    st.graph.outputs = [y.id, z.id]
    out, _ = _both(st.graph, set())
    assert sorted(_kernels(out)) == ["fused(exp, matmul)", "fused(sin, exp)", "matmul"]


def test_stitching_respects_the_binding_limit() -> None:
    with tracing() as st:
        xs = [leaf("input", f"x{k}", (4, 4)) for k in range(8)]
        acc = xs[0]
        for x in xs[1:7]:
            acc = acc * x
        y = tg.matmul(acc, xs[7]) + xs[1] + xs[2] + xs[3]
    st.graph.outputs = [y.id]
    out, _ = _both(st.graph, set())
    assert all(len(n.inputs) <= 7 for n in out.nodes)


def _kernel_count(name: str, cls: str) -> int:
    mod = demo(name)
    c = compile_graph(Request("training", getattr(mod, cls)(), mod.loss_fn, mod.INPUTS,
                              optimizer=mod.optimizer(), seed=1), Options(), until="emit")
    return sum(1 for k in c.kernels if k.threads)


def test_kernel_counts_per_step() -> None:
    """Issue 11's targets: MLP <= 20 kernels per step (39 before), addition transformer
    <= 200 (493 before)."""
    assert _kernel_count("mlp_sin", "MLP") <= 20
    assert _kernel_count("addition_transformer", "AdditionTransformer") <= 200


def test_split_k_is_off_for_cpu_rasterisers() -> None:
    from tensorgrad.codegen.kernel import Target

    mod = demo("addition_transformer")

    def ops(target: Target) -> list[str]:
        c = compile_graph(Request("training", mod.AdditionTransformer(), mod.loss_fn,
                                  mod.INPUTS, optimizer=mod.optimizer(), seed=1),
                          Options(target=target, fuse=False), until="emit")
        return [n.op for n in c.graph.nodes]

    # the transformer's [64, 256] and [256, 64] weight gradients over 1,024 rows are split
    # for a GPU, not for lavapipe / SwiftShader, where a second kernel buys no parallelism
    software, hardware = ops(Target(software=True)), ops(Target(software=False))
    assert hardware.count("matmul_batched") >= software.count("matmul_batched") + 6
    assert len(hardware) > len(software)


def test_long_weight_gradients_are_split_along_k() -> None:
    from tensorgrad.passes import split_long_contractions
    from tensorgrad.passes.split_k import splits_for

    assert splits_for(256, 4096, 1024) == 8
    assert splits_for(64, 256, 64) == 1          # small: one kernel is enough
    assert splits_for(2048, 2048, 2048) == 1     # K not long beside M, N
    # few output tiles: split until there are enough (an LM head's gradient, a narrow model)
    assert splits_for(256, 4096, 65) == 16
    assert splits_for(256, 1024, 64) == 8
    assert splits_for(64, 512, 64) == 1          # too little work for a second kernel
    # too few 128x128 tiles for the largest tiling: GPT-2's MLP and QKV gradients
    assert splits_for(768, 8192, 3072) == 8
    assert splits_for(3072, 8192, 768) == 8
    assert splits_for(768, 8192, 2304) == 8
    assert splits_for(2048, 4096, 2048) == 4     # 256 tiles
    assert splits_for(768, 8192, 50304) == 1     # an LM head's gradient has tiles enough
    assert splits_for(768, 4096, 3072) == 1      # K not twice M and N
    with tracing() as st:
        x = leaf("input", "x", (4096, 256))
        dy = leaf("input", "dy", (4096, 1024))
        from tensorgrad.ops.linalg import mm
        dw = mm(x, dy, transpose_a=True)
    st.graph.outputs = [dw.id]
    out, remap = split_long_contractions(st.graph, ())
    assert [n.op for n in out.nodes if n.op != "input"] == \
        ["reshape", "reshape", "matmul_batched", "sum_to_shape"]
    assert out[remap[dw.id]].shape == (256, 1024)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4096, 256)).astype(np.float32),
             "dy": rng.standard_normal((4096, 1024)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(out, feeds)[remap[dw.id]],
                               evaluate(st.graph, feeds)[dw.id], rtol=1e-4, atol=1e-3)


def test_long_column_sums_are_split_in_two_stages() -> None:
    from tensorgrad.passes import split_column_sums
    from tensorgrad.passes.split_reduce import column_split

    # GPT-2's bias gradients: [B, T, 768] and [B, T, 3072] summed over 8,192 rows
    assert column_split((32, 256, 768), (768,)) == (8192, 768, 256)
    assert column_split((32, 256, 3072), (1, 1, 3072)) == (8192, 3072, 64)
    assert column_split((4096, 256), (256,)) is None          # small: one kernel is enough
    assert column_split((16, 8192, 768), (768, 768)) is None   # no leading block summed
    assert column_split((8192, 4, 768), (4, 1)) is None        # kept axis before a summed one
    assert column_split((8, 1 << 20), (1 << 20,)) is None      # columns enough already
    assert column_split((8191, 768), (768,)) is None           # rows with no even split
    with tracing() as st:
        dy = leaf("input", "dy", (64, 128, 512))
        from tensorgrad.ops import sum_to_shape
        db = sum_to_shape(dy * 2.0, (1, 512))
    st.graph.outputs = [db.id]
    out, remap = split_column_sums(st.graph, ())
    assert [n.op for n in out.nodes if n.op != "input"] == \
        ["mul_scalar", "sum_partials", "sum_to_shape", "reshape"]
    part = next(n for n in out.nodes if n.op == "sum_partials")
    assert part.shape == (256, 512) and part.attrs["rows"] == 8192
    assert out[remap[db.id]].shape == (1, 512)
    feeds = {"dy": np.random.default_rng(0).standard_normal((64, 128, 512)).astype(np.float32)}
    np.testing.assert_allclose(evaluate(out, feeds)[remap[db.id]],
                               evaluate(st.graph, feeds)[db.id], rtol=1e-4, atol=1e-3)


def test_column_sums_split_only_for_gpus() -> None:
    from tensorgrad.codegen.kernel import Target

    class Wide(tg.Module):
        def __init__(self) -> None:
            self.lin = tg.Linear(256, 1024)

        def forward(self, x: tg.Tensor) -> tg.Tensor:
            return self.lin(x)

    def ops(target: Target) -> list[str]:
        c = compile_graph(Request("training", Wide(), lambda m, x: tg.mean(m(x)),
                                  {"x": (4096, 256)}, optimizer=tg.optim.SGD(lr=0.1), seed=1),
                          Options(target=target), until="emit")
        return [n.op for n in c.graph.nodes]

    # the bias gradient sums 4,096 rows of 1,024: two stages for a GPU, one kernel for
    # lavapipe / SwiftShader, where the first stage buys no parallelism
    assert "sum_partials" in ops(Target(software=False))
    assert "sum_partials" not in ops(Target(software=True))
