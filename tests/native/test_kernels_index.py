"""Index kernels (one_hot, arange, gather_rows / scatter_add_rows and the gathers built on
them) on a real WebGPU device, against the reference interpreter."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.ops.index as index_ops
from tensorgrad.codegen.kernel import Target, emit_node
from tensorgrad.ops import OPS
from tensorgrad.passes import fuse_elementwise, stitch_kernels
from tests.harness import Arg, Case, build
from tests.kernel_check import check_case as check
from tests.kernel_check import check_graph_kernels

LARGE = [
    Case("one_hot", lambda i: tg.one_hot(i, 1000), [Arg((300,), "i32", "int:-5:1005")],
         grad=False, name="large"),
    Case("one_hot", lambda i: tg.one_hot(i, 7, "bool"), [Arg((50, 40), "i32", "int:-1:8")],
         grad=False, name="bool"),
    Case("arange", lambda: tg.arange(100_000, "f32"), [], grad=False, name="f32"),
    Case("arange", lambda: tg.arange(70_001), [], grad=False, name="i32"),
    Case("embedding", tg.embedding, [Arg((300, 64)), Arg((4, 33), "i32", "int:-2:302")],
         name="large"),
    Case("take_along_axis", lambda x, i: tg.take_along_axis(x, i, 1),
         [Arg((20, 300)), Arg((20, 17), "i32", "int:0:300")], name="large"),
]

# scatter_add_rows in its workgroup-per-row variant (forced below): D above and below the
# workgroup size, several index tiles with a partial last one, tiles full of hits (one row),
# out-of-range ids, a single id.
SCATTER_ROWS = [
    Case("embedding", tg.embedding, [Arg((9, 300)), Arg((3, 200), "i32", "int:-2:11")],
         name="rows-wide"),
    Case("embedding", tg.embedding, [Arg((40, 5)), Arg((700,), "i32", "int:0:40")],
         name="rows-narrow"),
    Case("embedding", tg.embedding, [Arg((3, 4)), Arg((600,), "i32", gen=np.full(600, 1))],
         name="rows-one-row"),
    Case("embedding", tg.embedding, [Arg((2, 3)), Arg((), "i32", gen=np.array(1))],
         name="rows-0d"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in LARGE])
def test_large_cases(gpu_device, case: Case) -> None:
    check(gpu_device, case)


def test_negative_index_never_matches(gpu_device) -> None:
    idx = np.array([-1, 0, 2, -2147483648, 2147483647], np.int32)
    case = Case("one_hot", lambda i: tg.one_hot(i, 3, "i32"), [Arg((5,), "i32", gen=idx)],
                grad=False)
    assert "one_hot" in check(gpu_device, case)  # (and the reshape to [5, 1] it reads)


def _scatter_wgsl(case: Case) -> str:
    b = build(case)
    node = next(n for n in b.graph.nodes if n.op == "scatter_add_rows")
    return emit_node(b.graph, node, Target(), OPS).wgsl


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in SCATTER_ROWS])
def test_scatter_add_rows_workgroup_variant(gpu_device, case: Case, monkeypatch) -> None:
    assert "workgroupBarrier" not in _scatter_wgsl(case)  # small: one thread per (v, d)
    monkeypatch.setattr(index_ops, "SCATTER_SCAN_MAX_STEPS", 0)
    assert "workgroupBarrier" in _scatter_wgsl(case)
    assert {"gather_rows", "scatter_add_rows"} <= check(gpu_device, case)


def test_scatter_add_rows_variant_by_shape() -> None:
    """A GPT-2-sized vocabulary takes the workgroup-per-row variant."""
    case = Case("embedding", tg.embedding, [Arg((50_304, 8)), Arg((8, 64), "i32", "int:0:9")])
    wgsl = _scatter_wgsl(case)
    assert "workgroupBarrier" in wgsl and "var<workgroup> hits" in wgsl


# Stitched: the table's and the indices' producers as gather prologues, the add as its
# epilogue (forward only: with a backward, tanh's recomputation reads the gather too); dy's
# producer (tanh's backward) as the scatter's prologue, the x2 of the table's gradient as its
# epilogue.
def _fwd(t, i):
    return tg.embedding(t * 2.0, i * 2 - 1) + 0.5


def _fwd_bwd(t, i):
    return tg.tanh(tg.embedding(t * 2.0, i))


GATHER = "add_scalar(gather_rows(mul_scalar(x0), add_scalar(mul_scalar(x1))))"
SCATTER = "mul_scalar(scatter_add_rows(mul("
STITCHED = [
    (Case("embedding", _fwd, [Arg((6, 5)), Arg((4, 7), "i32", "int:0:4")], grad=False,
          name="stitched-gather"), GATHER),
    (Case("embedding", _fwd, [Arg((6, 300)), Arg((300,), "i32", "int:0:4")], grad=False,
          name="stitched-gather-wide"), GATHER),
    (Case("embedding", _fwd_bwd, [Arg((6, 5)), Arg((4, 7), "i32", "int:-1:7")],
          name="stitched-scatter"), SCATTER),
    (Case("embedding", _fwd_bwd, [Arg((6, 300)), Arg((300,), "i32", "int:0:6")],
          name="stitched-scatter-wide"), SCATTER),
]


@pytest.mark.parametrize("case, program, rows_variant", [
    pytest.param(c, p, rows, id=c.id + ("-rows" if rows else ""))
    for c, p in STITCHED for rows in ((False, True) if c.grad else (False,))])
def test_stitched_gather_and_scatter(gpu_device, case: Case, program: str, rows_variant: bool,
                                     monkeypatch) -> None:
    if rows_variant:
        monkeypatch.setattr(index_ops, "SCATTER_SCAN_MAX_STEPS", 0)
    b = build(case)
    protected = set(b.grads.values())
    fused, remap = fuse_elementwise(b.graph, protected)
    graph, _ = stitch_kernels(fused, {remap[i] for i in protected})
    programs = [str(n.attrs["program"]) for n in graph.nodes if n.op == "fused"]
    assert any(p.startswith(program) for p in programs), programs
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values))
