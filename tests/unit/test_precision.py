"""Mixed precision without a device: which nodes the store_half pass makes f16, the loss
scaling it appends, the buffer plan's 2-byte elements (a view never converts), the f16 text
rewrite of kernels, and the reference's f16 rounding (fusion changes no bit of it)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.codegen.storage import half_storage
from tensorgrad.compiler import Options, Request, compile_graph
from tensorgrad.gpu.interface import AdapterInfo
from tensorgrad.ir import Graph
from tensorgrad.passes import fuse_elementwise, stitch_kernels
from tensorgrad.plan import plan_buffers
from tensorgrad.precision import LOSS_SCALE, LOSS_UNSCALE, LossScale, LossScaler, check_precision
from tensorgrad.reference import evaluate
from tests.models import TinyMLP


def _mlp(precision: str, until: str = "passes after autograd"):
    return compile_graph(Request("training", TinyMLP(n_in=3, hidden=16), lambda m, x, y:
                                 tg.mean(tg.square(m(x) - y)), {"x": (32, 3), "y": (32, 1)},
                                 tg.optim.Adam(lr=1e-2), seed=0),
                         Options(precision=precision), until=until)


def test_mixed_precision_stores_activations_as_f16_and_keeps_masters_f32() -> None:
    c = _mlp("mixed")
    g = c.graph
    kinds = {(n.op, n.dtype) for n in g.nodes}
    assert ("matmul", "f16") in kinds  # the forward's matmuls and dx's
    assert all(n.dtype == "f32" for n in g.nodes if n.op in ("param", "input"))
    assert all(g[i].dtype == "f32" for i in c.grads.values())
    assert all(n.dtype == "f32" for n in g.nodes if n.op in ("sum_to_shape", "mean_last"))
    # a weight gradient's matmul stays f32 (it feeds only the gradient), its operands f16
    for name in ("l1.W", "l2.W"):
        unscale = g[c.grads[name]]
        assert unscale.op == "mul" and g[unscale.inputs[1]].attrs["name"] == LOSS_UNSCALE
        made = g[unscale.inputs[0]]
        assert made.op == "matmul" and made.dtype == "f32", made
    assert {n.attrs["name"] for n in g.nodes if n.op == "input"} >= {LOSS_SCALE, LOSS_UNSCALE}
    f32 = _mlp("f32").graph
    assert all(n.dtype != "f16" for n in f32.nodes)
    assert not {LOSS_SCALE, LOSS_UNSCALE} & set(f32.inputs)


def test_mixed_gradients_are_the_f32_gradients_within_f16_rounding() -> None:
    """The reference of the mixed graph at loss scale 2^16 gives the f32 graph's gradients
    to f16 accuracy: scaling and unscaling cancel."""
    rng = np.random.default_rng(0)
    f32, mixed = _mlp("f32"), _mlp("mixed")
    feeds = {n: rng.standard_normal(p.shape).astype(np.float32) * 0.5
             for n, p in f32.graph.params.items()}
    feeds |= {"x": rng.standard_normal((32, 3)), "y": rng.standard_normal((32, 1))}
    want = evaluate(f32.graph, feeds)
    got = evaluate(mixed.graph, {**feeds, LOSS_SCALE: 2.0 ** 16, LOSS_UNSCALE: 2.0 ** -16})
    assert got[mixed.loss] == pytest.approx(want[f32.loss], rel=2e-3)
    for name, gid in f32.grads.items():
        np.testing.assert_allclose(got[mixed.grads[name]], want[gid], rtol=1e-2, atol=1e-3)


def test_fusion_and_stitching_change_no_bit_of_the_mixed_reference() -> None:
    c = _mlp("mixed")
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(p.shape).astype(np.float32)
             for n, p in c.graph.params.items()}
    feeds |= {"x": rng.standard_normal((32, 3)), "y": rng.standard_normal((32, 1)),
              LOSS_SCALE: 1024.0, LOSS_UNSCALE: 1 / 1024}
    roots = set(c.grads.values()) | {c.loss}
    fused, r1 = fuse_elementwise(c.graph, roots)
    stitched, r2 = stitch_kernels(fused, {r1[i] for i in roots})
    assert any(n.op == "fused" and any(p.dtype == "f16" for p in n.attrs["program"].nodes)
               for n in stitched.nodes)
    want, got = evaluate(c.graph, feeds), evaluate(stitched, feeds)
    for i in roots:
        np.testing.assert_array_equal(got[r2[r1[i]]], want[i])


def test_f16_buffers_take_two_bytes_an_element_rounded_to_four() -> None:
    g = Graph()
    x = g.add("input", (), {"name": "x"}, (5,), "f32")
    h = g.add("mul_scalar", (x.id,), {"scalar": 2.0}, (5,), "f16")
    y = g.add("mul_scalar", (h.id,), {"scalar": 2.0}, (5,), "f32")
    g.outputs = [y.id]
    plan = plan_buffers(g)
    assert plan.buffers[plan.node_buffer[h.id]].size == 12  # 10 bytes, rounded up


def test_a_view_never_converts_its_input() -> None:
    """A reshape (or contiguous slice) stored in another dtype than its input needs a kernel
    of its own: reading the input's bytes as they are would reinterpret f32 bits as f16."""
    g = Graph()
    x = g.add("input", (), {"name": "x"}, (4, 2), "f32")
    r = g.add("reshape", (x.id,), {"shape": (8,)}, (8,), "f16")
    y = g.add("mul_scalar", (r.id,), {"scalar": 2.0}, (8,), "f32")
    g.outputs = [y.id]
    from tensorgrad.compiler import LAYOUT_OPS

    assert r.id not in plan_buffers(g, layout_ops=LAYOUT_OPS).views
    same = Graph(nodes=[replace(n, dtype="f32") for n in g.nodes], outputs=g.outputs)
    assert r.id in plan_buffers(same, layout_ops=LAYOUT_OPS).views


def test_half_storage_converts_reads_and_writes_and_refuses_in_place_updates() -> None:
    text = "let a = in0[in1[i]];\n  out[i] = a + in2[i] * out[0];"
    got = half_storage(text, {0}, (), True, "op")
    assert got.startswith("enable f16;\n")
    assert "f32(in0[in1[i]])" in got and "in2[i] *" in got and "f32(in2" not in got
    assert "out[i] = f16(a + in2[i] * f32(out[0]));" in got
    assert half_storage(text, (), (), False) == text
    assert "vec4<f32>(in0[q])" in half_storage("let v = in0[q];", {0}, {0}, False)
    with pytest.raises(ValueError, match=r"the 'acc' kernel updates `out` in place"):
        half_storage("out[i] += 1.0f;", (), (), True, "acc")


def test_loss_scaler_follows_grad_scaler_rules() -> None:
    s = LossScaler(LossScale(init_scale=8.0, growth_factor=2.0, backoff_factor=0.25,
                             growth_interval=2))
    assert s.scalars() == {LOSS_SCALE: 8.0, LOSS_UNSCALE: 0.125}
    s.update(overflow=False)
    s.update(overflow=True)
    assert (s.scale, s.skipped) == (2.0, 1)
    s.update(overflow=False)
    s.update(overflow=False)
    assert s.scale == 4.0
    for bad in ({"init_scale": 0}, {"growth_factor": 0.5}, {"growth_interval": 0},
                {"init_scale": float("inf")}):
        with pytest.raises(ValueError, match=r"LossScale: \w+ must be"):
            LossScale(**bad)


@pytest.mark.parametrize(("info", "named"), [
    (AdapterInfo(vendor="google", architecture="swiftshader", backend="browser"),
     r"the device on google swiftshader \(browser\)"),  # a browser's SwiftShader: no description
    (AdapterInfo(vendor="llvmpipe", description="llvmpipe Mesa 22.3.6", backend="Vulkan",
                 features=frozenset({"timestamp-query"})),
     r"the device on llvmpipe Mesa 22\.3\.6 \(Vulkan\) .*optional features: timestamp-query\)"),
])
def test_mixed_on_an_adapter_without_shader_f16_names_it(info: AdapterInfo, named: str) -> None:
    with pytest.raises(tg.FeatureError, match=r"precision='mixed' needs the WebGPU feature "
                       rf"'shader-f16' .*{named}"):
        check_precision("mixed", info)
    assert check_precision("f32", info) == "f32"
    assert check_precision("mixed", replace(info, features=frozenset({"shader-f16"}))) == "mixed"
