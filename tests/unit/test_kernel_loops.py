"""Every loop tensorgrad emits ends by itself: wgpu's loop counters (dropped by the native
default, ``runtime_checks="bounds"``) guard against nothing in its kernels."""

from __future__ import annotations

import re

import pytest

from tensorgrad.codegen.kernel import Target, emit_node
from tensorgrad.ir import LEAF_OPS
from tensorgrad.ops import OPS, linalg
from tests.harness import build
from tests.native.test_stitch import CASES as STITCH_CASES
from tests.native.test_stitch import _stitched
from tests.unit.op_tests import all_cases

_NAME = r"[A-Za-z_]\w*"
# `for (var x = A; x < B; x = x + C)` (or `x += C`) with C a positive literal, and the
# halving trees `for (var s = C; s > 0u; s = s >> 1u)`
_COUNTED = re.compile(rf"var ({_NAME}) = [^;]+; \1 < [^;]+; \1 (?:= \1 \+|\+=) [1-9]\d*u?")
_HALVING = re.compile(rf"var ({_NAME}) = [1-9]\d*u; \1 > 0u; \1 = \1 >> 1u")
TARGETS = {"gpu": Target(), "software": Target(software=True),
           "swiftshader": Target(software=True, costly_compiles=True)}


def _loop_headers(wgsl: str) -> list[str]:
    """The text between `for (` and its matching `)`."""
    headers = []
    for m in re.finditer(r"\bfor\s*\(", wgsl):
        depth, j = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(wgsl[j], 0)
            j += 1
        headers.append(wgsl[m.end():j - 1])
    return headers


def _graphs():
    for case in all_cases():
        yield build(case).graph
    for case in STITCH_CASES:
        yield _stitched(case)[1]


@pytest.mark.parametrize("target", TARGETS)
def test_every_emitted_loop_counts_to_a_bound(monkeypatch, target: str) -> None:
    loops = 0
    for variant in (None, "tiled8v16p", "regs16x8v"):  # the chosen kernels, then forced ones
        monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
        for graph in _graphs():
            for node in graph.nodes:
                if node.op in LEAF_OPS or (variant and "matmul" not in node.op
                                           and node.op != "fused"):
                    continue
                wgsl = emit_node(graph, node, TARGETS[target], OPS).wgsl
                assert not re.search(r"\b(loop|while)\b", wgsl), node.describe()
                for header in _loop_headers(wgsl):
                    loops += 1
                    assert _COUNTED.fullmatch(header) or _HALVING.fullmatch(header), \
                        f"{node.describe()}: for ({header})"
    assert loops > 500
