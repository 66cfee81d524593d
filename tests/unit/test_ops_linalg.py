"""matmul: forward vs PyTorch, gradients vs autograd and finite differences, errors, the
shape of the weight gradient, transposed-operand primitives and kernel-variant choice."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tensorgrad as tg
from tensorgrad import ShapeError
from tensorgrad.ops import linalg
from tensorgrad.ops.linalg import MatmulSpec, choose_variant, mm
from tests.harness import Arg, Case, build, run_reference
from tests.unit.op_tests import grad_fd_check, grad_torch_check


def _mm_t(ta: bool, tb: bool):
    """torch twin of the primitive with transpose flags."""
    def fn(a, b):
        return (a.transpose(-1, -2) if ta else a) @ (b.transpose(-1, -2) if tb else b)
    return fn


CASES = [
    Case("matmul", tg.matmul, [Arg((3, 4)), Arg((4, 5))], torch_fn=torch.matmul),
    Case("matmul", tg.matmul, [Arg((5, 7)), Arg((7, 3))], torch_fn=torch.matmul, name="odd"),
    Case("matmul", tg.matmul, [Arg((2, 3, 4)), Arg((4, 5))], torch_fn=torch.matmul,
         name="flattened-lhs"),
    Case("matmul", tg.matmul, [Arg((2, 2, 3, 4)), Arg((4, 1))], torch_fn=torch.matmul,
         name="rank4-lhs-n1"),
    Case("matmul", tg.matmul, [Arg((1, 4)), Arg((4, 1))], torch_fn=torch.matmul,
         name="size1"),
    Case("matmul", lambda a, b: a @ b, [Arg((3, 4)), Arg((4, 2))],
         torch_fn=lambda a, b: a @ b, name="operator"),
    Case("matmul", tg.matmul, [Arg((2, 3, 4)), Arg((2, 4, 5))], torch_fn=torch.matmul,
         name="batched"),
    Case("matmul", tg.matmul, [Arg((2, 1, 3, 4)), Arg((2, 1, 4, 6))],
         torch_fn=torch.matmul, name="batched-rank4"),
    Case("matmul", tg.matmul, [Arg((3, 1, 4)), Arg((3, 4, 1))], torch_fn=torch.matmul,
         name="batched-m1-n1"),
    Case("matmul", tg.matmul, [Arg((3, 4)), Arg((4, 5), param=False)],
         torch_fn=torch.matmul, name="frozen-rhs"),
    # Transposed-operand primitives (what backward rules and passes emit).
    Case("matmul", lambda a, b: mm(a, b, True, False), [Arg((4, 3)), Arg((4, 5))],
         torch_fn=_mm_t(True, False), name="ta"),
    Case("matmul", lambda a, b: mm(a, b, False, True), [Arg((2, 3, 4)), Arg((5, 4))],
         torch_fn=_mm_t(False, True), name="tb-flattened"),
    Case("matmul", lambda a, b: mm(a, b, True, True), [Arg((4, 3)), Arg((5, 4))],
         torch_fn=_mm_t(True, True), name="ta-tb"),
    Case("matmul", lambda a, b: mm(a, b, True, False), [Arg((2, 4, 3)), Arg((2, 4, 5))],
         torch_fn=_mm_t(True, False), name="batched-ta"),
    Case("matmul", lambda a, b: mm(a, b, False, True), [Arg((2, 3, 4)), Arg((2, 5, 4))],
         torch_fn=_mm_t(False, True), name="batched-tb"),
    Case("matmul", lambda a, b: mm(a, b, True, True), [Arg((2, 4, 3)), Arg((2, 5, 4))],
         torch_fn=_mm_t(True, True), name="batched-ta-tb"),
    # The FD exemplar of the reference: p[4,8] @ x[8,16].
    Case("matmul", tg.matmul, [Arg((4, 8), gen="unit"), Arg((8, 16), gen="unit", param=False)],
         torch_fn=torch.matmul, name="exemplar"),
]


def test_weight_grad_contracts_flattened_rows() -> None:
    """d/dW of [8, 5, 3] @ [3, 4] is one [3, 40] @ [40, 4] product: no [8, 3, 4] tensor."""
    b = build(Case("matmul", tg.matmul, [Arg((8, 5, 3)), Arg((3, 4))]))
    grad = b.graph[b.grads["a1"]]
    assert grad.op == "matmul" and grad.attrs["transpose_a"]
    assert [b.graph[i].shape for i in grad.inputs] == [(40, 3), (40, 4)]
    assert all(n.shape != (8, 3, 4) for n in b.graph.nodes)


def test_backward_needs_no_transpose_copies() -> None:
    for args in ([Arg((6, 3)), Arg((3, 4))], [Arg((2, 6, 3)), Arg((2, 3, 4))]):
        b = build(Case("matmul", tg.matmul, args))
        assert "permute" not in {n.op for n in b.graph.nodes}


def test_rank2_rhs_uses_matmul_and_batched_rhs_uses_matmul_batched() -> None:
    b = build(Case("matmul", tg.matmul, [Arg((2, 3, 4)), Arg((4, 5))], grad=False))
    assert b.graph[b.out].op == "matmul"
    b = build(Case("matmul", tg.matmul, [Arg((2, 3, 4)), Arg((2, 4, 5))], grad=False))
    assert b.graph[b.out].op == "matmul_batched"


def test_embedding_gradient_vs_finite_differences() -> None:
    """The reference's embedding exemplar: table [10, 4], idx [2, 5, 7] (scatter-add backward)."""
    idx = np.array([2, 5, 7], np.int32)
    case = Case("embedding", tg.embedding, [Arg((10, 4), gen="unit"), Arg((3,), "i32", idx)])
    grad_fd_check(case)
    grad_torch_check(Case(**{**case.__dict__,
                             "torch_fn": lambda t, i: torch.nn.functional.embedding(i, t)}))


@pytest.mark.parametrize("args, match", [
    ([Arg((3, 4)), Arg((5, 6))],
     r"matmul: inner dims differ: lhs \[3, 4\] has 4, rhs \[5, 6\] has 5"),
    ([Arg((4,)), Arg((4, 2))], r"matmul: lhs must have rank >= 2, got shape \[4\]"),
    ([Arg((3, 4)), Arg((4,))], r"matmul: rhs must have rank >= 2, got shape \[4\]"),
    ([Arg((2, 3, 4)), Arg((3, 4, 5))],
     r"matmul: batch dims differ: lhs \[2, 3, 4\] has \[2\], rhs \[3, 4, 5\] has \[3\]"),
    ([Arg((3, 4)), Arg((2, 4, 5))], r"matmul: a batched matmul needs equal ranks"),
    ([Arg((2, 2, 3, 4)), Arg((2, 4, 5))], (r"matmul: a batched matmul needs equal ranks, "
                                          r"got lhs \[2, 2, 3, 4\] and rhs \[2, 4, 5\]")),
    ([Arg((3, 4), "i32", "int:0:3"), Arg((4, 5))], r"matmul: lhs must be f32, got i32"),
])
def test_errors(args, match) -> None:
    with pytest.raises(ShapeError, match=match):
        build(Case("err", tg.matmul, args, grad=False))


def test_error_names_user_line() -> None:
    with pytest.raises(ShapeError) as info:
        build(Case("err", tg.matmul, [Arg((3, 4)), Arg((5, 6))], grad=False))
    assert "test_ops_linalg.py" in str(info.value)


def test_reference_float64() -> None:
    b = build(Case("matmul", tg.matmul, [Arg((2, 3, 4)), Arg((4, 5))], grad=False))
    vals = run_reference(b, float_dtype=np.float64)
    assert vals[b.out].dtype == np.float64
    np.testing.assert_allclose(vals[b.out], b.values["a0"].astype(np.float64) @
                               b.values["a1"].astype(np.float64), rtol=1e-12)


@pytest.mark.parametrize("spec, tiled, want", [
    (MatmulSpec(1, 1024, 1024, 1024), True, "tiled8x4vp"),  # 64 tiles of 128: too few
    (MatmulSpec(1, 2048, 2048, 2048), True, "tiled8v"),    # 16 KiB of workgroup memory
    (MatmulSpec(1, 4096, 256, 1024), True, "tiled8v"),
    (MatmulSpec(1, 4096, 1024, 256), True, "tiled8x4vp"),  # 23.7 TFLOP/s, tiled8v16 15.4
    (MatmulSpec(384, 256, 256, 64), True, "tiled8x4vp"),   # GPT-2's p@v: 25.7, tiled4 17.3
    (MatmulSpec(1, 1040, 64, 520), True, "tiled4"),
    (MatmulSpec(1, 512, 8192, 512, ta=True), True, "tiled2"),
    (MatmulSpec(1, 128, 4096, 128, ta=True), True, "tiled1"),
    (MatmulSpec(1, 64, 16384, 64, ta=True), True, "reduce"),
    (MatmulSpec(1, 1, 1024, 1024), True, "reduce"),
    (MatmulSpec(1, 8, 8, 8), True, "naive"),
    (MatmulSpec(64, 16, 16, 16, tb=True), True, "tiled1"),
    (MatmulSpec(256, 64, 64, 64, tb=True), True, "tiled4"),   # attention heads: no 128 tiles
    (MatmulSpec(256, 64, 64, 32), True, "tiled2"),
    (MatmulSpec(1, 1024, 1024, 1024), False, "regs8x8vk"),
    (MatmulSpec(1, 8, 512, 512), False, "regs8x8vk"),
    (MatmulSpec(1, 64, 16384, 64), False, "regs8x8vk"),
    (MatmulSpec(1, 1, 512, 512), False, "regs1x8vk"),  # a row: row blocks, no padding
    (MatmulSpec(1, 1, 512, 1), False, "naive"),        # a dot product: every block pads
])
def test_variant_choice(spec: MatmulSpec, tiled: bool, want: str) -> None:
    assert choose_variant(spec, tiled) == want


def test_software_targets_with_costly_compiles_take_blocks_without_unrolled_k() -> None:
    """SwiftShader (its shader compiles are dear) gets `v` blocks, 16 x 8 where there are
    enough of them to share out, lavapipe `vk` ones."""
    from tensorgrad.codegen.kernel import Target
    from tensorgrad.gpu.interface import AdapterInfo, DeviceLimits

    spec = MatmulSpec(1, 1024, 64, 256)
    assert choose_variant(spec, False, costly_compiles=True) == "regs16x8v"
    assert choose_variant(spec, False) == "regs8x8vk"
    # [64, 256] @ [256, 64] (the MLP's weight gradient) has 32 blocks of 16 x 8: one
    # workgroup, one core; 8 x 8 leaves two
    assert choose_variant(MatmulSpec(1, 64, 256, 64, ta=True), False,
                          costly_compiles=True) == "regs8x8v"
    # eight rows: 16-row blocks would pad the output twice over
    assert choose_variant(MatmulSpec(1, 8, 64, 1024), False, costly_compiles=True) == "regs8x8v"
    swiftshader = AdapterInfo(vendor="google", architecture="swiftshader", software=True)
    lavapipe = AdapterInfo(vendor="llvmpipe", description="Mesa 22.3.6", software=True)
    assert Target.for_device(DeviceLimits(), swiftshader).costly_compiles
    assert not Target.for_device(DeviceLimits(), lavapipe).costly_compiles
    assert not Target.for_device(DeviceLimits(), AdapterInfo(vendor="nvidia")).costly_compiles


def test_the_largest_tiling_needs_more_than_the_default_workgroup_memory() -> None:
    spec = MatmulSpec(1, 4096, 4096, 4096)
    assert linalg.TILINGS["tiled8v16"].shared_bytes > 16_384
    assert choose_variant(spec, True, storage=16_384) == "tiled8v"
    assert choose_variant(spec, True, storage=32_768) == "tiled8v16p"
    assert choose_variant(MatmulSpec(1, 4096, 1024, 256), True, storage=32_768) == "tiled8x4vp"
    # GPT-2's LM head prefetches its next K chunk; its attention q@kᵀ (K = 64) does not
    assert choose_variant(MatmulSpec(1, 8192, 768, 50304), True, storage=32_768) == "tiled8v16p"
    assert choose_variant(MatmulSpec(384, 256, 64, 256, tb=True), True,
                          storage=32_768) == "tiled8v16"


def test_forced_variant(monkeypatch) -> None:
    monkeypatch.setattr(linalg, "FORCE_VARIANT", "naive")
    assert choose_variant(MatmulSpec(1, 1024, 1024, 1024), True) == "naive"


@pytest.mark.parametrize("variant", sorted(linalg.TILINGS))
def test_tiled_multiplies_read_their_tiles_at_constant_k_rows(variant: str) -> None:
    """The unrolled multiply reads `As[kk][...]` and `Bs[kk][...]` with a literal kk: where
    bounds checks are compiled in (wgpu natively, Tint's robustness in browsers) the row
    index's clamp is then the same at every kk, not one per read (on an H100 GPT-2 small's
    step took 204.6 ms with flat tiles, 191.2 with these)."""
    from tensorgrad.codegen.kernel import EmitContext, Target
    from tensorgrad.ir import Node

    spec = MatmulSpec(1, 256, 64, 256)
    ctx = EmitContext(Node(0, "matmul", (), {}, (256, 256), "f32"),
                      (Node(-1, "input", (), {}, (256, 64), "f32"),
                       Node(-1, "input", (), {}, (64, 256), "f32")), Target())
    wgsl = linalg.emit_matmul(ctx, spec, variant).wgsl
    assert "var<workgroup> As: array<array<" in wgsl and "var<workgroup> Bs: array<array<" in wgsl
    reads = re.findall(r"let [ab]\d+ = ([AB]s\[[^\]]*\])", wgsl)
    tile = linalg.TILINGS[variant]
    per_k = tile.bm + tile.bn if not tile.vec else (tile.bm + tile.bn) // 4
    assert len(reads) == tile.tk * per_k
    assert all(re.fullmatch(r"[AB]s\[\d+u\]", r) for r in reads), reads
