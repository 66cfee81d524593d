"""scaled_dot_product_attention: forward vs PyTorch, gradients vs autograd and finite
differences, the kernels it traces to, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorgrad as tg
from tensorgrad import ShapeError
from tests.harness import Arg, Case, build, run_reference


def sdpa(causal: bool = False, scale: float | None = None):
    def tg_fn(q, k, v):
        return tg.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    def torch_fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return tg_fn, torch_fn


def heads_block(causal: bool):
    """x [B, T, D] through q/k/v projections split into 2 heads: the permutes of split_heads
    feed the attention kernels (stitched into their reads)."""
    def tg_fn(x, wq, wk, wv):
        q, k, v = (tg.split_heads(x @ wt, 2) for wt in (wq, wk, wv))
        return tg.merge_heads(tg.scaled_dot_product_attention(q, k, v, is_causal=causal)) * x

    def torch_fn(x, wq, wk, wv):
        b, t, d = x.shape
        q, k, v = ((x @ wt).reshape(b, t, 2, d // 2).transpose(1, 2) for wt in (wq, wk, wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return o.transpose(1, 2).reshape(b, t, d) * x
    return tg_fn, torch_fn


def _case(name: str, fns, shapes, **kw) -> Case:
    tg_fn, torch_fn = fns
    return Case("scaled_dot_product_attention", tg_fn, [Arg(s) for s in shapes],
                torch_fn=torch_fn, name=name, **kw)


CASES = [
    _case("plain", sdpa(), [(2, 3, 5, 4)] * 3),
    _case("causal", sdpa(True), [(2, 2, 6, 8)] * 3),
    _case("causal-odd-dims", sdpa(True), [(3, 5, 3), (3, 5, 3), (3, 5, 5)]),
    _case("cross", sdpa(), [(2, 3, 4), (2, 7, 4), (2, 7, 6)]),
    _case("rank2-scale", sdpa(scale=0.7), [(5, 4), (6, 4), (6, 2)]),
    _case("heads-causal", heads_block(True), [(2, 5, 8), (8, 8), (8, 8), (8, 8)]),
    _case("heads", heads_block(False), [(2, 4, 4), (4, 4), (4, 4), (4, 4)]),
    _case("causal-70", sdpa(True), [(2, 70, 16)] * 3, fd=False, rtol=1e-3, atol=1e-4),
]


def _ops(fn, shapes) -> list[str]:
    b = build(Case("sdpa", fn, [Arg(s) for s in shapes], grad=False))
    return [n.op for n in b.graph.nodes]


def test_traces_to_two_matmuls_and_one_softmax() -> None:
    ops = _ops(sdpa(True)[0], [(2, 3, 8, 4)] * 3)
    assert ops.count("matmul_batched") == 2 and ops.count("softmax_causal_last") == 1, ops
    ops = _ops(sdpa()[0], [(2, 3, 8, 4)] * 3)
    assert ops.count("log_softmax_last") == 1 and "softmax_causal_last" not in ops, ops


def test_causal_rows_ignore_later_keys() -> None:
    """Changing keys/values after row i leaves output row i as it was."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((6, 4)).astype(np.float32) for _ in range(3))
    k2, v2 = k.copy(), v.copy()
    k2[3:] += 5.0
    v2[3:] -= 2.0
    outs = []
    for kk, vv in ((k, v), (k2, v2)):
        b = build(Case("sdpa", sdpa(True)[0], [Arg((6, 4), gen=q), Arg((6, 4), gen=kk),
                                                Arg((6, 4), gen=vv)], grad=False))
        outs.append(run_reference(b)[b.out])
    np.testing.assert_allclose(outs[0][:3], outs[1][:3], rtol=1e-6)
    assert not np.allclose(outs[0][3:], outs[1][3:])


def test_default_scale_is_one_over_sqrt_d() -> None:
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((3, 9)).astype(np.float32) for _ in range(3))
    outs = []
    for scale in (None, 1 / 3):
        b = build(Case("sdpa", sdpa(scale=scale)[0], [Arg((3, 9), gen=x) for x in (q, k, v)],
                       grad=False))
        outs.append(run_reference(b)[b.out])
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("shapes, kw, match", [
    ([(2, 4, 8), (2, 4, 6), (2, 4, 8)], {},
     r"scaled_dot_product_attention: q \[2, 4, 8\] and k \[2, 4, 6\] must have the same last"),
    ([(2, 4, 8), (3, 4, 8), (3, 4, 8)], {},
     r"q \[2, 4, 8\] and k \[3, 4, 8\] must have the same leading \(batch, head\) dims"),
    ([(2, 4, 8), (2, 5, 8), (2, 4, 8)], {},
     r"k \[2, 5, 8\] and v \[2, 4, 8\] must have the same sequence length"),
    ([(8,), (4, 8), (4, 8)], {}, r"q must have rank >= 2 \(\[\.\.\., T, d\]\), got shape \[8\]"),
    ([(3, 8), (5, 8), (5, 8)], {"is_causal": True},
     r"is_causal needs as many queries as keys, got q \[3, 8\] and k \[5, 8\]"),
    ([(3, 8)] * 3, {"scale": float("inf")}, r"scale must be a finite Python number or None"),
    ([(3, 8)] * 3, {"is_causal": 1}, r"is_causal must be a bool, got 1"),
])
def test_errors(shapes, kw, match) -> None:
    def fn(q, k, v):
        return tg.scaled_dot_product_attention(q, k, v, **kw)
    with pytest.raises(ShapeError, match=match):
        build(Case("err", fn, [Arg(s) for s in shapes], grad=False))


def test_non_tensor_and_int_inputs_are_refused() -> None:
    with pytest.raises(ShapeError, match=r"k must be a Tensor, got ndarray"):
        build(Case("err", lambda q: tg.scaled_dot_product_attention(q, np.ones((3, 4)), q),
                   [Arg((3, 4))], grad=False))
    with pytest.raises(ShapeError, match=r"v must be f32, got i32 \(shape \[3, 4\]\)"):
        build(Case("err", lambda q, v: tg.scaled_dot_product_attention(q, q, v),
                   [Arg((3, 4)), Arg((3, 4), "i32", "int:0:3")], grad=False))


def test_matches_torch_on_a_gpt_block_shape() -> None:
    """[B, H, T, d] = [2, 4, 64, 64], causal, against torch in float64."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, 64, 64)).astype(np.float32) for _ in range(3))
    b = build(Case("sdpa", sdpa(True)[0], [Arg(q.shape, gen=x) for x in (q, k, v)],
                   grad=False))
    got = run_reference(b)[b.out]
    want = F.scaled_dot_product_attention(*(torch.tensor(x, dtype=torch.float64)
                                            for x in (q, k, v)), is_causal=True).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
