"""Buffer planning: kinds, liveness reuse, limits, writebacks, and a simulated execution."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad import optim
from tensorgrad.autograd import append_grad
from tensorgrad.errors import DeviceLimitError, PlanError
from tensorgrad.gpu.interface import DeviceLimits
from tensorgrad.ir import LEAF_OPS, Graph
from tensorgrad.ops import optim_ops
from tensorgrad.ops.registry import OPS
from tensorgrad.plan import BufferPlan, check_plan, plan_buffers
from tensorgrad.reference import evaluate
from tensorgrad.tensor import Tensor, leaf, tracing

GPU_NP = {"f32": np.float32, "i32": np.int32, "bool": np.uint32}


def training_graph(depth: int = 4, width: int = 6, optimizer=None, arena: bool = False):
    """An MLP-ish chain with varying widths, a bool mask, a capture and an optimizer."""
    with tracing() as st:
        x = leaf("input", "x", (5, width))
        y = leaf("input", "y", (5, 2))
        h = x
        for k in range(depth):
            w = leaf("param", f"w{k}", (h.shape[1], width + k % 3))
            b = leaf("param", f"b{k}", (width + k % 3,))
            z = tg.matmul(h, w) + b
            h = tg.where(tg.greater(z, 0.0), z, z * 0.1) if k % 2 else tg.tanh(z)
        out = tg.matmul(h, leaf("param", "head", (h.shape[1], 2)))
        loss = tg.mean(tg.square(out - y))
    graph = st.graph
    graph.outputs = [loss.id]
    graph.captures["hidden"] = h.id
    grads = append_grad(graph, loss.id)
    opt = optim.append_optimizer(graph, grads, optimizer or optim.AdamW(0.01), arena=arena)
    return graph, grads, opt


def feeds_for(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for kind in ("param", "input"):
        for name, node in graph.leaves(kind).items():
            feeds[name] = rng.standard_normal(node.shape).astype(np.float32) * 0.5
    feeds.update({optim.ADAM_LRT: np.float32(0.01), optim.ADAM_SHRINK: np.float32(0.999)})
    return feeds


def simulate(graph: Graph, plan: BufferPlan, feeds: dict) -> dict[int, np.ndarray]:
    """Run the graph with one bytearray per planned buffer (pooled ones start as NaN
    garbage), each node reading its inputs from and writing its output into its bytes (its
    buffer at its offset), views and packs running nothing, the zero fills copied.
    Returns the value of every node that must survive the step, read back at the end."""
    buffers = [bytearray(np.full(b.size // 4, np.nan, np.float32).tobytes()) if b.pooled
               else bytearray(b.size) for b in plan.buffers]

    def view(node_id: int) -> np.ndarray:
        node = graph[node_id]
        arr = np.frombuffer(buffers[plan.node_buffer[node_id]], GPU_NP[node.dtype],
                            node.size, plan.node_offset[node_id])
        return arr.reshape(node.shape)

    def write(node_id: int, value) -> None:
        node = graph[node_id]
        data = np.ascontiguousarray(np.asarray(value).astype(GPU_NP[node.dtype])).tobytes()
        offset = plan.node_offset[node_id]
        buffers[plan.node_buffer[node_id]][offset: offset + len(data)] = data

    fills = sorted(plan.zero_fills, key=lambda f: f.at)
    for node in graph.nodes:
        while fills and fills[0].at < node.id:  # as the runtime copies them
            f = fills.pop(0)
            buffers[f.dst][f.offset: f.offset + f.size] = bytes(f.size)
        if node.op in LEAF_OPS:
            name = node.attrs["name"]
            write(node.id, feeds[name] if name in feeds else
                  np.full(node.shape, node.attrs.get("init", 0.0)))
            continue
        if node.id in plan.no_kernel:
            continue  # a view reads its root's bytes, a pack's inputs were written in place
        args = [view(i).astype(bool) if graph[i].dtype == "bool" else view(i).copy()
                for i in node.inputs]
        write(node.id, OPS[node.op].ref(args, node))
    keep = {*graph.outputs, *graph.captures.values(), *(w.source for w in plan.writebacks),
            *plan.persistent}
    return {i: view(i).copy() for i in keep}


def test_simulated_execution_with_reuse_matches_evaluate() -> None:
    graph, grads, opt = training_graph(depth=6)
    plan = plan_buffers(graph, grads=grads, writebacks=opt.writebacks)
    assert plan.peak_bytes < plan.unpooled_bytes * 0.7
    assert max(len(b.nodes) for b in plan.buffers) >= 5  # heavy reuse
    feeds = feeds_for(graph)
    want = evaluate(graph, feeds)
    got = simulate(graph, plan, feeds)
    for node_id, value in got.items():
        np.testing.assert_allclose(value, want[node_id], rtol=1e-6, atol=1e-7,
                                   err_msg=graph[node_id].describe())
    for name, gid in grads.items():  # gradients outlive the step, in the pool
        assert gid in got and gid in plan.persistent
        assert plan.buffers[plan.param_grads[name]].pooled


VIEWS = {"reshape": OPS["reshape"]}


@pytest.mark.parametrize("optimizer", [optim.AdamW(0.01, clip_grad_norm=1.0),
                                       optim.SGD(0.1, momentum=0.9)])
def test_a_step_with_its_gradient_arena_in_the_pool_matches_evaluate(optimizer) -> None:
    """The optimizer's arenas and slices (views and packs, no kernel): the gradients are
    written into the arena's block of the pool, whose padding between them (NaN garbage
    here, as a pooled buffer holds what earlier tensors left) is zeroed before the norm and
    the update read the whole arena."""
    from tensorgrad.compiler import LAYOUT_OPS

    graph, grads, opt = training_graph(depth=5, width=7, optimizer=optimizer, arena=True)
    plan = plan_buffers(graph, grads=grads, writebacks=opt.writebacks, layout_ops=LAYOUT_OPS)
    assert plan.packed and plan.zero_fills
    pack = next(p for p in plan.packed if graph[graph[p].inputs[0]].op != "param")
    assert plan.buffers[plan.node_buffer[pack]].pooled
    assert_live_bytes_apart(graph, plan, grads)
    feeds = feeds_for(graph)
    want = evaluate(graph, feeds)
    got = simulate(graph, plan, feeds)
    assert set(grads.values()) <= set(got)
    for node_id, value in got.items():
        np.testing.assert_allclose(value, want[node_id], rtol=1e-6, atol=1e-7,
                                   err_msg=graph[node_id].describe())


def test_a_zero_fill_opens_the_step_unless_a_node_before_its_pack_has_bytes_there() -> None:
    """A pack's padding is zeroed at the step's start (before any compute pass, so its copy
    splits none) where no node before the pack has bytes there, else once the nodes before
    the pack have run; either way the simulated step (pool starting as NaN garbage) gives
    the reference values."""
    from tensorgrad.compiler import LAYOUT_OPS

    seen = set()
    for depth, width in [(5, 7), (3, 5), (8, 3)]:
        graph, grads, opt = training_graph(depth=depth, width=width, arena=True,
                                           optimizer=optim.AdamW(0.01, clip_grad_norm=1.0))
        plan = plan_buffers(graph, grads=grads, writebacks=opt.writebacks,
                            layout_ops=LAYOUT_OPS)
        for f in plan.zero_fills:
            pack = next(p for p in plan.packed if plan.node_buffer[p] == f.dst and
                        plan.node_offset[p] <= f.offset < plan.node_offset[p]
                        + graph[p].buffer_bytes)
            before = [i for i in range(pack) if i not in plan.views and
                      plan.node_buffer[i] == f.dst and plan.node_offset[i] < f.offset + f.size
                      and plan.node_offset[i] + graph[i].buffer_bytes > f.offset]
            assert f.at == (pack if before else 0), (f, pack, before)
            seen.add(f.at == 0)
        want = evaluate(graph, feeds_for(graph))
        for node_id, value in simulate(graph, plan, feeds_for(graph)).items():
            np.testing.assert_allclose(value, want[node_id], rtol=1e-6, atol=1e-7,
                                       err_msg=graph[node_id].describe())
    assert seen == {True, False}


def test_reshapes_are_views_of_their_input_unless_they_need_their_own_buffer() -> None:
    with tracing() as st:
        x = leaf("input", "x", (4, 6))
        w = leaf("param", "w", (6, 6))
        h = tg.tanh(tg.matmul(x, w))
        flat = tg.reshape(tg.reshape(h, (24,)), (2, 12))     # a chain of two views
        other = tg.tanh(tg.matmul(x, w) * 2.0)                 # allocated while flat lives
        kept = tg.reshape(other, (24,))                         # captured: its own buffer
        loss = tg.mean(tg.reshape(flat, (24,)) * kept)
    graph = st.graph
    graph.outputs = [loss.id]
    graph.captures["kept"] = kept.id
    grads = append_grad(graph, loss.id)
    plan = plan_buffers(graph, grads=grads, layout_ops=VIEWS)
    check_plan(graph, plan)
    reshapes = [n.id for n in graph.nodes if n.op == "reshape"]
    assert kept.id not in plan.views and set(plan.views) == set(reshapes) - {kept.id}
    root = plan.views[flat.id]
    assert root == h.id and plan.node_buffer[flat.id] == plan.node_buffer[h.id]
    assert plan.node_buffer[other.id] != plan.node_buffer[h.id]  # h lives while flat does
    feeds = feeds_for(graph)
    want = evaluate(graph, feeds)
    got = simulate(graph, plan, feeds)
    np.testing.assert_allclose(got[loss.id], want[loss.id], rtol=1e-6)
    np.testing.assert_allclose(got[kept.id], want[kept.id], rtol=1e-6)
    without = plan_buffers(graph, grads=grads)
    assert not without.views and plan.peak_bytes <= without.peak_bytes


def lifetimes(graph: Graph, plan: BufferPlan, grads: dict[str, int]) -> dict[int, tuple]:
    """{node that holds bytes: (first step, last step)}, worked out here from the graph
    alone: a node lives from its step to its last reader's; reading a view reads its
    source, reading a pack reads what it holds; leaves, outputs, captures, gradients and
    writeback sources live past the last step."""
    held = {x: p for p in plan.packed for x in graph[p].inputs}
    last = {n.id: n.id for n in graph.nodes}
    for n in reversed(graph.nodes):  # readers come after: a view's end is known first
        for i in n.inputs:
            last[i] = max(last[i], last[n.id] if n.id in plan.views or n.id in plan.packed
                          else n.id)
    for n in graph.nodes:
        if n.id in held:
            last[n.id] = max(last[n.id], last[held[n.id]])
    forever = {*graph.outputs, *graph.captures.values(), *grads.values(),
               *(w.source for w in plan.writebacks),
               *(n.id for n in graph.nodes if n.op in LEAF_OPS)}
    end = len(graph.nodes)
    return {n.id: (n.id, end if n.id in forever else last[n.id]) for n in graph.nodes
            if n.id not in plan.views and n.id not in plan.packed}


def assert_live_bytes_apart(graph: Graph, plan: BufferPlan, grads: dict[str, int]) -> None:
    """No two nodes alive at the same step share a byte of one buffer, and no kernel binds
    its output's buffer as one of its inputs."""
    spans = lifetimes(graph, plan, grads)
    by_buffer: dict[int, list[int]] = {}
    for i in spans:
        by_buffer.setdefault(plan.node_buffer[i], []).append(i)
    for buf, nodes in by_buffer.items():
        for a, b in itertools.combinations(nodes, 2):
            (s1, e1), (s2, e2) = spans[a], spans[b]
            lo1, lo2 = plan.node_offset[a], plan.node_offset[b]
            assert not (s1 <= e2 and s2 <= e1 and lo1 < lo2 + graph[b].nbytes
                        and lo2 < lo1 + graph[a].nbytes), \
                f"buffer #{buf}: %{a} and %{b} share bytes while both alive"
    for node in graph.nodes:
        if node.op not in LEAF_OPS and node.id not in plan.no_kernel:
            *ins, out = plan.bindings(node)
            assert out not in ins, node.describe()


def test_no_overlap_and_no_kernel_reads_its_output() -> None:
    graph, grads, opt = training_graph(depth=5)
    plan = plan_buffers(graph, grads=grads, writebacks=opt.writebacks)
    check_plan(graph, plan)
    assert_live_bytes_apart(graph, plan, grads)


def chain(depth: int, with_grad: bool) -> tuple[Graph, dict[str, int]]:
    with tracing() as st:
        h = leaf("param", "p", (64,))
        for _ in range(depth):
            h = tg.tanh(h) * 1.5
        loss = tg.sum(h)
    graph = st.graph
    graph.outputs = [loss.id]
    return graph, (append_grad(graph, loss.id) if with_grad else {})


def test_reuse_lowers_peak_bytes_on_a_deep_chain() -> None:
    shallow = plan_buffers(chain(5, False)[0])
    deep = plan_buffers(chain(50, False)[0])
    assert deep.peak_bytes == shallow.peak_bytes  # O(1) in depth for a forward chain
    assert deep.peak_bytes < deep.unpooled_bytes / 20
    graph, grads = chain(50, True)
    trained = plan_buffers(graph, grads=grads)
    assert trained.peak_bytes < trained.unpooled_bytes / 2


def test_kinds_and_named_buffers() -> None:
    graph, grads, opt = training_graph(depth=2)
    plan = plan_buffers(graph, grads=grads, writebacks=opt.writebacks)
    kinds = {b.kind for b in plan.buffers}
    assert kinds == {"param", "input", "state", "intermediate", "output", "capture"}
    assert set(plan.params) == set(graph.params)
    assert set(plan.inputs) == {"x", "y", optim.ADAM_LRT, optim.ADAM_SHRINK}
    assert set(plan.states) == set(opt.states)
    assert plan.buffers[plan.states["adam_mv_w0"]].init == 0.0
    assert plan.buffers[plan.captures["hidden"]].kind == "capture"
    assert plan.buffers[plan.outputs[0]].kind == "output"
    for wb in plan.writebacks:  # copied at the end of the step: alive until then
        assert plan.buffers[wb.src].pooled and wb.source in plan.persistent
        assert wb.src_offset == plan.node_offset[wb.source] and wb.src_offset % 256 == 0
        assert wb.size == plan.buffers[wb.dst].size
    for name, gid in grads.items():  # read after the step (download_param_grads)
        assert plan.buffers[plan.param_grads[name]].pooled and gid in plan.persistent
    for b in plan.buffers:
        assert b.size >= 4 and b.size % 4 == 0
        assert b.pooled == (b.kind == "intermediate")
    text = str(plan)
    assert "buffer plan:" in text and "'w0'" in text and "writeback" in text


def test_allocation_order_and_immediate_release() -> None:
    with tracing() as st:
        x = leaf("input", "x", (8,))
        a = tg.exp(x)          # read only by b
        b = tg.tanh(a)         # must not take a's buffer
        tg.sin(b)              # nobody reads it: released at once
        d = tg.cos(b)          # takes the unread node's buffer
        e = tg.sum(d)
    graph = st.graph
    graph.outputs = [e.id]
    plan = plan_buffers(graph)
    nb = plan.node_buffer
    assert nb[b.id] != nb[a.id]
    assert nb[b.id + 1] == nb[a.id]          # sin reuses a's released buffer
    assert nb[d.id] == nb[b.id + 1]          # and cos reuses sin's right away
    assert plan.buffers[nb[e.id]].size == 4  # 0-d: minimum 4 bytes


def test_a_chain_of_growing_tensors_alternates_between_two_buffers() -> None:
    """Each tensor is read by the next (so never in its buffer): two buffers, each as large
    as the largest tensor it ever holds, not one per size."""
    with tracing() as st:
        x = leaf("input", "x", (4,))
        h = tg.exp(x)
        for n in (8, 16, 32):
            h = tg.exp(tg.broadcast_to(tg.reshape(h, (1, -1)), (n // h.shape[-1], h.shape[-1])))
            h = tg.reshape(h, (n,))
        out = tg.sum(h)
    graph = st.graph
    graph.outputs = [out.id]
    plan = plan_buffers(graph)
    pooled = [b for b in plan.buffers if b.pooled]
    assert [b.size for b in pooled] == [128, 128]  # two buffers, not one per size
    assert plan.peak_bytes == 16 + 2 * 128 + 4


def test_oversize_param_is_named() -> None:
    with tracing() as st:
        w = leaf("param", "big.w", (16, 32))
        tg.sum(w)
    limits = DeviceLimits(max_storage_buffer_binding_size=1024, max_buffer_size=4096)
    with pytest.raises(DeviceLimitError, match=r"param 'big.w' f32\[16, 32\] needs 2,048 bytes, "
                       r"more than the device's max_storage_buffer_binding_size of 1,024 bytes;"
                       r" use a smaller batch size"):
        plan_buffers(st.graph, limits=limits)


def test_oversize_intermediate_names_the_op_and_shape() -> None:
    with tracing() as st:
        x = leaf("input", "x", (64, 8))
        w = leaf("param", "w", (8, 64))
        out = tg.sum(tg.matmul(x, w))
    st.graph.outputs = [out.id]
    limits = DeviceLimits(max_storage_buffer_binding_size=1 << 20, max_buffer_size=8192)
    with pytest.raises(DeviceLimitError, match=r"matmul: the result of matmul \(%2\), "
                       r"f32\[64, 64\] needs 16,384 bytes, more than the device's "
                       r"max_buffer_size of 8,192") as err:
        plan_buffers(st.graph, limits=limits)
    assert "test_plan.py" in err.value.site  # points at the user's line


def test_writeback_errors() -> None:
    graph, grads, opt = training_graph(depth=1)
    src = opt.writebacks[-1].source
    with pytest.raises(PlanError, match="the graph has no param of that name"):
        plan_buffers(graph, grads=grads, writebacks=[(src, "nope", "param")])
    with pytest.raises(PlanError, match=r"source is f32\[\d+, \d+\], destination is"):
        plan_buffers(graph, grads=grads, writebacks=[(opt.writebacks[1].source, "head",
                                                      "param")])
    with pytest.raises(PlanError, match="kind must be 'param' or 'state'"):
        plan_buffers(graph, grads=grads, writebacks=[(src, "head", "output")])
    with pytest.raises(PlanError, match="expected \\(source node id, dest name, kind\\)"):
        plan_buffers(graph, grads=grads, writebacks=[(10**6, "head", "param")])
    head = graph.params["head"].id
    with pytest.raises(PlanError, match="copies a buffer onto itself"):
        plan_buffers(graph, grads=grads, writebacks=[(head, "head", "param")])


def test_self_check_catches_overlap() -> None:
    graph, _ = chain(3, False)
    plan = plan_buffers(graph)
    tanh1 = next(n.id for n in graph.nodes if n.op == "tanh")
    user = tanh1 + 1  # mul_scalar reading tanh1
    pooled = plan.node_buffer[tanh1]
    # Put the next node's output into the buffer its input still occupies.
    plan.node_buffer[user] = pooled
    plan.buffers[pooled] = type(plan.buffers[pooled])(
        **{**plan.buffers[pooled].__dict__,
           "nodes": tuple(sorted({*plan.buffers[pooled].nodes, user}))})
    with pytest.raises(PlanError, match="lifetime overlap|would read and write"):
        check_plan(graph, plan)


def test_grads_must_be_nodes() -> None:
    graph, _ = chain(2, False)
    with pytest.raises(PlanError, match="gradient of 'p' is not a node"):
        plan_buffers(graph, grads={"p": 999})


def test_tensor_values_survive_when_outputs_are_leaves() -> None:
    with tracing() as st:
        p = leaf("param", "p", (3,))
        t = Tensor(st.graph, p.id)
    st.graph.outputs = [t.id]
    plan = plan_buffers(st.graph)
    assert plan.outputs == [plan.params["p"]]


def test_too_many_bindings_for_one_kernel() -> None:
    with tracing() as st:
        xs = [leaf("input", f"x{k}", ()) for k in range(5)]
        out = optim_ops.grad_norm_total([(x, "raw") for x in xs])
    st.graph.outputs = [out.id]
    plan_buffers(st.graph)
    with pytest.raises(DeviceLimitError, match=r"grad_norm_total: %5 binds 5 inputs and its "
                       r"output, more than the device's max_storage_buffers_per_shader_stage"):
        plan_buffers(st.graph, limits=DeviceLimits(max_storage_buffers_per_shader_stage=4))


# ---- the packed pool ---------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["f32", "mixed"])
@pytest.mark.parametrize("name", ["mlp", "transformer", "cnn", "gpt"])
def test_compiled_training_steps_keep_live_bytes_apart(name: str, precision: str) -> None:
    """The bench models' training steps (their optimizers, arenas, views; f16 activations
    and f32 gradients in mixed precision), planned for the browser's default limits: no two
    tensors alive at one step share bytes, offsets are aligned, buffers within the limit."""
    from bench.models import make_bench
    from tensorgrad.compiler import Options, Request, compile_graph

    b = make_bench(name, quick=True)
    c = compile_graph(Request("training", b.model, b.loss, b.inputs, b.optimizer, seed=0),
                      Options(precision=precision), until="plan")
    graph, plan = c.graph, c.plan
    assert plan is not None
    assert_live_bytes_apart(graph, plan, c.grads)
    pooled = [buf for buf in plan.buffers if buf.pooled]
    assert sum(len(buf.nodes) for buf in pooled) > 2 * len(pooled)  # shared buffers
    for buf in pooled:
        assert buf.size <= DeviceLimits().max_buffer_size
        assert all(plan.node_offset[i] % 256 == 0 for i in buf.nodes
                   if i not in {x for p in plan.packed for x in graph[p].inputs})


def test_f16_tensors_share_a_freed_f32_buffer_at_offsets() -> None:
    """An f32 intermediate's bytes, once it is dead, hold two f16 tensors alive together:
    the pool needs the f32 tensor's bytes (and a 0-d sum elsewhere), not a buffer for each
    f16 tensor as when every tensor took a whole buffer."""
    n = 1024
    g = Graph()
    x = g.add("input", (), {"name": "x"}, (n,), "f32")
    a = g.add("exp", (x.id,), {}, (n,), "f32")
    s = g.add("sum_last", (a.id,), {}, (), "f32")
    p = g.add("mul_scalar", (x.id,), {"scalar": 2.0}, (n,), "f16")
    q = g.add("mul_scalar", (x.id,), {"scalar": 3.0}, (n,), "f16")
    r = g.add("add", (p.id, q.id), {}, (n,), "f16")
    out = g.add("add", (r.id, s.id), {}, (n,), "f32")
    g.outputs = [out.id]
    plan = plan_buffers(g)
    check_plan(g, plan)
    pooled = sorted(buf.size for buf in plan.buffers if buf.pooled)
    assert plan.node_buffer[p.id] == plan.node_buffer[q.id] == plan.node_buffer[a.id]
    assert {plan.node_offset[p.id], plan.node_offset[q.id]} == {0, 2 * n}
    assert pooled == [2 * n + 4, 4 * n]  # r (f16) beside s (4 bytes), and a's bytes
    assert plan.peak_bytes == 4 * n + 4 * n + (2 * n + 4) + 4 * n  # x, out, the two pooled


def test_the_pool_splits_into_buffers_within_max_buffer_size() -> None:
    graph, grads, opt = training_graph(depth=6, width=24)
    roomy = plan_buffers(graph, grads=grads, writebacks=opt.writebacks)
    limits = DeviceLimits(max_storage_buffer_binding_size=6144, max_buffer_size=6144)
    tight = plan_buffers(graph, grads=grads, writebacks=opt.writebacks, limits=limits)
    pooled = [b for b in tight.buffers if b.pooled]
    assert max(b.size for b in roomy.buffers if b.pooled) > 6144
    assert all(b.size <= 6144 for b in pooled) and len(pooled) > 2
    assert_live_bytes_apart(graph, tight, grads)
    feeds = feeds_for(graph)
    want = evaluate(graph, feeds)
    for node_id, value in simulate(graph, tight, feeds).items():
        np.testing.assert_allclose(value, want[node_id], rtol=1e-6, atol=1e-7)
