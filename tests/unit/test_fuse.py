"""The elementwise fusion pass: same values, fewer nodes, limits respected."""

from __future__ import annotations

import random

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.autograd import append_grad
from tensorgrad.compiler import Options, Request, compile_graph
from tensorgrad.init import init_params
from tensorgrad.passes import fuse_elementwise
from tensorgrad.reference import evaluate
from tensorgrad.tensor import leaf, tracing
from tests.models import demo

COVERS = {"fused"}  # for the op-table completeness test: every test here exercises it


def _training_graph(name: str, seed: int = 0):
    mod = demo(name)
    model = mod.AdditionTransformer() if name == "addition_transformer" else mod.MLP()
    tr = compile_graph(Request("training", model, mod.loss_fn, mod.INPUTS,
                               optimizer=mod.optimizer(), seed=seed),
                       Options(fuse=False), until="passes after optimizer")
    opt = tr.optimizer
    feeds = {n: np.asarray(v).reshape(tr.params[n].shape)
             for n, v in init_params(tr.params, seed).items()}
    batch = mod.batch(random.Random(seed))
    for name_, node in tr.graph.inputs.items():
        if name_ in batch:
            feeds[name_] = np.asarray(batch[name_]).reshape(node.shape)
    feeds.update(opt.host_scalars(mod.optimizer().lr, 1))
    return tr, opt, feeds


@pytest.mark.parametrize("name", ["mlp_sin", "addition_transformer"])
def test_fused_training_graph_computes_the_same(name: str) -> None:
    tr, opt, feeds = _training_graph(name)
    protected = {*tr.grads.values(), *(wb.source for wb in opt.writebacks)}
    fused, remap = fuse_elementwise(tr.graph, protected)
    assert len(fused.nodes) < len(tr.graph.nodes)
    assert any(n.op == "fused" for n in fused.nodes)
    before = evaluate(tr.graph, feeds)
    after = evaluate(fused, feeds)
    for i in [tr.loss, *protected]:
        np.testing.assert_array_equal(after[remap[i]], before[i], err_msg=tr.graph[i].describe())


def test_fused_groups_respect_binding_limit() -> None:
    with tracing() as st:
        xs = [leaf("input", f"x{k}", (4,)) for k in range(12)]
        acc = xs[0]
        for x in xs[1:]:
            acc = tg.relu(acc + x)
    st.graph.outputs = [acc.id]
    fused, _ = fuse_elementwise(st.graph, ())
    for n in fused.nodes:
        assert len(n.inputs) <= 7
    assert sum(n.op == "fused" for n in fused.nodes) >= 2
    feeds = {f"x{k}": np.random.default_rng(k).standard_normal(4) for k in range(12)}
    np.testing.assert_array_equal(evaluate(fused, feeds)[fused.outputs[0]],
                                  evaluate(st.graph, feeds)[acc.id])


def test_protected_nodes_stay_materialised_and_cheap_shared_ones_are_recomputed() -> None:
    with tracing() as st:
        x = leaf("param", "x", (3,))
        a = tg.exp(x)            # read by sin, cos and the backward: cheap, recomputed
        b = tg.sin(a) + tg.cos(a)
        c = tg.neg(b)            # protected: stays
        loss = tg.sum(c * 2.0)
    st.graph.outputs = [loss.id]
    grads = append_grad(st.graph, loss.id)
    fused, remap = fuse_elementwise(st.graph, {c.id, *grads.values()})
    assert a.id not in remap  # every reader computes exp(x) itself: no kernel left for it
    assert remap[c.id] not in {remap[i] for i in grads.values()}
    assert str(fused[remap[c.id]].attrs["program"]) == "neg(add(sin(exp(x0)), cos(exp(x0))))"
    feeds = {"x": np.array([0.1, -0.5, 2.0])}
    before, after = evaluate(st.graph, feeds), evaluate(fused, feeds)
    for i in (c.id, *grads.values()):
        np.testing.assert_array_equal(after[remap[i]], before[i])


def test_a_shared_producer_is_inlined_once_all_its_readers_are_in_the_group() -> None:
    with tracing() as st:
        x = leaf("input", "x", (4,))
        y = leaf("input", "y", (4,))
        a = tg.tanh(x * y)       # two readers, both in the group below
        out = tg.sin(a) * tg.cos(a) + a
    st.graph.outputs = [out.id]
    fused, remap = fuse_elementwise(st.graph, ())
    assert [n.op for n in fused.nodes if n.op not in ("input",)] == ["fused"]
    program = fused[remap[out.id]].attrs["program"]
    assert [n.op for n in program.nodes].count("tanh") == 1  # computed once, not per reader


def test_fusion_runs_through_reshapes_and_broadcasts() -> None:
    with tracing() as st:
        x = leaf("input", "x", (2, 6))
        b = leaf("input", "b", (3,))
        h = tg.reshape(tg.relu(x), (4, 3)) + b      # a reshape between two elementwise ops
        out = tg.reshape(tg.exp(h), (12,)) * 0.5
    st.graph.outputs = [out.id]
    fused, remap = fuse_elementwise(st.graph, ())
    assert sum(n.op == "fused" for n in fused.nodes) == 1
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 6)),
             "b": np.array([0.5, -1.0, 2.0])}
    np.testing.assert_allclose(evaluate(fused, feeds)[remap[out.id]],
                               evaluate(st.graph, feeds)[out.id], rtol=1e-12)


def test_fused_node_prints_its_program() -> None:
    with tracing() as st:
        x = leaf("input", "x", (2, 3))
        y = tg.sigmoid(x * 2.0) + 1.0
    st.graph.outputs = [y.id]
    fused, remap = fuse_elementwise(st.graph, ())
    text = fused[remap[y.id]].describe()
    assert "add_scalar(sigmoid(mul_scalar(x0)))" in text
