"""Index ops: one_hot, arange, embedding (gather_rows / scatter_add_rows), take_along_axis."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tensorgrad as tg
from tensorgrad import ShapeError
from tensorgrad.ops.index import input_index_bounds
from tensorgrad.ops.registry import record
from tests.harness import Arg, Case, build, graph_ops, run_reference
from tests.unit.op_tests import grad_fd_check


def np_one_hot(depth: int, dtype=np.float32):
    return lambda i: (i[..., None] == np.arange(depth)).astype(dtype)


def _take(x_shape, idx_shape, axis):
    depth = x_shape[axis]
    return Case("take_along_axis", lambda x, i: tg.take_along_axis(x, i, axis),
                [Arg(x_shape), Arg(idx_shape, "i32", f"int:0:{depth}")],
                torch_fn=lambda x, i: torch.take_along_dim(x, i, axis),
                name=f"{x_shape}-{idx_shape}-axis{axis}")


CASES = [
    Case("one_hot", lambda i: tg.one_hot(i, 4), [Arg((2, 3), "i32", "int:0:4")], grad=False,
         torch_fn=lambda i: F.one_hot(i, 4)),
    Case("one_hot", lambda i: tg.one_hot(i, 5), [Arg((7,), "i32", "int:0:5")], grad=False,
         torch_fn=lambda i: F.one_hot(i, 5)),
    Case("one_hot", lambda i: tg.one_hot(i, 3), [Arg((), "i32", "int:0:3")], grad=False,
         torch_fn=lambda i: F.one_hot(i, 3), name="0d"),
    Case("one_hot", lambda i: tg.one_hot(i, 4), [Arg((3, 4), "i32", "int:-3:7")], grad=False,
         np_fn=np_one_hot(4), name="out-of-range"),
    Case("one_hot", lambda i: tg.one_hot(i, 3, "i32"), [Arg((5,), "i32", "int:0:3")],
         grad=False, np_fn=np_one_hot(3, np.int32), name="i32"),
    Case("one_hot", lambda i: tg.one_hot(i, 3, "bool"), [Arg((5,), "i32", "int:-1:4")],
         grad=False, np_fn=np_one_hot(3, bool), name="bool"),
    Case("one_hot", lambda x, i: x * tg.one_hot(i, 4), [Arg((2, 4)), Arg((2,), "i32", "int:0:4")],
         torch_fn=lambda x, i: x * F.one_hot(i, 4), name="times-x"),
    Case("arange", lambda x: x * tg.arange(4, "f32"), [Arg((3, 4))],
         torch_fn=lambda x: x * torch.arange(4)),
    Case("arange", lambda i: i + tg.arange(3), [Arg((2, 3), "i32", "int:-5:5")], grad=False,
         torch_fn=lambda i: i + torch.arange(3), name="i32"),
    Case("arange", lambda: tg.arange(1), [], grad=False, np_fn=lambda: np.arange(1),
         name="n1"),
    Case("embedding", tg.embedding, [Arg((5, 3)), Arg((2, 4), "i32", "int:0:5")],
         torch_fn=lambda t, i: F.embedding(i, t)),
    Case("embedding", tg.embedding, [Arg((7, 2)), Arg((6,), "i32", "int:0:7")],
         torch_fn=lambda t, i: F.embedding(i, t)),
    Case("embedding", tg.embedding, [Arg((4, 3)), Arg((), "i32", "int:0:4")],
         torch_fn=lambda t, i: F.embedding(i, t), name="0d-index"),
    Case("embedding", tg.embedding, [Arg((4, 3)), Arg((2, 3), "i32", gen=np.array(
        [[0, -1, 3], [4, 2, 9]], np.int32))], name="out-of-range", grad=False,
        np_fn=lambda t, i: np.where(((i >= 0) & (i < 4))[..., None], t[np.clip(i, 0, 3)], 0)),
    Case("embedding", tg.embedding, [Arg((3, 4)), Arg((4, 6), "i32", "int:0:2")],
         torch_fn=lambda t, i: F.embedding(i, t), name="repeated-rows"),
    Case("embedding", tg.embedding, [Arg((1, 1)), Arg((5,), "i32", "int:0:1")],
         torch_fn=lambda t, i: F.embedding(i, t), name="1x1-table"),
    Case("embedding", lambda t, i: tg.embedding(t, i * 2 - 1), [Arg((6, 2)), Arg((3, 3), "i32",
         "int:0:4")], name="computed-ids", torch_fn=lambda t, i: F.embedding(
             (i * 2 - 1).clamp(0, 5), t) * ((i * 2 - 1) >= 0).unsqueeze(-1)),
    Case("embedding", lambda t, i: tg.embedding(t * t, i) * tg.embedding(t, i + 0),
         [Arg((4, 3)), Arg((2, 5), "i32", "int:0:4")], name="table-used-twice",
         torch_fn=lambda t, i: F.embedding(i, t * t) * F.embedding(i, t)),
    _take((3, 4), (3, 2), 1),
    _take((3, 4), (2, 4), 0),
    _take((3, 4), (3, 4), -1),
    _take((2, 3, 4), (2, 5, 4), -2),
    _take((2, 3, 4), (1, 3, 4), 0),
    _take((5,), (3,), 0),
]


def test_out_of_range_gather_gives_zero() -> None:
    idx = np.array([[1, -1], [5, 0]], np.int32)
    b = build(Case("take_along_axis", lambda x, i: tg.take_along_axis(x, i, 1),
                   [Arg((2, 3)), Arg((2, 2), "i32", gen=idx)], grad=False))
    v = run_reference(b)[b.out]
    x = b.values["a0"]
    np.testing.assert_allclose(v, [[x[0, 1], 0], [0, x[1, 0]]])


def test_out_of_range_embedding_gradient() -> None:
    case = next(c for c in CASES if c.id == "embedding[out-of-range]")
    grad_fd_check(Case(**{**case.__dict__, "grad": True}))


def test_embedding_is_a_gather_with_a_scatter_add_backward() -> None:
    b = build(Case("embedding", tg.embedding, [Arg((50, 3)), Arg((2, 4), "i32", "int:0:50")]))
    ops = graph_ops(b)
    assert {"gather_rows", "scatter_add_rows"} <= ops
    assert not ops & {"one_hot", "matmul"}, ops


def test_scatter_add_rows_reference_sums_in_index_order() -> None:
    idx = np.array([[2, 0], [2, 7], [-1, 2]], np.int32)
    dy = np.arange(6 * 2, dtype=np.float64).reshape(3, 2, 2)
    b = build(Case("x", lambda d, i: record("scatter_add_rows", [d, i], rows=4),
                   [Arg((3, 2, 2), gen=dy, param=False), Arg((3, 2), "i32", gen=idx)],
                   grad=False))
    got = run_reference(b, float_dtype=np.float64)[b.out]
    want = np.zeros((4, 2))
    for n, v in enumerate(idx.reshape(-1)):
        if 0 <= v < 4:
            want[v] += dy.reshape(-1, 2)[n]
    np.testing.assert_array_equal(got, want)


def test_embedding_ids_from_an_input_are_bounded() -> None:
    b = build(Case("embedding", lambda t, i: tg.embedding(t, tg.reshape(i, (-1,))),
                   [Arg((5, 3)), Arg((2, 2), "i32", "int:0:5")]))
    (use,) = input_index_bounds(b.graph)["a1"]  # the gather and its scatter: one bound
    assert use.bound == 5 and use.what.startswith("embedding(vocab=5) at ") and \
        "test_ops_index.py" in use.what and use.sentinel is None
    b = build(Case("embedding", lambda t, i: tg.embedding(t, i + 1),
                   [Arg((5, 3)), Arg((2, 2), "i32", "int:0:4")]))
    assert input_index_bounds(b.graph) == {}  # computed ids: out of range gives zeros


def test_dtypes() -> None:
    b = build(Case("x", lambda i: tg.one_hot(i, 2), [Arg((3,), "i32", "int:0:2")], grad=False))
    assert b.graph[b.out].dtype == "f32" and b.graph[b.out].shape == (3, 2)
    b = build(Case("x", lambda: tg.arange(5), [], grad=False))
    assert b.graph[b.out].dtype == "i32" and b.graph[b.out].shape == (5,)


def _err(fn, *args: Arg):
    build(Case("err", fn, list(args) or [Arg((3, 4)), Arg((3, 2), "i32", "int:0:3")],
               grad=False))


@pytest.mark.parametrize("fn, match", [
    (lambda x, i: tg.one_hot(x, 3), r"one_hot: indices must be i32, got f32 \(shape \[3, 4\]\)"),
    (lambda x, i: tg.one_hot(i, 0), r"one_hot: depth must be a positive int, got 0"),
    (lambda x, i: tg.one_hot(i, 2.0), r"one_hot: depth must be a positive int, got 2.0"),
    (lambda x, i: tg.one_hot(i, 2, "f16"), r"one_hot: dtype must be one of"),
    (lambda x, i: tg.arange(0), r"arange: n must be a positive int, got 0"),
    (lambda x, i: tg.arange(3, "bool"), r"arange: dtype must be 'f32' or 'i32', got 'bool'"),
    (lambda x, i: tg.embedding(tg.reshape(x, (-1,)), i), (r"embedding: table must have rank 2 "
                                                         r"\[V, D\], got shape \[12\]")),
    (lambda x, i: tg.embedding(x, x), r"embedding: indices must be i32, got f32"),
    (lambda x, i: tg.embedding(tg.less(x, 0.0), i), r"embedding: table must be f32, got bool"),
    (lambda x, i: record("gather_rows", [x, x]), r"gather_rows: indices must be i32, got f32"),
    (lambda x, i: record("gather_rows", [tg.reshape(x, (2, 3, 2)), i]),
     r"gather_rows: table must have rank 2 \[V, D\], got shape \[2, 3, 2\]"),
    (lambda x, i: record("gather_rows", [i, i]), r"gather_rows: table must be f32, got i32"),
    (lambda x, i: record("scatter_add_rows", [x, i], rows=3),
     r"scatter_add_rows: dy \[3, 4\] must be the indices' shape \[3, 2\] plus one last axis"),
    (lambda x, i: record("scatter_add_rows", [tg.reshape(x, (3, 2, 2)), i], rows=0),
     r"scatter_add_rows: rows must be a positive int, got 0"),
    (lambda x, i: record("scatter_add_rows", [i, i], rows=3),
     r"scatter_add_rows: dy must be f32, got i32"),
    (lambda x, i: record("scatter_add_rows", [tg.reshape(x, (3, 2, 2)), x], rows=3),
     r"scatter_add_rows: indices must be i32, got f32"),
    (lambda x, i: tg.take_along_axis(x, tg.reshape(i, (-1,)), 1),
     r"take_along_axis: input \[3, 4\] and indices \[6\] must have the same rank >= 1"),
    (lambda x, i: tg.take_along_axis(x, tg.reshape(i, (2, 3)), 1),
     r"take_along_axis: input \[3, 4\] and indices \[2, 3\] must match except on axis 1"),
    (lambda x, i: tg.take_along_axis(x, x, 1), r"take_along_axis: indices must be i32, got f32"),
    (lambda x, i: tg.take_along_axis(x, i, 2), r"take_along_axis: axis 2 is out of range"),
])
def test_errors(fn, match) -> None:
    with pytest.raises(ShapeError, match=match):
        _err(fn)


def test_error_names_user_line() -> None:
    with pytest.raises(ShapeError) as info:
        _err(lambda x, i: tg.one_hot(i, -2))
    assert "test_ops_index.py" in str(info.value)


def test_indices_read_inside_fused_kernels_are_bounded() -> None:
    """A gather with a stitched epilogue (a forward graph: no scatter reads the ids) and a
    one-hot fused into the reductions that read it still bound the ids from inputs."""
    from tensorgrad.compiler import Options, Request, compile_graph

    class Lookup(tg.Module):
        def __init__(self) -> None:
            self.table = self.param((7, 3))

        def forward(self, ids: tg.Tensor, labels: tg.Tensor) -> tg.Tensor:
            rows = tg.embedding(self.table, ids) * 2.0                   # [4, 3]
            return tg.sum(rows * tg.one_hot(labels, 3), -1)              # [4]

    c = compile_graph(Request("forward", Lookup(), lambda m, ids, labels: m(ids, labels),
                              {"ids": ((4,), "i32"), "labels": ((4,), "i32")}), Options(),
                      until="passes after optimizer")
    fused = [n for n in c.graph.nodes if n.op == "fused"]
    programs = [{m.op for m in n.attrs["program"].nodes} for n in fused]
    assert any("gather_rows" in p for p in programs) and any("one_hot" in p for p in programs)
    assert not {"gather_rows", "one_hot"} & {n.op for n in c.graph.nodes}
    bounds = input_index_bounds(c.graph)
    (ids,), (labels,) = bounds["ids"], bounds["labels"]
    assert ids.bound == 7 and ids.what.startswith("embedding(vocab=7)")
    assert labels.bound == 3 and labels.what.startswith("one_hot(depth=3)")
