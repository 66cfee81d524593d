"""Reduction and row-wise kernels on a real WebGPU device, against the reference interpreter.

Every case of the unit CASES runs its forward+backward graph kernel by kernel; the large
cases exercise each variant of each row kernel (one workgroup per row for few long rows, a
team of threads per row for many rows of 32 or more, one thread per row otherwise); on
software targets every row kernel is a thread per row."""

from __future__ import annotations

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target, emit_node
from tensorgrad.ops import OPS
from tests.harness import Arg, Case, build
from tests.kernel_check import check_case as check


def variant(case: Case, op: str, target: Target | None = None) -> str:
    """'workgroup', 'team' or 'thread': how the kernel of the first `op` node of the case
    runs."""
    b = build(case, with_grad=op.endswith("_grad"))
    node = next(n for n in b.graph.nodes if n.op == op)
    wgsl = emit_node(b.graph, node, target or Target(), OPS).wgsl
    if "let lane = lid % " in wgsl:
        return "team"
    return "workgroup" if "workgroupBarrier" in wgsl else "thread"


TIES = np.tile(np.array([0.0, 5.0, 1.0, 5.0], np.float32), (6, 256))  # [6, 1024], max at 1
LARGE = [
    # (case, primitive, expected variant)
    (Case("sum", lambda x: tg.sum(x, -1), [Arg((24, 1000))], name="wg"), "sum_last",
     "workgroup"),
    (Case("sum", lambda x: tg.sum(x, 0), [Arg((90, 700))], name="thread"), "sum_last",
     "thread"),
    (Case("sum", lambda x: tg.sum(x), [Arg((300, 301))], name="all"), "sum_last", "workgroup"),
    (Case("mean", lambda x: tg.mean(x, 1), [Arg((5, 2049))], name="wg"), "mean_last",
     "workgroup"),
    (Case("mean", lambda x: tg.mean(x, -1), [Arg((40000, 3))], name="thread"), "mean_last",
     "thread"),
    (Case("argmax", lambda x: tg.argmax(x, -1), [Arg((9, 3000))], grad=False, name="wg"),
     "argmax_last", "workgroup"),
    (Case("argmax", lambda x: tg.argmax(x, -1), [Arg((6, 1024), gen=TIES)], grad=False,
          name="wg-ties"), "argmax_last", "workgroup"),
    (Case("argmin", lambda x: tg.argmin(x), [Arg((50, 40))], grad=False, name="wg-flat"),
     "argmax_last", "workgroup"),
    (Case("argmax", lambda x: tg.argmax(x, 0), [Arg((100, 3000))], grad=False, name="thread"),
     "argmax_last", "thread"),
    (Case("log_softmax", tg.log_softmax, [Arg((12, 1500))], name="wg"), "log_softmax_last",
     "workgroup"),
    (Case("log_softmax", tg.log_softmax, [Arg((3000, 70))], name="team"),
     "log_softmax_last", "team"),
    (Case("log_softmax", tg.log_softmax, [Arg((3000, 70))], name="team"),
     "log_softmax_last_grad", "team"),
    # teams of 32 (the GPU default): 10 columns a thread, 8 rows a workgroup, the last one
    # holding a single row
    (Case("log_softmax", tg.log_softmax, [Arg((4201, 300))], fd=False, name="team32"),
     "log_softmax_last", "team"),
    (Case("log_softmax", tg.log_softmax, [Arg((4201, 300))], fd=False, name="team32"),
     "log_softmax_last_grad", "team"),
    (Case("layer_norm", tg.layer_norm, [Arg((4101, 96)), Arg((96,)), Arg((96,))], fd=False,
          name="team32"), "normalize_last_grad", "team"),
    (Case("log_softmax", tg.log_softmax, [Arg((3000, 20))], name="thread"),
     "log_softmax_last", "thread"),
    (Case("softmax", lambda x: tg.softmax(x * 30.0), [Arg((4, 700))], name="wg-peaky"),
     "log_softmax_last", "workgroup"),
    (Case("softmax_causal", tg.softmax_causal, [Arg((2, 300, 300))], name="wg"),
     "softmax_causal_last", "workgroup"),
    (Case("softmax_causal", tg.softmax_causal, [Arg((40, 64, 64))], name="team"),
     "softmax_causal_last", "team"),
    (Case("softmax_causal", tg.softmax_causal, [Arg((40, 64, 64))], name="team"),
     "softmax_causal_last_grad", "team"),
    (Case("softmax_causal", tg.softmax_causal, [Arg((9, 17, 17))], name="thread"),
     "softmax_causal_last", "thread"),
    (Case("layer_norm", tg.layer_norm, [Arg((1024, 64)), Arg((64,)), Arg((64,))],
          fd=False, name="team"), "normalize_last_grad", "team"),
    (Case("rms_norm", tg.rms_norm, [Arg((10, 33)), Arg((33,))], name="team-ragged"),
     "normalize_last", "team"),
    (Case("layer_norm", tg.layer_norm, [Arg((3, 700)), Arg((700,)), Arg((700,))],
          fd=False, name="wg"), "normalize_last_grad", "workgroup"),
    (Case("where_causal", lambda x: tg.where_causal(x, -1e9), [Arg((3, 257, 257))],
          name="big"), "where_causal", "thread"),
]


@pytest.mark.parametrize("case, op, want", [pytest.param(*c, id=f"{c[0].id}-{c[1]}")
                                            for c in LARGE])
def test_large_kernel_variants(gpu_device, case: Case, op: str, want: str) -> None:
    assert variant(case, op) == want
    assert op in check(gpu_device, case)



SOFTWARE = [(c, op, "workgroup" if c.id == "sum[all]" else "thread")  # all: 90,300 long
            for c, op, want in LARGE if want in ("workgroup", "team")] + [
    # rows past lavapipe's loop budget: a workgroup per row even on a CPU
    (Case("argmax", lambda x: tg.argmax(x, -1), [Arg((2, 40000))], grad=False, name="wg"),
     "argmax_last", "workgroup"),
    (Case("log_softmax", tg.log_softmax, [Arg((2, 33000))], grad=False, name="wg"),
     "log_softmax_last", "workgroup"),
]


@pytest.mark.parametrize("case, op, want", [pytest.param(*c, id=f"{c[0].id}-{c[1]}-{c[2]}")
                                            for c in SOFTWARE])
def test_software_target_variants(gpu_device, case: Case, op: str, want: str) -> None:
    """CPU rasterisers run a serial loop per row unless the row is longer than
    SOFTWARE_SERIAL_MAX_LENGTH: a barrier there costs more than a whole row."""
    target = Target(limits=gpu_device.limits, software=True)
    assert variant(case, op, target) == want
    assert op in check(gpu_device, case, target=target)


def test_gpu_rows_get_teams_of_32() -> None:
    """Many rows of 300 (GPU target): teams of 32 threads, 8 rows a workgroup (the cases
    named team32 above run them on the device)."""
    case = next(c for c, op, _ in LARGE if c.name == "team32" and op == "log_softmax_last")
    b = build(case)
    node = next(n for n in b.graph.nodes if n.op == "log_softmax_last")
    wgsl = emit_node(b.graph, node, Target(), OPS).wgsl
    assert "let lane = lid % 32u;" in wgsl and "lid / 32u" in wgsl


@pytest.mark.parametrize("center", [True, False])
def test_serial_rows_share_loops_between_independent_stats(gpu_device, center: bool) -> None:
    """One thread per row: LayerNorm's backward sums x (the mean), then the spread, Σg·x̂
    and Σg in one loop (none reads another), then writes: three loops over the row, not
    five; RMSNorm's backward (the spread, then Σg·x̂ in its loop) two, not three."""
    norm = tg.layer_norm if center else tg.rms_norm
    args = [Arg((70, 48)), Arg((48,))] + ([Arg((48,))] if center else [])
    case = Case("layer_norm" if center else "rms_norm", norm, args, fd=False, name="serial")
    target = Target(limits=gpu_device.limits, software=True)
    b = build(case, with_grad=True)
    node = next(n for n in b.graph.nodes if n.op == "normalize_last_grad")
    wgsl = emit_node(b.graph, node, target, OPS).wgsl
    assert wgsl.count("for (var j = 0u;") == (3 if center else 2)
    assert "normalize_last_grad" in check(gpu_device, case, target=target)
