"""Register-tiled convolution kernels for software targets (CPU rasterisers): conv2d and its
input gradient share one emitter, the weight gradient has its own (see the comment below).
:mod:`.conv` chooses them over its direct kernels where :func:`_tiled` says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..ir import Shape
from .window import Pair, _cdiv, _in_range, _masked, _split

# ---- register-tiled kernels (software targets) ------------------------------------------
#
# On CPU rasterisers (lavapipe, SwiftShader) arithmetic runs 8 lanes wide but every storage
# buffer load is a per-lane scalar loop, so a kernel costs its loads per multiply-add. The
# direct kernels above do 2 loads per multiply-add; these give each thread a block of outputs
# and reuse every loaded value from registers. conv2d and its input gradient share one
# emitter (a thread: `chans` channels x `rows` x `cols` adjacent outputs; neighbouring taps
# share the source values along a row); the weight gradient gives each workgroup a block of
# output channels x taps for one input channel, its threads splitting the batch x pixel sum
# (one barrier, before the final reduction). Taps are unrolled, so kernels with more than
# TILED_MAX_TAPS taps keep the direct kernels. Measured on a 2-core machine (mnist_cnn
# conv2, B=64, 2026-12): lavapipe 0.07 -> 1.2-2 G multiply-adds/s for all three kernels
# (454 -> 30 ms forward, 600 -> 48 ms weight gradient); SwiftShader (Subzero) 0.01-0.09 ->
# 0.5-0.7, at ~0.6 s instead of ~30 ms to compile a 3x3 forward. Hardware targets keep the
# direct kernels (not measured there).

TILED_MAX_TAPS = 121
TILE_MAX_FMAS = 2_048    # multiply-adds per loop iteration: bounds code size and compile time
TILE_MAX_OUTPUTS = 128   # accumulators per thread
TILE_MAX_RUN = 8         # adjacent outputs along a row (channels) per thread
TILE_MAX_ROWS = 4
WGRAD_THREADS = 32
WGRAD_MAX_ACCS = 128     # WGRAD_THREADS x WGRAD_MAX_ACCS f32 partial sums: 16 KiB of shared
                         # memory; at least TILED_MAX_TAPS (one channel's taps)
WGRAD_MIN_GROUPS = 8     # fewer weight blocks per channel block when that leaves cores idle


def _run(size: int, most: int, step: int = 1) -> int:
    """Positions per thread along an axis of `size`: a multiple of `step`, at most `most` (but
    at least `step`), splitting the axis into as few runs as that allows, evenly."""
    runs = _cdiv(size, max(step, most - most % step))
    return step * _cdiv(_cdiv(size, runs), step)


def _name(offset: int) -> str:
    return str(offset) if offset >= 0 else f"m{-offset}"


@dataclass(frozen=True)
class _Axis:
    """One spatial axis of a tiled kernel: a thread covers outputs p0 + t for t < `run`; tap k
    of output t reads source position `base` + reads[(t, k)] (a pair not in `reads`
    contributes nothing). `base` is a WGSL i32 expression in p0; `size` is the source extent
    (positions outside it are zero padding)."""

    run: int
    reads: dict[tuple[int, int], int]
    base: str
    size: int

    @property
    def offsets(self) -> list[int]:
        return sorted(set(self.reads.values()))

    def hoist(self, tag: str, scale: int) -> list[str]:
        """WGSL lines: for each offset e, `{tag}{e}` (the clamped source position times
        `scale`, u32) and `v{tag}{e}` (whether it lies inside the source)."""
        lines = [f"  let {tag}0_ = {self.base};"]
        for e in self.offsets:
            pos, n = f"{tag}0_ + {e}i", _name(e)
            scaled = "" if scale == 1 else f" * {w.u(scale)}"
            lines.append(f"  let {tag}{n} = u32(clamp({pos}, 0i, {self.size - 1}i)){scaled};")
            lines.append(f"  let v{tag}{n} = {_in_range(pos, self.size)};")
        return lines


def _gather_axis(run: int, taps: int, stride: int, pad: int, size: int, p0: str) -> _Axis:
    """conv2d: output p reads source p*stride + k - pad."""
    reads = {(t, k): t * stride + k for t in range(run) for k in range(taps)}
    return _Axis(run, reads, f"i32({p0} * {w.u(stride)}) - {pad}i", size)


def _scatter_axis(run: int, taps: int, stride: int, pad: int, size: int, p0: str) -> _Axis:
    """The input gradient: position p gathers the outputs q with q*stride + k - pad = p. With
    p0 and `run` multiples of the stride, which taps exist is the same for every thread."""
    reads = {(t, k): (t + pad - k) // stride for t in range(run) for k in range(taps)
             if (t + pad - k) % stride == 0}
    return _Axis(run, reads, f"i32({p0} / {w.u(stride)})", size)


@dataclass(frozen=True)
class _Correlation:
    """out[b, q, y, x] = sum over l < `loop` and taps (ki, kj) of
    weight[g*group_stride + q'*q_stride + l*l_stride + ki*kW + kj] * src[b, g*loop + l, ...]
    where q = g*per_group + q' (group g): conv2d (q an output channel, l an input channel)
    and its input gradient (q an input channel, l an output channel). `src`, `weight`: the
    bindings; `src_shape` [B, C, H, W]."""

    src: str
    weight: str
    src_shape: Shape
    per_group: int
    loop: int
    q_stride: int
    l_stride: int
    group_stride: int
    kernel: Pair


def _tile_sizes(out_hw: Sequence[int], per_group: int, taps: int, steps: Pair
                ) -> tuple[int, int, int]:
    """(channels, rows, cols) of outputs per thread; rows and cols multiples of `steps`."""
    budget = max(1, min(TILE_MAX_OUTPUTS, TILE_MAX_FMAS // taps))
    cols = _run(out_hw[1], min(TILE_MAX_RUN, budget), steps[1])
    chans = _run(per_group, max(1, min(TILE_MAX_RUN, budget // cols)))
    rows = _run(out_hw[0], max(1, min(TILE_MAX_ROWS, budget // (cols * chans))), steps[0])
    return chans, rows, cols


def _tap_block(c: _Correlation, rows: _Axis, cols: _Axis, chans: int, ki: int) -> list[str]:
    """WGSL for kernel row `ki` inside the loop over l: load the source values and weights it
    uses, then every multiply-add of the tile."""
    kw = c.kernel[1]
    live = [r for r in range(rows.run) if (r, ki) in rows.reads]
    if not live:
        return []
    lines = ["    {"]
    for er in sorted({rows.reads[(r, ki)] for r in live}):
        for ec in cols.offsets:
            nr, nc = _name(er), _name(ec)
            load = f"{c.src}[sl + rr{nr} + cc{nc}]"
            lines.append(f"      let s{nr}_{nc} = {_masked(load, f'vrr{nr} && vcc{nc}')};")
    for j in range(chans):
        for kj in range(kw):
            lines.append(f"      let w{j}_{kj} = {c.weight}[wq{j} + wl + {w.u(ki * kw + kj)}];")
    for j in range(chans):
        for r in live:
            row = _name(rows.reads[(r, ki)])
            for t in range(cols.run):
                for kj in range(kw):
                    if (t, kj) in cols.reads:
                        s = f"s{row}_{_name(cols.reads[(t, kj)])}"
                        lines.append(f"      a{j}_{r}_{t} = fma({s}, w{j}_{kj}, a{j}_{r}_{t});")
    lines.append("    }")
    return lines


def _emit_correlation(ctx: EmitContext, c: _Correlation, rows: _Axis, cols: _Axis,
                      chans: int) -> Kernel:
    """The register-tiled kernel of a `_Correlation` (rows/cols: built for p0 = y0 / x0)."""
    b, qn, ho, wo = ctx.node.shape
    _, cs, hs, ws = c.src_shape
    groups = qn // c.per_group
    blocks = (_cdiv(c.per_group, chans), _cdiv(ho, rows.run), _cdiv(wo, cols.run))
    lines = [_split("i", ["bi", "qb", "yb", "xb"], [b, groups * blocks[0], *blocks[1:]]),
             f"  let grp = qb / {w.u(blocks[0])};",
             f"  let q0 = (qb % {w.u(blocks[0])}) * {w.u(chans)};",
             f"  let y0 = yb * {w.u(rows.run)};",
             f"  let x0 = xb * {w.u(cols.run)};",
             *rows.hoist("rr", ws), *cols.hoist("cc", 1)]
    for j in range(chans):
        q = f"q0 + {w.u(j)}" if c.per_group % chans == 0 else \
            f"min(q0 + {w.u(j)}, {w.u(c.per_group - 1)})"
        lines.append(f"  let wq{j} = grp * {w.u(c.group_stride)} + ({q}) * {w.u(c.q_stride)};")
    lines.append(f"  let sb = (bi * {w.u(cs)} + grp * {w.u(c.loop)}) * {w.u(hs * ws)};")
    lines += [f"  var a{j}_{r}_{t} = 0.0f;" for j in range(chans) for r in range(rows.run)
              for t in range(cols.run)]
    lines += [f"  for (var l = 0u; l < {w.u(c.loop)}; l = l + 1u) {{",
              f"    let sl = sb + l * {w.u(hs * ws)};",
              f"    let wl = l * {w.u(c.l_stride)};"]
    for ki in range(c.kernel[0]):
        lines += _tap_block(c, rows, cols, chans, ki)
    lines += ["  }", *_tile_store(c, ctx.node.shape, chans, rows.run, cols.run)]
    threads = b * groups * blocks[0] * blocks[1] * blocks[2]
    return w.thread_kernel(ctx, "\n".join(lines), threads)


def _tile_store(c: _Correlation, out: Shape, chans: int, rows: int, cols: int) -> list[str]:
    """WGSL: store the tile's accumulators, skipping those past the edges."""
    _, qn, ho, wo = out
    first = f"(bi * {w.u(qn)} + grp * {w.u(c.per_group)} + q0) * {w.u(ho)} + y0"
    lines = [f"  let ob = ({first}) * {w.u(wo)} + x0;"]
    for j in range(chans):
        for r in range(rows):
            for t in range(cols):
                conds = [f"q0 + {w.u(j)} < {w.u(c.per_group)}"] if c.per_group % chans else []
                conds += [f"y0 + {w.u(r)} < {w.u(ho)}"] if ho % rows else []
                conds += [f"x0 + {w.u(t)} < {w.u(wo)}"] if wo % cols else []
                store = f"out[ob + {w.u((j * ho + r) * wo + t)}] = a{j}_{r}_{t};"
                lines.append(f"  if ({' && '.join(conds)}) {{ {store} }}" if conds
                             else f"  {store}")
    return lines


def _tiled(ctx: EmitContext, taps: int) -> bool:
    """Whether to emit the register-tiled kernel: on software targets, for unrollable taps."""
    return ctx.target.software and taps <= TILED_MAX_TAPS


def _emit_conv2d_tiled(ctx: EmitContext) -> Kernel:
    x, wt = ctx.inputs
    cout, cig, kh, kw = wt.shape
    (sh, sw), (ph, pw) = ctx.node.attrs["stride"], ctx.node.attrs["padding"]
    cog = cout // ctx.node.attrs["groups"]
    taps = kh * kw
    chans, rows, cols = _tile_sizes(ctx.node.shape[2:], cog, taps, (1, 1))
    c = _Correlation("in0", "in1", x.shape, cog, cig, cig * taps, taps, cog * cig * taps,
                     (kh, kw))
    return _emit_correlation(ctx, c, _gather_axis(rows, kh, sh, ph, x.shape[2], "y0"),
                             _gather_axis(cols, kw, sw, pw, x.shape[3], "x0"), chans)


def _emit_conv2d_input_grad_tiled(ctx: EmitContext) -> Kernel:
    wt, dy = ctx.inputs
    cout, cig, kh, kw = wt.shape
    (sh, sw), (ph, pw) = ctx.node.attrs["stride"], ctx.node.attrs["padding"]
    cog = cout // ctx.node.attrs["groups"]
    taps = kh * kw
    chans, rows, cols = _tile_sizes(ctx.node.shape[2:], cig, taps, (sh, sw))
    c = _Correlation("in1", "in0", dy.shape, cig, cog, taps, cig * taps, cog * cig * taps,
                     (kh, kw))
    return _emit_correlation(ctx, c, _scatter_axis(rows, kh, sh, ph, dy.shape[2], "y0"),
                             _scatter_axis(cols, kw, sw, pw, dy.shape[3], "x0"), chans)


def _weight_grad_tile(ctx: EmitContext) -> tuple[int, int]:
    """(output channels of one workgroup's block of weights, which spans all taps of one
    input channel; the output run a thread takes per step of the sum)."""
    cout, cig, kh, kw = ctx.node.shape
    groups = ctx.node.attrs["groups"]
    cog = cout // groups
    chans = _run(cog, max(1, min(TILE_MAX_RUN, WGRAD_MAX_ACCS // (kh * kw))))
    while chans > 1 and groups * _cdiv(cog, chans) * cig < WGRAD_MIN_GROUPS:
        chans = _run(cog, chans - 1)
    return chans, _run(ctx.inputs[1].shape[3], TILE_MAX_RUN)


def _weight_grad_step(ctx: EmitContext, chans: int, run: int) -> list[str]:
    """WGSL body of one step of the sum: output row `oh` of image `bi`, columns x0 + t for
    t < run. Loads the x rows under every tap and the dy run of every channel, then
    accumulates a{j}_{ki}_{kj} += x * dy."""
    x, dy = ctx.inputs
    _, _, kh, kw = ctx.node.shape
    _, cin, h, wd = x.shape
    _, cout, ho, wo = dy.shape
    (sh, sw), (ph, pw) = ctx.node.attrs["stride"], ctx.node.attrs["padding"]
    cols = sorted({t * sw + kj for t in range(run) for kj in range(kw)})
    lines = [f"    let x0 = xr * {w.u(run)};",
             f"    let r0 = i32(oh * {w.u(sh)}) - {ph}i;",
             f"    let c0 = i32(x0 * {w.u(sw)}) - {pw}i;",
             f"    let xs = bi * {w.u(cin * h * wd)} + xc;",
             f"    let ds = bi * {w.u(cout * ho * wo)} + oh * {w.u(wo)} + x0;"]
    for ki in range(kh):
        lines += [f"    let rr{ki} = u32(clamp(r0 + {ki}i, 0i, {h - 1}i)) * {w.u(wd)};",
                  f"    let vr{ki} = {_in_range(f'r0 + {ki}i', h)};"]
    for e in cols:
        lines += [f"    let cc{e} = u32(clamp(c0 + {e}i, 0i, {wd - 1}i));",
                  f"    let vc{e} = {_in_range(f'c0 + {e}i', wd)};"]
    for ki in range(kh):
        for e in cols:
            load = _masked(f"in0[xs + rr{ki} + cc{e}]", f"vr{ki} && vc{e}")
            lines.append(f"    let x{ki}_{e} = {load};")
    for j in range(chans):
        for t in range(run):
            load = f"in1[dq{j} + ds + {w.u(t)}]"
            if wo % run:
                load = _masked(load, f"x0 + {w.u(t)} < {w.u(wo)}")
            lines.append(f"    let d{j}_{t} = {load};")
    for j in range(chans):
        for ki in range(kh):
            for kj in range(kw):
                acc = f"a{j}_{ki}_{kj}"
                lines += [f"    {acc} = fma(x{ki}_{t * sw + kj}, d{j}_{t}, {acc});"
                          for t in range(run)]
    return lines


def _weight_grad_reduce(ctx: EmitContext, chans: int) -> list[str]:
    """WGSL: the workgroup's partial sums through shared memory (one barrier), then one thread
    per weight of the block sums its column and stores it."""
    cout, cig, kh, kw = ctx.node.shape
    cog = cout // ctx.node.attrs["groups"]
    n, taps = WGRAD_THREADS, kh * kw
    lines = [f"  scratch[{w.u((j * taps + k) * n)} + lid] = a{j}_{k // kw}_{k % kw};"
             for j in range(chans) for k in range(taps)]
    return [*lines, "  workgroupBarrier();",
            f"  for (var a = lid; a < {w.u(chans * taps)}; a = a + {w.u(n)}) {{",
            "    var acc = 0.0f;",
            f"    for (var k = 0u; k < {w.u(n)}; k = k + 1u) {{",
            f"      acc = acc + scratch[a * {w.u(n)} + k];",
            "    }",
            f"    let q = q0 + a / {w.u(taps)};",
            f"    if (q < {w.u(cog)}) {{",
            (f"      out[((grp * {w.u(cog)} + q) * {w.u(cig)} + cl) * {w.u(taps)} + "
             f"a % {w.u(taps)}] = acc;"),
            "    }",
            "  }"]


def _emit_conv2d_weight_grad_tiled(ctx: EmitContext) -> Kernel:
    """One workgroup per block of `chans` output channels x all taps of one input channel;
    its threads take turns over the (image, output row, run of columns) steps of the sum."""
    x, dy = ctx.inputs
    cout, cig, kh, kw = ctx.node.shape
    b, _, h, wd = x.shape
    _, _, ho, wo = dy.shape
    groups = ctx.node.attrs["groups"]
    cog = cout // groups
    chans, run = _weight_grad_tile(ctx)
    blocks = _cdiv(cog, chans)
    lines = [_split("g", ["qb", "cl"], [groups * blocks, cig]),
             f"  let grp = qb / {w.u(blocks)};",
             f"  let q0 = (qb % {w.u(blocks)}) * {w.u(chans)};",
             f"  let xc = (grp * {w.u(cig)} + cl) * {w.u(h * wd)};"]
    for j in range(chans):
        q = f"q0 + {w.u(j)}" if cog % chans == 0 else f"min(q0 + {w.u(j)}, {w.u(cog - 1)})"
        lines.append(f"  let dq{j} = (grp * {w.u(cog)} + {q}) * {w.u(ho * wo)};")
    lines += [f"  var a{j}_{ki}_{kj} = 0.0f;"
              for j in range(chans) for ki in range(kh) for kj in range(kw)]
    steps = (b, ho, _cdiv(wo, run))
    lines += [f"  for (var s = lid; s < {w.u(prod(steps))}; s = s + {w.u(WGRAD_THREADS)}) {{",
              _split("s", ["bi", "oh", "xr"], steps).replace("\n", "\n  "),
              *_weight_grad_step(ctx, chans, run), "  }", *_weight_grad_reduce(ctx, chans)]
    prelude = f"var<workgroup> scratch: array<f32, {WGRAD_THREADS * chans * kh * kw}>;"
    return w.workgroup_kernel(ctx, "\n".join(lines), groups * blocks * cig, prelude=prelude,
                              size=WGRAD_THREADS)
