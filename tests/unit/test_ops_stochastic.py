"""dropout, randn, categorical: the reference against an independent pure-Python hash,
gradients (dropout reuses its mask), statistics, salts and the shared seed, and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import tensorgrad as tg
from tensorgrad import ShapeError
from tensorgrad.tensor import PRNG_SEED_INPUT
from tests.harness import Arg, Case, build, run_reference

M32 = 0xFFFFFFFF


def py_hash(seed: int, salt: int, idx: int) -> int:
    """The PCG-style hash of the reference (section 3.7), in plain Python ints."""
    h = (seed & M32) ^ ((salt * 0x9E3779B1) & M32) ^ idx
    h = (h * 747796405 + 2891336453) & M32
    h = (((h >> ((h >> 28) + 4)) ^ h) * 277803737) & M32
    return (h >> 22) ^ h


def py_mix(h: int) -> int:
    h = (h * 747796405 + 2891336453) & M32
    h = (((h >> ((h >> 28) + 4)) ^ h) * 277803737) & M32
    return (h >> 22) ^ h


def unit(h: int) -> float:
    return float(np.float32(h)) / 4294967296.0


def keep_scale(shape, p: float, seed: int, salt: int) -> np.ndarray:
    """Per-element multiplier of dropout: 1/(1-p) where kept, else 0."""
    n = int(np.prod(shape))
    keep = np.array([unit(py_hash(seed, salt, i)) >= np.float32(p) for i in range(n)])
    return np.where(keep, 1.0 / (1.0 - p), 0.0).reshape(shape)


def py_randn(shape, seed: int, salt: int) -> np.ndarray:
    out = []
    for i in range(int(np.prod(shape))):
        h1 = py_hash(seed, salt, i)
        u1, u2 = max(1e-10, unit(h1)), unit(py_mix(h1))
        out.append(math.sqrt(-2.0 * math.log(u1)) * math.cos(2 * math.pi * u2))
    return np.array(out).reshape(shape)


def py_categorical(logits: np.ndarray, seed: int, salt: int) -> np.ndarray:
    rows = logits.reshape(-1, logits.shape[-1])
    d = rows.shape[1]
    out = []
    for r, row in enumerate(rows):
        v = [row[j] - math.log(-math.log(max(1e-10, unit(py_hash(seed, salt, r * d + j)))))
             for j in range(d)]
        out.append(int(np.argmax(v)))
    return np.array(out, np.int32).reshape(logits.shape[:-1])


def seed_feed(seed: int) -> dict:
    return {PRNG_SEED_INPUT: np.int32(seed)}


def dropout_case(shape, p, seed, name=""):
    mult = keep_scale(shape, p, seed, 0)
    return Case("dropout", lambda x: tg.dropout(x, p), [Arg(shape)],
                torch_fn=lambda x: x * torch.from_numpy(mult), feeds=seed_feed(seed),
                name=name)


CASES = [
    # The reference's FD exemplar: p = 0.1, seed 42, [4, 8].
    dropout_case((4, 8), 0.1, 42, name="p0.1-seed42"),
    dropout_case((3, 5, 7), 0.5, -7, name="p0.5-negative-seed"),
    dropout_case((1,), 0.25, 3, name="one"),
    Case("dropout", lambda x: tg.dropout(x, 0.0) * 2.0, [Arg((3, 4))],
         torch_fn=lambda x: x * 2.0, name="p0"),
    Case("randn", lambda: tg.randn((3, 4)), [], np_fn=lambda: py_randn((3, 4), 5, 0),
         grad=False, feeds=seed_feed(5), atol=1e-5, rtol=1e-4),
    Case("randn", lambda: tg.randn(7), [], np_fn=lambda: py_randn((7,), -1, 0),
         grad=False, feeds=seed_feed(-1), name="int-shape", atol=1e-5, rtol=1e-4),
    Case("randn", lambda x: x * tg.randn((2, 3)), [Arg((2, 3))],
         torch_fn=lambda x: x * torch.from_numpy(py_randn((2, 3), 9, 0)),
         feeds=seed_feed(9), name="scaled", atol=1e-5),
    Case("categorical", tg.categorical, [Arg((5, 6), param=False)],
         np_fn=lambda lg: py_categorical(lg, 11, 0), grad=False, feeds=seed_feed(11)),
    Case("categorical", lambda lg: tg.categorical(lg, axis=0), [Arg((6, 2, 3), param=False)],
         np_fn=lambda lg: py_categorical(np.moveaxis(lg, 0, -1), 4, 0), grad=False,
         feeds=seed_feed(4), name="axis0"),
    Case("categorical", tg.categorical, [Arg((9,), param=False)],
         np_fn=lambda lg: py_categorical(lg, 2, 0), grad=False, feeds=seed_feed(2),
         name="rank1"),
]


def _run(fn, args=(), seed=1, grad=False):
    b = build(Case("x", fn, list(args), grad=grad, feeds=seed_feed(seed)))
    return b, run_reference(b)


def test_dropout_statistics() -> None:
    p = 0.3
    _, vals = _run(lambda x: tg.dropout(x, p), [Arg((200, 500), gen=np.ones((200, 500)))])
    y = vals[-1]
    kept = y != 0
    assert abs(kept.mean() - (1 - p)) < 0.01
    np.testing.assert_allclose(y[kept], 1 / (1 - p), rtol=1e-6)


def test_dropout_backward_reapplies_the_same_mask() -> None:
    b = build(dropout_case((6, 7), 0.4, 123))
    vals = run_reference(b)
    fwd, grad = b.graph[b.out], b.graph[b.grads["a0"]]
    assert grad.op == "dropout" and grad.attrs == fwd.attrs
    assert grad.inputs[1] == fwd.inputs[1]  # the same seed tensor
    mask = vals[b.out] != 0
    np.testing.assert_allclose(vals[grad.id], np.where(mask, b.weights / 0.6, 0), rtol=1e-6)


def test_dropout_zero_emits_no_op() -> None:
    b = build(Case("dropout", lambda x: tg.dropout(x, 0), [Arg((3,))], grad=False))
    assert b.out == 0
    assert {n.op for n in b.graph.nodes} == {"param"}


def test_two_dropouts_share_the_seed_and_get_distinct_salts() -> None:
    b, vals = _run(lambda x: tg.dropout(tg.dropout(x, 0.5), 0.5),
                   [Arg((64,), gen=np.ones(64))])
    drops = [n for n in b.graph.nodes if n.op == "dropout"]
    seeds = [n for n in b.graph.nodes if n.op == "input" and n.attrs["name"] == PRNG_SEED_INPUT]
    assert len(seeds) == 1 and seeds[0].dtype == "i32" and seeds[0].shape == ()
    assert [d.inputs[1] for d in drops] == [seeds[0].id] * 2
    assert [d.attrs["salt"] for d in drops] == [0, 1]
    first = vals[drops[0].id] != 0
    second_alone = keep_scale((64,), 0.5, 1, 1) != 0
    np.testing.assert_array_equal(vals[drops[1].id] != 0, first & second_alone)
    assert not np.array_equal(first, second_alone)


def test_salts_count_every_stochastic_op() -> None:
    b, _ = _run(lambda x: tg.categorical(tg.randn((2, 3)) + tg.dropout(x, 0.2)),
                [Arg((2, 3))])
    salts = {n.op: n.attrs["salt"] for n in b.graph.nodes if "salt" in n.attrs}
    assert salts == {"randn": 0, "dropout": 1, "categorical_last": 2}


def test_randn_statistics_and_seeds() -> None:
    _, vals = _run(lambda: tg.randn((400, 500)), seed=3)
    z = vals[-1]
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs((np.abs(z) < 1).mean() - 0.6827) < 0.01
    _, again = _run(lambda: tg.randn((400, 500)), seed=3)
    _, other = _run(lambda: tg.randn((400, 500)), seed=4)
    np.testing.assert_array_equal(z, again[-1])
    assert np.abs(z - other[-1]).mean() > 0.5


def test_categorical_frequencies_follow_softmax() -> None:
    logits = np.array([1.0, -0.5, 0.3, 2.0], np.float32)
    batch = np.tile(logits, (60000, 1))
    b, vals = _run(tg.categorical, [Arg(batch.shape, gen=batch, param=False)], seed=17)
    out = vals[b.out]
    assert out.dtype == np.int32 and out.shape == (60000,)
    freq = np.bincount(out, minlength=4) / out.size
    soft = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(freq, soft, atol=0.01)


def test_randn_is_a_constant_for_gradients() -> None:
    b = build(CASES[6])
    vals = run_reference(b)
    (noise,) = [n.id for n in b.graph.nodes if n.op == "randn"]
    np.testing.assert_allclose(vals[b.grads["a0"]], b.weights * vals[noise], rtol=1e-6)


@pytest.mark.parametrize("fn, args, match", [
    (lambda x: tg.dropout(x, 1.0), [Arg((3,))],
     r"dropout: p must be a number in \[0, 1\), got 1.0"),
    (lambda x: tg.dropout(x, -0.1), [Arg((3,))], r"dropout: p must be a number in \[0, 1\)"),
    (lambda x: tg.dropout(x, "0.5"), [Arg((3,))], r"dropout: p must be a number"),
    (lambda x: tg.dropout(x, 0.5), [Arg((3,), "i32", "int:0:3")],
     r"dropout: input must be f32, got i32"),
    (lambda x: tg.randn((2, 0)), [Arg((3,))], r"randn: dims must be positive ints, got \[2, 0\]"),
    (lambda x: tg.categorical(x), [Arg((3,), "i32", "int:0:3")],
     r"categorical: logits must be f32, got i32"),
    (lambda x: tg.categorical(tg.sum(x)), [Arg((3,))],
     r"categorical: logits must have rank >= 1"),
    (lambda x: tg.categorical(x, axis=2), [Arg((3, 4))],
     r"categorical: axis 2 is out of range for a tensor of rank 2"),
])
def test_errors(fn, args, match) -> None:
    with pytest.raises(ShapeError, match=match):
        build(Case("err", fn, args, grad=False))
