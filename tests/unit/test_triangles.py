"""passes/triangles.py: which matmul operands have an exactly-zero triangle, from the op
table's `zeros` rules, and the K band the kernels loop over because of it."""

from __future__ import annotations

import math
import re

import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target
from tensorgrad.compiler import Options, Request, compile_graph
from tensorgrad.ops.linalg import MatmulSpec
from tensorgrad.passes import mark_zero_triangles
from tensorgrad.tensor import leaf, tracing
from tests.harness import Arg, Case, build
from tests.models import demo


def _tags(fn, *shapes) -> list[dict[str, str]]:
    """The zeros_a / zeros_b tags of each matmul of `fn`'s forward graph, in order."""
    with tracing() as st:
        xs = [leaf("input", f"x{i}", s) for i, s in enumerate(shapes)]
        st.graph.outputs = [fn(*xs).id]
    graph, remap = mark_zero_triangles(st.graph, st.graph.outputs)
    assert remap == {n.id: n.id for n in st.graph.nodes}
    return [{k: n.attrs[k] for k in ("zeros_a", "zeros_b") if k in n.attrs}
            for n in graph.nodes if n.op.startswith("matmul")]


def test_causal_attention_tags_the_forward_and_the_four_backward_products() -> None:
    case = Case("scaled_dot_product_attention",
                lambda q, k, v: tg.sum(tg.scaled_dot_product_attention(q, k, v,
                                                                       is_causal=True)),
                [Arg((2, 3, 8, 4)), Arg((2, 3, 8, 4)), Arg((2, 3, 8, 4))])
    b = build(case)
    graph, _ = mark_zero_triangles(b.graph, b.grads.values())
    # p @ v and dS @ k read a triangle above the diagonal, pᵀ @ dO below (its lhs is stored
    # transposed), qᵀ @ dS on its rhs; q @ kᵀ and dO @ vᵀ are dense
    kinds = sorted(f"{k}={v}" for n in graph.nodes for k, v in n.attrs.items()
                   if k in ("zeros_a", "zeros_b"))
    assert kinds == ["zeros_a=above", "zeros_a=above", "zeros_a=below", "zeros_b=above"]


def test_zeros_follow_layout_ops_and_finite_scales_only() -> None:
    def p(s: tg.Tensor) -> tg.Tensor:
        return tg.softmax_causal(s)

    t, d = 6, 3
    assert _tags(lambda s, v: tg.matmul(p(s) * 0.5, v), (2, t, t), (2, t, d)) == \
        [{"zeros_a": "above"}]
    assert _tags(lambda s, v: tg.matmul(-p(s), v), (2, t, t), (2, t, d)) == \
        [{"zeros_a": "above"}]
    # 0 * inf is NaN, not 0: an infinite scale ends the triangle
    assert _tags(lambda s, v: tg.matmul(p(s) * math.inf, v), (2, t, t), (2, t, d)) == [{}]
    # a swap of the last two axes flips it; a permute of the leading axes keeps it
    assert _tags(lambda s, v: tg.matmul(tg.permute(p(s), (0, 2, 1)), v),
                 (2, t, t), (2, t, d)) == [{"zeros_a": "below"}]
    assert _tags(lambda s, v: tg.matmul(tg.permute(p(s), (1, 0, 2, 3)), v),
                 (2, 2, t, t), (2, 2, t, d)) == [{"zeros_a": "above"}]
    assert _tags(lambda s, v: tg.matmul(tg.reshape(p(s), (4, t, t)), v),
                 (2, 2, t, t), (4, t, d)) == [{"zeros_a": "above"}]
    # a reshape that moves the last two axes' elements ends it
    assert _tags(lambda s, v: tg.matmul(tg.reshape(p(s), (2, t // 2, 2 * t)), v),
                 (2, t, t), (2, 2 * t, d)) == [{}]
    # the rhs side, and a where_causal with fill 0 (not with another fill)
    assert _tags(lambda v, s: tg.matmul(v, tg.where_causal(s, 0.0)), (2, d, t), (2, t, t)) == \
        [{"zeros_b": "above"}]
    assert _tags(lambda v, s: tg.matmul(v, tg.where_causal(s, -1.0)), (2, d, t), (2, t, t)) \
        == [{}]


def test_a_flattened_lhs_is_not_tagged() -> None:
    """A rank-2 rhs flattens the lhs's leading axes into rows: its triangles are per slice,
    not in the flattened rows, so only a rank-2 lhs is tagged."""
    t = 5
    assert _tags(lambda s, w: tg.matmul(tg.softmax_causal(s), w), (3, t, t), (t, 4)) == [{}]
    assert _tags(lambda s, w: tg.matmul(tg.softmax_causal(s), w), (t, t), (t, 4)) == \
        [{"zeros_a": "above"}]


@pytest.mark.parametrize("za, zb, want", [
    (None, None, ("0u", "64u")),
    ("above", None, ("0u", "min(m0 + 8u, 64u)")),
    ("below", None, ("m0", "64u")),
    (None, "above", ("n0", "64u")),
    (None, "below", ("0u", "min(n0 + 4u, 64u)")),
    ("below", "above", ("max(m0, n0)", "64u")),
    ("above", "below", ("0u", "min(n0 + 4u, min(m0 + 8u, 64u))")),
])
def test_k_band(za: str | None, zb: str | None, want: tuple[str, str]) -> None:
    spec = MatmulSpec(2, 64, 64, 64, zeros_a=za, zeros_b=zb)
    assert spec.k_band("m0", 8, "n0", 4) == want


def test_compiled_gpu_kernels_of_a_causal_model_loop_over_the_band() -> None:
    """Through the whole pipeline (stitching included): the addition transformer's tiled
    attention products start or end their K loop at the tile's own rows or columns."""
    mod = demo("addition_transformer")
    c = compile_graph(Request("training", mod.AdditionTransformer(), mod.loss_fn, mod.INPUTS,
                              optimizer=mod.optimizer(), seed=1),
                      Options(target=Target(software=False)), until="emit")
    banded = re.compile(r"for \(var k0? = (?!0u;|lid;)|for \(var k0? = [^;]*; k0? < min\(")
    loops = [k.label for k in c.kernels if banded.search(k.wgsl)]
    layers = sum(1 for n in c.graph.nodes if n.op == "softmax_causal_last")
    assert layers == 3
    assert len(loops) == 4 * layers, loops
