"""Matrix multiplication: `matmul` (rank-2 rhs, lhs leading dims flattened) and
`matmul_batched` (equal ranks, equal batch dims).

Both primitives carry `transpose_a` / `transpose_b` flags: the stored operand is the
transpose of the logical one. Users never set them; backward rules use them so that
gradients need no transpose copies. `transpose_a` on `matmul` requires a rank-2 lhs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from math import prod
from typing import Any

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Attrs, DType, Node, Shape
from ..tensor import Tensor
from .linalg_cpu import REGISTER_BLOCKS, choose_register_block, emit_registers
from .matmul_spec import MAX_PADDING, MatmulSpec, at, split_batch
from .registry import Stitch, define, public, record
from .rules import require_dtype


def _logical(shape: Shape, transposed: bool) -> tuple[int, int]:
    """(rows, cols) of the logical operand stored with `shape`."""
    return (shape[-1], shape[-2]) if transposed else (shape[-2], shape[-1])


def _check_operands(op: str, a: Node, b: Node) -> None:
    require_dtype(op, a, "f32", what="lhs")
    require_dtype(op, b, "f32", what="rhs")
    for side, n in (("lhs", a), ("rhs", b)):
        if len(n.shape) < 2:
            raise ShapeError(op, f"{side} must have rank >= 2, got shape {list(n.shape)} "
                             f"(lhs {list(a.shape)}, rhs {list(b.shape)})")


def _infer_matmul(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    a, b = inputs
    _check_operands("matmul", a, b)
    ta, tb = attrs.get("transpose_a", False), attrs.get("transpose_b", False)
    if len(b.shape) != 2:
        raise ShapeError("matmul", f"the primitive needs a rank-2 rhs, got {list(b.shape)}")
    if ta and len(a.shape) != 2:
        raise ShapeError("matmul", f"transpose_a needs a rank-2 lhs, got {list(a.shape)}")
    m, k = _logical(a.shape, ta)
    kb, n = _logical(b.shape, tb)
    if k != kb:
        raise ShapeError("matmul", f"inner dims differ: lhs {list(a.shape)} has {k}, rhs "
                         f"{list(b.shape)} has {kb} (expected [..., M, K] @ [K, N])")
    return (*a.shape[:-2], m, n), "f32"


def _infer_matmul_batched(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    a, b = inputs
    _check_operands("matmul", a, b)
    ta, tb = attrs.get("transpose_a", False), attrs.get("transpose_b", False)
    if len(a.shape) != len(b.shape):
        raise ShapeError("matmul", f"a batched matmul needs equal ranks, got lhs {list(a.shape)} "
                         f"and rhs {list(b.shape)} (use a rank-2 rhs to share it over a batch)")
    if a.shape[:-2] != b.shape[:-2]:
        raise ShapeError("matmul", f"batch dims differ: lhs {list(a.shape)} has "
                         f"{list(a.shape[:-2])}, rhs {list(b.shape)} has {list(b.shape[:-2])} "
                         "(they must be exactly equal; there is no batch broadcasting)")
    m, k = _logical(a.shape, ta)
    kb, n = _logical(b.shape, tb)
    if k != kb:
        raise ShapeError("matmul", f"inner dims differ: lhs {list(a.shape)} has {k}, rhs "
                         f"{list(b.shape)} has {kb} (expected [..., M, K] @ [..., K, N])")
    return (*a.shape[:-2], m, n), "f32"


def _ref_matmul(args: Sequence[Any], node: Node) -> Any:
    import numpy as np

    a, b = args
    if node.attrs.get("transpose_a", False):
        a = np.swapaxes(a, -1, -2)
    if node.attrs.get("transpose_b", False):
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def mm(a: Tensor, b: Tensor, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    """The primitive for `a` and `b` (rank-2 `b` -> `matmul`, else `matmul_batched`)."""
    op = "matmul" if len(b.shape) == 2 else "matmul_batched"
    return record(op, [a, b], transpose_a=transpose_a, transpose_b=transpose_b)


def _flat_rows(x: Tensor) -> Tensor:
    """[..., C] -> [R, C] (no-op for rank 2)."""
    if len(x.shape) == 2:
        return x
    from .shape import reshape
    return reshape(x, (prod(x.shape[:-1]), x.shape[-1]))


def _vjp_matmul(ins: Sequence[Tensor], out: Tensor, dy: Tensor, attrs: Attrs) -> list[Tensor]:
    a, b = ins
    ta, tb = attrs.get("transpose_a", False), attrs.get("transpose_b", False)
    batched = len(b.shape) > 2
    # dA_logical = dy @ B_logicalᵀ;  dB_logical = A_logicalᵀ @ dy (rows of a flattened).
    if ta:
        da = mm(b, dy, transpose_a=tb, transpose_b=True)      # (dy Bᵀ)ᵀ = B dyᵀ
    else:
        da = mm(dy, b, transpose_b=not tb)
    if batched:
        if tb:
            db = mm(dy, a, transpose_a=True, transpose_b=ta)  # (Aᵀ dy)ᵀ = dyᵀ A
        else:
            db = mm(a, dy, transpose_a=not ta)
    elif ta:  # a is [K, M] and dy is [M, N]
        db = mm(dy, a, transpose_a=True, transpose_b=True) if tb else mm(a, dy)
    else:
        a2, dy2 = _flat_rows(a), _flat_rows(dy)
        db = mm(dy2, a2, transpose_a=True) if tb else mm(a2, dy2, transpose_a=True)
    return [da, db]


# ---- kernels ---------------------------------------------------------------------------
#
# Variants (all bounds-checked, any M, N, K):
#   naive    one thread per output, serial K loop.
#   reduce   one workgroup per output, 256 threads stride K, tree reduction (few outputs,
#            long K: e.g. a small weight gradient contracting a big batch).
#   regsBxC  (CPU rasterisers, ops/linalg_cpu.py) one invocation per BxC block of adjacent
#            outputs, no shared memory, no barriers; `v`, `vk`: operands read as vec4s.
#   tiledBxC shared-memory GEMM (:class:`Tiling`): a (16 B)x(16 C) output tile per
#            workgroup, K chunks staged in workgroup memory, each thread a BxC block, 2
#            barriers per chunk; no bounds checks when the tiles divide M, N and K.
#   tiledBv  the same with the tiles held and read as vec4s (B a multiple of 4).
# Measured on an NVIDIA H200 (Vulkan, f32, 2026-12-04, report.py --matmul): at 4096^3
# tiled8v16 34.6 TFLOP/s, tiled8v 32.1, cuBLAS 51.3; GPT-2's MLP forward 34.4 / 33.4. With
# the k loop of a chunk left as a loop they ran 31.1 / 28.7 and 30.8 / 28.5 (tiled8, scalar
# reads: 24.2 at 4096^3, 24.2 / 21.8 on GPT-2). Reading the tiles as vec4s cuts shared-memory
# loads 4x, which bound the scalar kernel; without the vec4 of padding per k-row the chunk's
# scalar stores conflict (26.3 at 4096^3). With 64 tiles of 128 ([4096, 1024] @ [1024, 256])
# tiled4x8v gives 16.5 (tiled8v16 12.4, tiled4x8 15.2). Smaller tiles win when bigger ones
# leave the GPU idle or pad the output: GPT-2's attention p@v (384 x [256, 256] @ [256, 64])
# runs at 24.1 in 128x64 tiles (tiled8x4v), 17.3 in 64x64 (tiled4); reduce wins below ~8K
# outputs with K >= 256; a prefetch of the next chunk into registers gained nothing, nor did
# it with two staging buffers and one barrier per chunk (33.9 at 4096^3, 16.2 on p@v), nor
# a warp covering 8x4 of the thread grid instead of 16x2 (33.7 at 4096^3).
# Weight gradients with long K are split by passes/split_k.py. On CPU rasterisers (lavapipe)
# barriers are slow: register blocks beat naive 2-5x once M, N >= 32, tiled/reduce lose.

REDUCE_MAX_OUTPUTS = 8_192
REDUCE_MIN_K = 256
FILL_WORKGROUPS = 128   # enough workgroups to keep a large GPU busy
FORCE_VARIANT: str | None = None  # tests and benchmarks pin a variant here
# A tiered start's first-tier matmuls (Target.quick): 4 x 4 register blocks with scalar
# loads, whose code is a quarter of an 8 x 8 block's (on SwiftShader under load the MLP
# compiled in 1.6 s and stepped in 0.1 s with them, 2.4 s and 0.2-1.1 s with naive
# kernels, 2.4 s and 0.02 s untiered). Above QUICK_MAX_MACS multiply-adds a matmul keeps
# its optimized kernel (the addition transformer's step took 17 s instead of 1.5 s with
# every matmul naive).
QUICK_VARIANT = "regs4x4"
QUICK_MAX_MACS = 1 << 22


def choose_variant(spec: MatmulSpec, prefer_tiled: bool, storage: int = 16_384,
                   costly_compiles: bool = False) -> str:
    """Kernel variant for a shape; `prefer_tiled` is False on CPU-emulated GPUs, where
    barriers are slow; `storage`: the device's workgroup memory in bytes (a tiling that
    needs more is passed over); `costly_compiles`: see Target (no unrolled K loop)."""
    if FORCE_VARIANT is not None:
        return FORCE_VARIANT
    if not prefer_tiled:
        return choose_register_block(spec, costly_compiles)
    if spec.outputs <= REDUCE_MAX_OUTPUTS and spec.k >= REDUCE_MIN_K:
        return "reduce"
    if spec.outputs < 1024:
        return "naive"
    for variant, enough in (("tiled8v16", 2 * FILL_WORKGROUPS), ("tiled8v", 2 * FILL_WORKGROUPS),
                            ("tiled8x4v", FILL_WORKGROUPS), ("tiled4x8v", FILL_WORKGROUPS),
                            ("tiled4", FILL_WORKGROUPS), ("tiled2", FILL_WORKGROUPS)):
        t = TILINGS[variant]
        if t.shared_bytes > storage:
            continue
        tiles_m, tiles_n = -(-spec.m // t.tile_m), -(-spec.n // t.tile_n)
        padded = tiles_m * tiles_n * t.tile_m * t.tile_n
        # a tile much bigger than the output (an attention head's 64 x 64) computes padding
        if spec.batch * tiles_m * tiles_n >= enough and padded <= MAX_PADDING * spec.m * spec.n:
            ahead = variant + "p"
            long_k = spec.k >= PREFETCH_MIN_CHUNKS * t.tk
            return ahead if long_k and ahead in TILINGS else variant
    return "tiled1"


def _emit_naive(ctx: EmitContext, s: MatmulSpec) -> Kernel:
    ab, ast = s.a_base("bt", "m")
    bb, bst = s.b_base("bt", "n")
    k_start, k_end = s.k_band("m", 1, "n", 1)
    body = f"""  let n = i % {w.u(s.n)};
  let r = i / {w.u(s.n)};
{split_batch(s, "r", s.m, "m")}
  let ab = {ab};
  let bb = {bb};
  var acc = 0.0f;
  for (var k = {k_start}; k < {k_end}; k = k + 1u) {{
    acc = fma(in0[{at("ab", ast, "k")}], in1[{at("bb", bst, "k")}], acc);
  }}
  out[i] = acc;"""
    return w.thread_kernel(ctx, body, s.outputs)


def _emit_reduce(ctx: EmitContext, s: MatmulSpec) -> Kernel:
    ab, ast = s.a_base("bt", "m")
    bb, bst = s.b_base("bt", "n")
    k_start, k_end = s.k_band("m", 1, "n", 1)
    first = "lid" if k_start == "0u" else f"{k_start} + lid"
    body = f"""  let n = g % {w.u(s.n)};
  let r = g / {w.u(s.n)};
{split_batch(s, "r", s.m, "m")}
  let ab = {ab};
  let bb = {bb};
  var part = 0.0f;
  for (var k = {first}; k < {k_end}; k = k + {w.u(w.WG)}) {{
    part = fma(in0[{at("ab", ast, "k")}], in1[{at("bb", bst, "k")}], part);
  }}
  scratch[lid] = part;
  workgroupBarrier();
  for (var h = {w.u(w.WG // 2)}; h > 0u; h = h >> 1u) {{
    if (lid < h) {{ scratch[lid] = scratch[lid] + scratch[lid + h]; }}
    workgroupBarrier();
  }}
  if (lid == 0u) {{ out[g] = scratch[0]; }}"""
    return w.workgroup_kernel(ctx, body, s.outputs,
                              prelude=f"var<workgroup> scratch: array<f32, {w.WG}>;")


def _tile_header(s: MatmulSpec, tile_m: int, tile_n: int) -> tuple[str, int]:
    tiles_m, tiles_n = -(-s.m // tile_m), -(-s.n // tile_n)
    lines = f"""  let tn = g % {w.u(tiles_n)};
  let r = g / {w.u(tiles_n)};
{split_batch(s, "r", tiles_m, "tm")}
  let tx = lid % 16u;
  let ty = lid / 16u;
  let m0 = tm * {w.u(tile_m)} + ty;
  let n0 = tn * {w.u(tile_n)} + tx;"""
    return lines, s.batch * tiles_m * tiles_n


def _block_store(s: MatmulSpec, bm: int, bn: int, checked: bool = True) -> str:
    """Each thread's bm x bn block `c{r}_{c}` to rows m0 + 16 r, cols n0 + 16 c (`checked`:
    skipping those outside M, N)."""
    lines = []
    off = f"bt * {w.u(s.m * s.n)} + " if s.batch > 1 else ""
    for r in range(bm):
        row = f"m0 + {w.u(16 * r)}" if r else "m0"
        if checked:
            lines.append(f"  if ({row} < {w.u(s.m)}) {{")
        for c in range(bn):
            col = f"n0 + {w.u(16 * c)}" if c else "n0"
            store = f"out[{off}({row}) * {w.u(s.n)} + {col}] = c{r}_{c};"
            lines.append(f"    if ({col} < {w.u(s.n)}) {{ {store} }}" if checked else f"  {store}")
        if checked:
            lines.append("  }")
    return "\n".join(lines)


@dataclass(frozen=True)
class Tiling:
    """A shared-memory GEMM: a (16 bm) x (16 bn) output tile per workgroup of 16x16 threads,
    each thread a bm x bn register block (rows ty + 16 r, cols tx + 16 c); K staged in
    chunks of `tk`."""

    bm: int
    bn: int
    tk: int
    vec: bool = False  # shared memory read as vec4s: rows 64 q + 4 ty + i, cols 64 q + 4 tx + j
    # the next chunk's global loads issued before this chunk's multiply (vec tilings)
    prefetch: bool = False

    @property
    def tile_m(self) -> int:
        return 16 * self.bm

    @property
    def tile_n(self) -> int:
        return 16 * self.bn

    @property
    def shared_bytes(self) -> int:
        """Workgroup memory of the two staged tiles (each k-row padded by a vec4 when
        `vec`, by a float otherwise)."""
        pad = 4 if self.vec else 1
        return 4 * self.tk * (self.tile_m + self.tile_n + 2 * pad)


# name -> tiling. "tiledB" are square B x B blocks; "tiledBxC" B x C.
TILINGS = {
    "tiled1": Tiling(1, 1, 16), "tiled2": Tiling(2, 2, 16), "tiled4": Tiling(4, 4, 16),
    "tiled8": Tiling(8, 8, 8), "tiled8x4": Tiling(8, 4, 16), "tiled4x8": Tiling(4, 8, 16),
    "tiled8v": Tiling(8, 8, 8, vec=True), "tiled8v16": Tiling(8, 8, 16, vec=True),
    "tiled4x8v": Tiling(4, 8, 16, vec=True), "tiled8x4v": Tiling(8, 4, 16, vec=True),
    # "...p": the same tiling with the next chunk's loads issued before the multiply
    "tiled8v16p": Tiling(8, 8, 16, vec=True, prefetch=True),
    "tiled8x4vp": Tiling(8, 4, 16, vec=True, prefetch=True),
    "tiled4x8vp": Tiling(4, 8, 16, vec=True, prefetch=True),
}
# A K loop of at least this many chunks takes a tiling's prefetching twin ("...p"). On an
# H100 (2026-12-05) prefetching gained 2-10% on GPT-2 small's long-K products (4096^3
# 34.7 -> 36.9 TFLOP/s; its attention p@v, K = 256, 24.0 -> 25.7 with 128x64 tiles) and
# lost 3% on its q@k^T (K = 64, four chunks).
PREFETCH_MIN_CHUNKS = 8


VARIANTS = ("naive", "reduce", *TILINGS, *REGISTER_BLOCKS)


def _tile_loads(s: MatmulSpec, t: Tiling, operand: str, aligned: bool, kvar: str = "k0"
                ) -> tuple[list[str], list[str]]:
    """(lines before the K loop, per-chunk assignments to registers `{operand}v{j}` of the
    chunk starting at `kvar`, without `let` or `var`) for operand "a" or "b" of tiling `t`.
    Each thread loads tile*tk/256 values, coalesced along the stored operand's contiguous
    axis."""
    is_a = operand == "a"
    tile = t.tile_m if is_a else t.tile_n
    size, inp = (s.m, "in0") if is_a else (s.n, "in1")
    contiguous_rows = s.ta if is_a else not s.tb   # stored [K, rows]: rows contiguous
    if s.a_swapped if is_a else s.b_swapped:  # read through a permute: the other axis is
        contiguous_rows = not contiguous_rows
    base_fn = s.a_base if is_a else s.b_base
    o0 = "gm0" if is_a else "gn0"
    pre, loads = [], []
    for j in range(tile * t.tk // w.WG):
        e = f"lid + {w.u(w.WG * j)}" if j else "lid"
        x, k = f"{operand}x{j}", f"{operand}k{j}"
        if contiguous_rows:
            pre += [f"  let {k} = ({e}) / {w.u(tile)};", f"  let {x} = ({e}) % {w.u(tile)};"]
        else:
            pre += [f"  let {x} = ({e}) / {w.u(t.tk)};", f"  let {k} = ({e}) % {w.u(t.tk)};"]
        row = f"({o0} + {x})" if aligned else f"min({o0} + {x}, {w.u(size - 1)})"
        base, step = base_fn("bt", row)
        pre.append(f"  let {operand}i{j} = {base};")
        if aligned:
            loads.append(f"{operand}v{j} = "
                         f"{inp}[{at(f'{operand}i{j}', step, f'({kvar} + {k})')}];")
        else:
            pre.append(f"  let {operand}ok{j} = {o0} + {x} < {w.u(size)};")
            kk = f"min({kvar} + {k}, {w.u(s.k - 1)})"
            loads.append(f"{operand}v{j} = select(0.0f, "
                         f"{inp}[{at(f'{operand}i{j}', step, kk)}], "
                         f"{operand}ok{j} && {kvar} + {k} < {w.u(s.k)});")
    return pre, loads


def _unrolled(tk: int, step: Callable[[str], list[str]]) -> list[str]:
    """The multiply over one staged chunk, its `tk` steps written out (`step(kk)` gives step
    kk's lines, `kk` a WGSL literal, the k-row of the staged tiles): shared-memory offsets
    become constants. On an H200 this ran 11-17% faster than the loop (4096^3: 31.1 -> 34.6
    TFLOP/s). The tiles are arrays of k-rows, read as `As[kk][...]`: a constant outer
    index needs no bounds check, and the row's clamped index (the same at every kk) is
    computed once, so the reads keep constant offsets where bounds checks are compiled in
    (on an H100 with wgpu's bounds checks GPT-2 small's step 204.6 -> 191.2 ms against
    flat tiles, where one clamp per read cost as much as no checks at all saved)."""
    return [line for kk in range(tk) for line in ["    {", *step(w.u(kk)), "    }"]]


def _emit_tiled(ctx: EmitContext, s: MatmulSpec, t: Tiling) -> Kernel:
    """A shared-memory GEMM (see :class:`Tiling`); bounds checks are left out when the tile
    and chunk sizes divide M, N and K."""
    pad_m, pad_n = t.tile_m + 1, t.tile_n + 1
    aligned = s.m % t.tile_m == 0 and s.n % t.tile_n == 0 and s.k % t.tk == 0
    head, groups = _tile_header(s, t.tile_m, t.tile_n)
    lines = [head, f"  let gm0 = tm * {w.u(t.tile_m)};", f"  let gn0 = tn * {w.u(t.tile_n)};"]
    pre_a, load_a = _tile_loads(s, t, "a", aligned)
    pre_b, load_b = _tile_loads(s, t, "b", aligned)
    lines += pre_a + pre_b
    lines += [f"  var c{r}_{c} = 0.0f;" for r in range(t.bm) for c in range(t.bn)]
    stores = [f"    As[ak{j}][ax{j}] = av{j};" for j in range(len(load_a))]
    stores += [f"    Bs[bk{j}][bx{j}] = bv{j};" for j in range(len(load_b))]

    def step(kk: str) -> list[str]:
        lines = [f"      let a{r} = As[{kk}][ty + {w.u(16 * r)}];" for r in range(t.bm)]
        lines += [f"      let b{c} = Bs[{kk}][tx + {w.u(16 * c)}];" for c in range(t.bn)]
        lines += [f"      c{r}_{c} = fma(a{r}, b{c}, c{r}_{c});"
                  for r in range(t.bm) for c in range(t.bn)]
        return lines

    multiply = _unrolled(t.tk, step)
    k_start, k_end = s.k_band("gm0", t.tile_m, "gn0", t.tile_n)
    lines.append(f"  for (var k0 = {k_start}; k0 < {k_end}; k0 = k0 + {w.u(t.tk)}) {{")
    lines += [f"    let {x}" for x in load_a + load_b]
    lines += stores + ["    workgroupBarrier();"]
    lines += multiply + ["    workgroupBarrier();", "  }"]
    lines.append(_block_store(s, t.bm, t.bn, checked=not aligned))
    prelude = (f"var<workgroup> As: array<array<f32, {pad_m}>, {t.tk}>;\n"
               f"var<workgroup> Bs: array<array<f32, {pad_n}>, {t.tk}>;")
    return w.workgroup_kernel(ctx, "\n".join(lines), groups, prelude=prelude)


def _emit_tiled_vec(ctx: EmitContext, s: MatmulSpec, t: Tiling) -> Kernel:
    """The shared-memory GEMM with its tiles held as vec4s: each thread reads bm/4 + bn/4
    vec4s per k instead of bm + bn scalars (shared-memory bandwidth bounds the scalar
    kernel on large GPUs) and accumulates in vec4s. Thread (tx, ty) owns rows
    64 q + 4 ty + i and cols 64 q + 4 tx + j; a row of a tile is padded by one vec4, so the
    chunk's scalar stores fall in distinct banks."""
    pad_a, pad_b = t.tile_m // 4 + 1, t.tile_n // 4 + 1
    aligned = s.m % t.tile_m == 0 and s.n % t.tile_n == 0 and s.k % t.tk == 0
    head, groups = _tile_header(s, t.tile_m, t.tile_n)
    lines = [head, f"  let gm0 = tm * {w.u(t.tile_m)};", f"  let gn0 = tn * {w.u(t.tile_n)};"]
    lines += [f"  var c{r}_{q} = vec4<f32>(0.0f);" for r in range(t.bm) for q in range(t.bn // 4)]
    lines += _vec_chunks(s, t, aligned)
    lines += _vec_block_store(s, t, aligned)
    prelude = (f"var<workgroup> As: array<array<vec4<f32>, {pad_a}>, {t.tk}>;\n"
               f"var<workgroup> Bs: array<array<vec4<f32>, {pad_b}>, {t.tk}>;")
    return w.workgroup_kernel(ctx, "\n".join(lines), groups, prelude=prelude)


def _vec_chunks(s: MatmulSpec, t: Tiling, aligned: bool) -> list[str]:
    """The K loop of :func:`_emit_tiled_vec`: stage a chunk, multiply it. With `prefetch`
    the next chunk's global loads are issued before the multiply, their latency hidden
    behind it (two staged copies with one barrier per chunk were no faster on an H200 or
    an H100)."""
    k_start, k_end = s.k_band("gm0", t.tile_m, "gn0", t.tile_n)
    ahead = t.prefetch
    kvar = "kn" if ahead else "k0"
    pre_a, load_a = _tile_loads(s, t, "a", aligned, kvar)
    pre_b, load_b = _tile_loads(s, t, "b", aligned, kvar)
    lines = pre_a + pre_b
    stores = [f"    As[ak{j}][ax{j} / 4u][ax{j} % 4u] = av{j};" for j in range(len(load_a))]
    stores += [f"    Bs[bk{j}][bx{j} / 4u][bx{j} % 4u] = bv{j};" for j in range(len(load_b))]

    def step(kk: str) -> list[str]:
        lines = [f"      let a{q} = As[{kk}][ty + {w.u(16 * q)}];" for q in range(t.bm // 4)]
        lines += [f"      let b{q} = Bs[{kk}][tx + {w.u(16 * q)}];" for q in range(t.bn // 4)]
        lines += [f"      c{r}_{q} = fma(vec4<f32>(a{r // 4}.{'xyzw'[r % 4]}), b{q}, c{r}_{q});"
                  for r in range(t.bm) for q in range(t.bn // 4)]
        return lines

    multiply = _unrolled(t.tk, step)
    if ahead:
        lines += [f"  var kn = {k_start};", *(f"  var {x}" for x in load_a + load_b)]
    lines.append(f"  for (var k0 = {k_start}; k0 < {k_end}; k0 = k0 + {w.u(t.tk)}) {{")
    if not ahead:
        lines += [f"    let {x}" for x in load_a + load_b]
    lines += stores + ["    workgroupBarrier();"]
    if ahead:
        lines += [f"    kn = k0 + {w.u(t.tk)};", f"    if (kn < {k_end}) {{",
                  *(f"      {x}" for x in load_a + load_b), "    }"]
    lines += [*multiply, "    workgroupBarrier();"]
    return [*lines, "  }"]


def _vec_block_store(s: MatmulSpec, t: Tiling, aligned: bool) -> list[str]:
    """Each thread's vec4 accumulators to rows 64 q + 4 ty + i, cols 64 q + 4 tx + j."""
    lines = []
    off = f"bt * {w.u(s.m * s.n)} + " if s.batch > 1 else ""
    for r in range(t.bm):
        row = f"gm0 + {w.u(64 * (r // 4) + r % 4)} + 4u * ty"
        lines.append(f"  let row{r} = {row};")
        if not aligned:
            lines.append(f"  if (row{r} < {w.u(s.m)}) {{")
        for q in range(t.bn // 4):
            for j in range(4):
                col = f"gn0 + {w.u(64 * q + j)} + 4u * tx"
                store = f"out[{off}row{r} * {w.u(s.n)} + {col}] = c{r}_{q}.{'xyzw'[j]};"
                lines.append(f"    if ({col} < {w.u(s.n)}) {{ {store} }}" if not aligned
                             else f"  {store}")
        if not aligned:
            lines.append("  }")
    return lines


def emit_matmul(ctx: EmitContext, spec: MatmulSpec, variant: str) -> Kernel:
    """The WGSL kernel of one matmul for `variant` (one of :data:`VARIANTS`)."""
    if variant == "naive":
        return _emit_naive(ctx, spec)
    if variant == "reduce":
        return _emit_reduce(ctx, spec)
    if variant in TILINGS:
        t = TILINGS[variant]
        return (_emit_tiled_vec if t.vec else _emit_tiled)(ctx, spec, t)
    if variant in REGISTER_BLOCKS:
        return emit_registers(ctx, spec, REGISTER_BLOCKS[variant])
    raise ValueError(f"unknown matmul kernel variant {variant!r}")


def _emit(ctx: EmitContext) -> Kernel:
    a = ctx.inputs[0]
    ta = ctx.node.attrs.get("transpose_a", False)
    tb = ctx.node.attrs.get("transpose_b", False)
    m, k = _logical(a.shape, ta)
    n = ctx.node.shape[-1]
    batched = ctx.node.op == "matmul_batched"
    if batched:
        batch = prod(a.shape[:-2])
    else:
        batch, m = 1, prod(ctx.node.shape[:-1])  # lhs leading dims flattened into rows
    spec = MatmulSpec(batch, m, k, n, ta, tb, b_batched=batched,
                      zeros_a=ctx.node.attrs.get("zeros_a"),
                      zeros_b=ctx.node.attrs.get("zeros_b"),
                      a_swapped=0 in ctx.swapped_reads, b_swapped=1 in ctx.swapped_reads)
    quick = ctx.target.quick and FORCE_VARIANT is None
    if quick and spec.batch * spec.m * spec.n * spec.k <= QUICK_MAX_MACS:
        return emit_matmul(ctx, spec, QUICK_VARIANT)  # a tiered start's first kernels
    storage = ctx.target.limits.max_compute_workgroup_storage_size
    kernel = emit_matmul(ctx, spec, choose_variant(spec, not ctx.target.software, storage,
                                                   ctx.target.costly_compiles))
    return replace(kernel, quick_refused=True) if quick else kernel


# Each operand element is read many times (once per output row or column tile), so a
# prologue is held to one arithmetic op (a permute, a scale, a relu mask). On a software
# target a plain matmul reads a permuted operand from a kernel of its own: on SwiftShader the
# addition transformer's step took ~375 ms instead of ~480 (its projections of merged
# heads ran 2-4x slower with the permute in their reads); the attention's batched matmuls
# gained nothing from the same change and keep their permutes.
MATMUL_STITCH = Stitch(prologue=(0, 1), prologue_ops=1, epilogue=True)
PLAIN_MATMUL_STITCH = replace(MATMUL_STITCH, software_permutes=False)


def _torch_matmul(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    x, y = a
    if n.attrs.get("transpose_a"):
        x = tx.method(x, "transpose(-2, -1)")
    if n.attrs.get("transpose_b"):
        y = tx.method(y, "transpose(-2, -1)")
    return tx.binary(x, "@", y, tx.MUL)


define("matmul", infer=_infer_matmul, ref=_ref_matmul, vjp=_vjp_matmul, emit=_emit,
       doc="[..., M, K] @ [K, N] -> [..., M, N] (lhs leading dims flattened into rows).",
       stitch=PLAIN_MATMUL_STITCH, torch=_torch_matmul)
define("matmul_batched", infer=_infer_matmul_batched, ref=_ref_matmul, vjp=_vjp_matmul,
       emit=_emit, doc="[..., M, K] @ [..., K, N] -> [..., M, N] with equal batch dims.",
       stitch=MATMUL_STITCH, torch=_torch_matmul)


@public
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product (f32). `b` rank 2: `[..., M, K] @ [K, N] -> [..., M, N]`; `b` rank > 2:
    equal ranks and exactly equal batch dims, `[..., M, K] @ [..., K, N]`."""
    for side, t in (("lhs", a), ("rhs", b)):
        if not isinstance(t, Tensor):
            raise ShapeError("matmul", f"{side} must be a Tensor, got {type(t).__name__}")
    return mm(a, b)


__all__ = ["matmul", "mm"]
