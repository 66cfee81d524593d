"""matmul kernels on a real WebGPU device, against the reference interpreter: every unit
case's forward+backward graph (transposed-operand primitives included), every kernel variant
forced on awkward shapes, and larger cases where the default choice picks each variant."""

from __future__ import annotations

import asyncio

import pytest

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target
from tensorgrad.ops import linalg
from tensorgrad.ops.linalg import VARIANTS, MatmulSpec, choose_variant, mm
from tests.harness import Arg, Case
from tests.kernel_check import check_case as check

AWKWARD = [
    Case("matmul", tg.matmul, [Arg((2, 33, 17)), Arg((17, 70))], name="flattened"),
    Case("matmul", tg.matmul, [Arg((3, 65, 40)), Arg((3, 40, 66))], name="batched"),
    Case("matmul", lambda a, b: mm(a, b, True, True), [Arg((19, 70)), Arg((9, 19))],
         name="ta-tb"),
    Case("matmul", tg.matmul, [Arg((1, 300)), Arg((300, 1))], name="dot-long-k"),
]


# Sizes every tile and K chunk divides (the tiled kernels' unchecked fast path), with
# backward (so both transposed forms), and batched.
ALIGNED = [
    Case("matmul", tg.matmul, [Arg((256, 32)), Arg((32, 128))], name="aligned"),
    Case("matmul", tg.matmul, [Arg((2, 128, 48)), Arg((2, 48, 128))], name="aligned-batched"),
    Case("matmul", tg.matmul, [Arg((256, 16)), Arg((16, 256))], name="aligned-wide"),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in AWKWARD + ALIGNED])
def test_forced_variant(gpu_device, monkeypatch, variant: str, case: Case) -> None:
    monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
    assert {"matmul", "matmul_batched"} & check(gpu_device, case)


LARGE = [
    # (case, its MatmulSpec, the default variant on a GPU target)
    (Case("matmul", tg.matmul, [Arg((1040, 64)), Arg((64, 520))], grad=False, name="tiled4"),
     MatmulSpec(1, 1040, 64, 520), "tiled4"),
    (Case("matmul", tg.matmul, [Arg((2, 300, 200)), Arg((200, 260))], name="tiled2"),
     MatmulSpec(1, 600, 200, 260), "tiled2"),
    (Case("matmul", tg.matmul, [Arg((4, 100, 40)), Arg((4, 40, 90))], name="tiled1-batched"),
     MatmulSpec(4, 100, 40, 90, b_batched=True), "tiled1"),
    (Case("matmul", tg.matmul, [Arg((8, 600)), Arg((600, 9))], name="reduce"),
     MatmulSpec(1, 8, 600, 9), "reduce"),
    (Case("matmul", tg.matmul, [Arg((20, 30)), Arg((30, 40))], name="naive"),
     MatmulSpec(1, 20, 30, 40), "naive"),
]


@pytest.mark.parametrize("case, spec, want", [pytest.param(*c, id=c[0].id) for c in LARGE])
def test_large_default_variants(gpu_device, case: Case, spec: MatmulSpec, want: str) -> None:
    assert choose_variant(spec, True) == want
    check(gpu_device, case)


def test_large_cpu_target_variants(gpu_device) -> None:
    """A software target (CPU rasterisers): the largest register block that pads the output
    by at most MAX_PADDING and leaves at least two workgroups (column or row blocks for a
    matrix-vector product); naive for a dot product."""
    assert choose_variant(MatmulSpec(1, 600, 200, 260), False) == "regs8x8vk"
    assert choose_variant(MatmulSpec(1, 600, 200, 260, ta=True), False) == "regs8x8vk"
    # 4 rows (or columns) pad 2x under 8-high (8-wide) blocks, not under 4-high (4-wide) ones
    assert choose_variant(MatmulSpec(1, 4, 200, 600), False) == "regs4x8vk"
    assert choose_variant(MatmulSpec(1, 600, 200, 4), False) == "regs8x4vk"
    # 16 blocks of 8 x 8 fill one workgroup only: 4 x 4 blocks fill two
    assert choose_variant(MatmulSpec(1, 32, 64, 32), False) == "regs4x4vk"
    # attention-shaped batches: many small slices
    assert choose_variant(MatmulSpec(512, 8, 16, 8), False) == "regs8x8vk"
    # matrix-vector products take column (row) blocks
    assert choose_variant(MatmulSpec(1, 256, 64, 1), False) == "regs4x1vk"
    assert choose_variant(MatmulSpec(1, 64, 256, 1, ta=True), False) == "regs8x1vk"
    assert choose_variant(MatmulSpec(1, 1, 256, 64, ta=True), False) == "regs1x8vk"
    assert choose_variant(MatmulSpec(1, 1, 300, 1), False) == "naive"
    # a K past lavapipe's loop budget (65,535 iterations per invocation)
    assert choose_variant(MatmulSpec(1, 4, 40_000, 4, ta=True), False) == "tiled1"
    target = Target(limits=gpu_device.limits, software=True)
    check(gpu_device, LARGE[1][0], target=target)
    check(gpu_device, Case("matmul", tg.matmul, [Arg((8, 700)), Arg((700, 50))]), target=target)
    check(gpu_device, Case("matmul", tg.matmul, [Arg((256, 64)), Arg((64, 1))]), target=target)
    check(gpu_device, Case("matmul", lambda a, b: mm(a, b, True, False),
                           [Arg((256, 1)), Arg((256, 64))]), target=target)
    check(gpu_device, Case("matmul", lambda a, b: mm(a, b, True, False),
                           [Arg((150_000, 4)), Arg((150_000, 3))], grad=False), target=target)


def _causal_attention(q: tg.Tensor, k: tg.Tensor, v: tg.Tensor) -> tg.Tensor:
    return tg.tanh(tg.scaled_dot_product_attention(q, k, v, is_causal=True))


# Causal attention, whose products read a zero triangle (p @ v and the four backward ones):
# T = 40 leaves every tile ragged; T = 128, d = 64 is aligned for the 128x64 tiling.
CAUSAL = [
    Case("scaled_dot_product_attention", _causal_attention,
         [Arg((2, 3, 40, 8)), Arg((2, 3, 40, 8)), Arg((2, 3, 40, 8))], name="causal-ragged"),
    Case("scaled_dot_product_attention", _causal_attention,
         [Arg((2, 1, 128, 64)), Arg((2, 1, 128, 64)), Arg((2, 1, 128, 64))],
         name="causal-aligned"),
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CAUSAL])
def test_forced_variant_skips_zero_triangles(gpu_device, monkeypatch, variant: str,
                                             case: Case) -> None:
    """Each kernel variant's K loop over the band a zero triangle leaves (zeros_a / zeros_b,
    every orientation) matches the reference, which multiplies the zeros."""
    from tensorgrad.passes import mark_zero_triangles
    from tests.harness import build
    from tests.kernel_check import check_graph_kernels

    monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
    b = build(case)
    graph, _ = mark_zero_triangles(b.graph, b.grads.values())
    tags = sorted(f"{key}={n.attrs[key]}" for n in graph.nodes
                  for key in ("zeros_a", "zeros_b") if key in n.attrs)
    assert tags == ["zeros_a=above", "zeros_a=above", "zeros_a=below", "zeros_b=above"]
    target = Target(limits=gpu_device.limits, software=False)
    asyncio.run(check_graph_kernels(gpu_device, graph, b.values, target=target))


def _vector_slots(spec: MatmulSpec, variant: str) -> frozenset[int]:
    from tensorgrad.codegen.kernel import EmitContext
    from tensorgrad.ir import Node
    from tensorgrad.ops.linalg import emit_matmul

    a = Node(0, "input", (), {}, (spec.k, spec.m) if spec.ta else (spec.m, spec.k), "f32")
    b = Node(1, "input", (), {}, (spec.n, spec.k) if spec.tb else (spec.k, spec.n), "f32")
    out = Node(2, "matmul", (0, 1), {}, (spec.m, spec.n), "f32")
    return emit_matmul(EmitContext(out, (a, b), Target(software=True)), spec, variant
                       ).vector_inputs


@pytest.mark.parametrize("variant", ["regs8x8vk", "regs4x4vk", "regs8x4vk", "regs8x8v",
                                     "regs16x8v"])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m, k, n", [(24, 16, 32), (20, 12, 12), (16, 10, 8), (9, 8, 7)])
def test_register_blocks_read_vec4s_where_aligned(gpu_device, monkeypatch, variant: str,
                                                  ta: bool, tb: bool, m: int, k: int,
                                                  n: int) -> None:
    """The vec4-reading register blocks read an operand as vec4s along its stored contiguous
    axis exactly where the variant and the sizes allow (`vk`: K for a row-major A or a
    transposed B; `v` and `vk`: M or N, and the block, for the others), blocks overhanging M
    and N included, and match the reference in every orientation."""
    block = linalg.REGISTER_BLOCKS[variant]
    spec = MatmulSpec(1, m, k, n, ta, tb)
    along_k = block.along_k and k % 4 == 0
    want = {0} if (m % 4 == 0 and block.bm % 4 == 0 if ta else along_k) else set()
    want |= {1} if (along_k if tb else n % 4 == 0 and block.bn % 4 == 0) else set()
    assert _vector_slots(spec, variant) == want
    assert _vector_slots(spec, f"regs{block.bm}x{block.bn}") == frozenset()
    monkeypatch.setattr(linalg, "FORCE_VARIANT", variant)
    a_shape, b_shape = (k, m) if ta else (m, k), (n, k) if tb else (k, n)
    check(gpu_device, Case("matmul", lambda a, b: mm(a, b, ta, tb),
                           [Arg(a_shape), Arg(b_shape)], grad=False))
    batched = Case("matmul_batched", lambda a, b: mm(a, b, ta, tb),
                   [Arg((3, *a_shape)), Arg((3, *b_shape))], grad=False)
    check(gpu_device, batched)
