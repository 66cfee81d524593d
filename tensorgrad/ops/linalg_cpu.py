"""Matmul kernels for CPU rasterisers (lavapipe, SwiftShader): register blocks.

One invocation per bm x bn block of adjacent outputs; no shared memory and no barriers, which
are dear there (~200 µs per 256-wide workgroup on SwiftShader). Every storage load is a
per-lane gather whatever its pattern, so on lavapipe a kernel costs what its loads cost:
bm + bn scalar loads per bm * bn multiply-adds. Variants (`regs{bm}x{bn}` and suffixes):

- no suffix: scalar loads.
- `v`: an operand stored with its rows (A transposed) or columns (B) contiguous is read as
  vec4s wherever M (N) and the block are multiples of 4; same code size.
- `vk`: besides, an operand stored with K contiguous (A, or B transposed) is read as vec4s
  along K when K is a multiple of 4, the loop stepping K four at a time (the code of four
  steps written out).

Measured on lavapipe (2 cores; [1024, 64] @ [64, 256] and [1024, 256] @ [256, 64], 8 x 8
blocks): 7.9 / 7.4 GFLOP/s scalar, 13.2 / 13.1 `v`, 15.5 / 17.1 `vk`; the addition
transformer 6.9 / 7.7 -> 10.0 / 9.1 steps/s with `vk` (alternating runs). On SwiftShader
in Chromium the same shapes ran 3.7 / 3.8 GFLOP/s scalar, 3.6 / 3.7 `v`, 4.3 / 4.4 `vk`,
but `vk` doubled the shader compile time (65-90 -> 135-180 ms a kernel; the transformer's
kernels 2.7 -> 5.4 s): targets whose compiles are dear (:attr:`Target.costly_compiles`)
take `v`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from .matmul_spec import MAX_PADDING, MatmulSpec, at, split_batch

CPU_WORKGROUP = 32      # invocations per workgroup
CPU_MIN_WORKGROUPS = 2  # workgroups a block size must leave (cores to share)
_LANES = "xyzw"


@dataclass(frozen=True)
class RegisterBlock:
    """bm x bn outputs per invocation; `vec`: operands with contiguous rows (columns) read
    as vec4s where aligned; `along_k`: operands with K contiguous too (the loop unrolled)."""

    bm: int
    bn: int
    vec: bool = False
    along_k: bool = False

    @property
    def suffix(self) -> str:
        return ("v" if self.vec else "") + ("k" if self.along_k else "")


# Block sizes in the order the chooser tries them. Larger blocks gain little more on
# lavapipe: 8 x 16 ran 3% faster than 8 x 8 (`vk`, whose unrolled K loop makes 16 x 8 code
# large). Column and row blocks serve a matrix-vector product (N or M of 1, a head's or a
# bias-free layer's weight gradient): on SwiftShader the MLP's [256, 64] @ [64, 1], its
# [64, 256] @ [256, 1] and [1, 256] @ [256, 64] ran in 0.03-0.08 ms as 8 x 1, 4 x 1 or
# 1 x 8 blocks against 0.14-0.22 ms naive, a thread per output.
_SIZES = ((8, 8), (4, 8), (8, 4), (4, 4), (8, 1), (1, 8), (4, 1), (1, 4))
# Where compiles are dear (SwiftShader, `v` blocks) 16 x 8 comes first: it ran 5-18%
# faster on the addition transformer's shapes in Chromium ([1024, 64] @ [64, 256] 5.0 ->
# 5.7 GFLOP/s, its down projection 5.7 -> 6.7, their weight gradients 6.4 -> 7.5) and
# compiles in about twice the time (~60 ms against ~33 a kernel, its outputs stored in one
# loop); 16 x 16, 24 x 8 and 32 x 4 ran 30-65% slower.
_SIZES_COSTLY = ((16, 8), *_SIZES)
REGISTER_BLOCKS = {f"regs{a}x{b}{blk.suffix}": blk
                   for vec, along_k in ((True, True), (True, False), (False, False))
                   for a, b in _SIZES_COSTLY for blk in (RegisterBlock(a, b, vec, along_k),)}


def choose_register_block(spec: MatmulSpec, costly_compiles: bool = False) -> str:
    """The largest vec4-reading block (the `vk` kind; where compiles are dear the `v` kind,
    16 x 8 first) that pads the output by at most MAX_PADDING and leaves at least
    CPU_MIN_WORKGROUPS workgroups; with too few blocks to share out, the largest that fits;
    "naive" where none fits (a dot product); measured on lavapipe and SwiftShader, 8 x 8
    blocks ran 2-6x faster than 16-apart 4 x 4 ones. A K past lavapipe's loop budget takes
    the tiled kernel, whose K loop steps 16 at a time (checked there up to K = 150,000)."""
    if spec.k > w.SOFTWARE_SERIAL_MAX_LENGTH:
        return "tiled1"
    fitting = []
    for bm, bn in _SIZES_COSTLY if costly_compiles else _SIZES:
        blocks = spec.batch * -(-spec.m // bm) * -(-spec.n // bn)
        if blocks * bm * bn <= MAX_PADDING * spec.outputs:
            name = f"regs{bm}x{bn}{'v' if costly_compiles else 'vk'}"
            if blocks >= CPU_MIN_WORKGROUPS * CPU_WORKGROUP:
                return name
            fitting.append(name)
    return fitting[0] if fitting else "naive"


@dataclass(frozen=True)
class _Operand:
    """How one operand's `count` values per step of k (rows of A, columns of B) are read.
    `axis`: "k" (vec4s along K), "rows" (vec4s along the rows or columns) or None
    (scalars)."""

    name: str                            # "a" or "b"
    binding: str                         # "in0" or "in1"
    count: int                           # bm or bn
    size: int                            # M or N
    origin: str                          # "m0" or "n0"
    base: Callable[[str, str], tuple[str, str]]   # MatmulSpec.a_base or b_base
    axis: str | None

    def position(self, j: int) -> str:
        """Row (column) j of the block, clamped into range when blocks overhang."""
        pos = f"{self.origin} + {w.u(j)}" if j else self.origin
        return f"min({pos}, {w.u(self.size - 1)})" if self.size % self.count else f"({pos})"

    def setup(self) -> list[str]:
        """Lines before the K loop: each read's base index (vec4 indices for vectors)."""
        p = self.name
        if self.axis == "rows":  # stored [K, size]: element (k, x) at off + k * size + x
            off = self.base("bt", "0u")[0]
            lines = []
            for q in range(self.count // 4):
                quad = f"{self.origin} / 4u + {w.u(q)}"
                if self.size % self.count:
                    quad = f"min({quad}, {w.u(self.size // 4 - 1)})"
                lines.append(f"  let {p}q{q} = ({off}) / 4u + {quad};")
            return lines
        suffix = " / 4u" if self.axis == "k" else ""
        return [f"  let {p}b{j} = ({self.base('bt', self.position(j))[0]}){suffix};"
                for j in range(self.count)]

    def loads(self, kk: int | None) -> list[str]:
        """Loads at step kk of the unrolled k loop (None: once per loop iteration)."""
        p, k = self.name, f"(k + {w.u(kk)})" if kk else "k"
        if self.axis == "k":
            return [] if kk is not None else [
                f"    let {p}{j} = {self.binding}[{p}b{j} + k / 4u];" for j in range(self.count)]
        if kk is None:
            return []
        if self.axis == "rows":
            return [f"    let {p}{kk}_{q} = {self.binding}[{p}q{q} + {k} * "
                    f"{w.u(self.size // 4)}];" for q in range(self.count // 4)]
        step = self.base("bt", "0u")[1]
        return [f"    let {p}{kk}_{j} = {self.binding}[{at(f'{p}b{j}', step, k)}];"
                for j in range(self.count)]

    def value(self, j: int, kk: int) -> str:
        """Row (column) j of the block at step kk, as a WGSL expression."""
        p = self.name
        if self.axis == "k":
            return f"{p}{j}.{_LANES[kk]}"
        if self.axis == "rows":
            return f"{p}{kk}_{j // 4}.{_LANES[j % 4]}"
        return f"{p}{kk}_{j}"


def _vector_axis(block: RegisterBlock, rows_contiguous: bool, k: int, size: int, count: int
                 ) -> str | None:
    if rows_contiguous:
        return "rows" if block.vec and size % 4 == 0 and count % 4 == 0 else None
    return "k" if block.along_k and k % 4 == 0 else None


# Outputs per block from which a target whose compiles are dear (SwiftShader) stores them in
# a loop over a private array, unless it compiles in the background (a tiered start's second
# tier): a stitched epilogue is then compiled once, not at each store. On SwiftShader the
# addition transformer's 49 pipelines compiled in ~1.1 s instead of ~2.1 s one after
# another, its step as fast (290-300 ms, alternated runs); the MLP's step was 2-4% slower
# (tiered, so its steady kernels keep their stores written out).
STORE_LOOP_MIN = 16


def _stores(s: MatmulSpec, bm: int, bn: int) -> list[str]:
    """The block's outputs `c{r}_{c}`, one store each (those outside M, N skipped)."""
    lines = []
    off = f"bt * {w.u(s.m * s.n)} + " if s.batch > 1 else ""
    for r in range(bm):
        if s.m % bm:
            lines.append(f"  if (m0 + {w.u(r)} < {w.u(s.m)}) {{")
        for c in range(bn):
            store = f"out[{off}(m0 + {w.u(r)}) * {w.u(s.n)} + n0 + {w.u(c)}] = c{r}_{c};"
            lines.append(f"    if (n0 + {w.u(c)} < {w.u(s.n)}) {{ {store} }}" if s.n % bn
                         else f"    {store}")
        if s.m % bm:
            lines.append("  }")
    return lines


def _store_loop(s: MatmulSpec, bm: int, bn: int) -> list[str]:
    """The block's outputs stored from a private array in one loop (one store in the code)."""
    off = f"bt * {w.u(s.m * s.n)} + " if s.batch > 1 else ""
    values = ", ".join(f"c{r}_{c}" for r in range(bm) for c in range(bn))
    check = ([f"rr < {w.u(s.m)}"] if s.m % bm else []) + ([f"cc < {w.u(s.n)}"] if s.n % bn
                                                         else [])
    store = f"out[{off}rr * {w.u(s.n)} + cc] = acc[e];"
    return [f"  var acc = array<f32, {bm * bn}>({values});",
            f"  for (var e = 0u; e < {w.u(bm * bn)}; e = e + 1u) {{",
            f"    let rr = m0 + e / {w.u(bn)};", f"    let cc = n0 + e % {w.u(bn)};",
            f"    if ({' && '.join(check)}) {{ {store} }}" if check else f"    {store}", "  }"]


def emit_registers(ctx: EmitContext, s: MatmulSpec, block: RegisterBlock) -> Kernel:
    """The register-block kernel of `s` (see the module docstring). Input slots read as
    vec4s are bound as `array<vec4<f32>>` (the kernel's `vector_inputs`)."""
    bm, bn = block.bm, block.bn
    a = _Operand("a", "in0", bm, s.m, "m0", s.a_base,
                 _vector_axis(block, s.ta, s.k, s.m, bm))
    b = _Operand("b", "in1", bn, s.n, "n0", s.b_base,
                 _vector_axis(block, not s.tb, s.k, s.n, bn))
    # Vec4s along K step the loop 4 at a time (a zero band's ends are multiples of bm, bn or
    # K, so 4-aligned then).
    step = 4 if "k" in (a.axis, b.axis) else 1
    blocks_m, blocks_n = -(-s.m // bm), -(-s.n // bn)
    lines = [f"  let nb = i % {w.u(blocks_n)};", f"  let r = i / {w.u(blocks_n)};",
             split_batch(s, "r", blocks_m, "mb"),
             f"  let m0 = mb * {w.u(bm)};", f"  let n0 = nb * {w.u(bn)};",
             *a.setup(), *b.setup()]
    lines += [f"  var c{r}_{c} = 0.0f;" for r in range(bm) for c in range(bn)]
    k_start, k_end = s.k_band("m0", bm, "n0", bn)
    lines.append(f"  for (var k = {k_start}; k < {k_end}; k = k + {w.u(step)}) {{")
    lines += a.loads(None) + b.loads(None)
    for kk in range(step):
        lines += a.loads(kk) + b.loads(kk)
        lines += [f"    c{r}_{c} = fma({a.value(r, kk)}, {b.value(c, kk)}, c{r}_{c});"
                  for r in range(bm) for c in range(bn)]
    lines.append("  }")
    t = ctx.target
    store = _store_loop if t.costly_compiles and not t.background and bm * bn >= STORE_LOOP_MIN \
        else _stores
    lines += store(s, bm, bn)
    vectors = frozenset(slot for slot, op in enumerate((a, b)) if op.axis is not None)
    return w.thread_kernel(ctx, "\n".join(lines), s.batch * blocks_m * blocks_n,
                           size=CPU_WORKGROUP, vector_inputs=vectors)


__all__ = ["CPU_MIN_WORKGROUPS", "CPU_WORKGROUP", "REGISTER_BLOCKS", "RegisterBlock",
           "choose_register_block", "emit_registers"]
