"""Reductions and row-wise ops: sum, mean, argmax/argmin, (log-)softmax, causal masking.

The primitives work on the last axis only (`sum_last`, `mean_last`, `argmax_last`,
`log_softmax_last`, `softmax_causal_last`, `where_causal`); other axes are moved to the end
with `permute` first. Row kernels (:func:`row_kernel`) run a team of threads per row on GPUs
(32, more for few or very long rows; see :func:`_row_team`), and one thread per row on CPU
rasterisers, or a workgroup per row past their loop budget.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from types import ModuleType
from typing import Any

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Attrs, DType, Node, Shape
from ..tensor import Tensor
from .broadcast import broadcast_to
from .elementwise import exp, mul_scalar, neg
from .registry import GRAD_ERROR, NO_GRAD, InferFn, Stitch, define, public, record
from .rules import normalize_axis, require_dtype
from .shape import move_to_last, reshape, swap_axes

MAX_INIT = -1e30  # the running max starts here (log-softmax, causal softmax)


def _np() -> ModuleType:
    import numpy as np
    return np


def _rows(node: Node) -> tuple[int, int]:
    """(number of rows, row length) of a node reduced over its last axis."""
    length = node.shape[-1]
    return prod(node.shape[:-1]), length


def _tree(combine: str, team: int = w.WG) -> str:
    """Barrier, then a shared-memory tree over each team of `team` lanes of `scratch` (lane
    `lane` of the team at `scratch[lid]`); `combine` reads `scratch[lid]` and
    `scratch[lid + step]`. Leaves each team's result in its first slot."""
    return f"""  workgroupBarrier();
  for (var step = {w.u(team // 2)}; step > 0u; step = step >> 1u) {{
    if (lane < step) {{ scratch[lid] = {combine}; }}
    workgroupBarrier();
  }}"""


def _infer_last(op: str, keep: bool, out_dtype: DType = "f32", square: bool = False
                ) -> InferFn:
    def infer(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
        (a,) = inputs
        require_dtype(op, a, "f32")
        if not a.shape:
            raise ShapeError(op, "input must have rank >= 1, got a 0-d tensor")
        if square and (len(a.shape) < 2 or a.shape[-1] != a.shape[-2]):
            raise ShapeError(op, f"the last two axes must be square [..., T, T], got shape "
                             f"{list(a.shape)}")
        return (a.shape if keep else a.shape[:-1]), out_dtype
    return infer


def _keep_last(t: Tensor, shape: Shape) -> Tensor:
    """t (a per-row value, shape[:-1] or shape[:-1] + (1,)) reshaped to shape[:-1] + (1,)."""
    return reshape(t, (*shape[:-1], 1))


# ---- sum_last / mean_last --------------------------------------------------------------

def _emit_sum_last(ctx: EmitContext) -> Kernel:
    rows, length = _rows(ctx.inputs[0])
    return w.reduce_kernel(ctx, rows, length, f"o * {w.u(length)} + r")


def _emit_mean_last(ctx: EmitContext) -> Kernel:
    rows, length = _rows(ctx.inputs[0])
    return w.reduce_kernel(ctx, rows, length, f"o * {w.u(length)} + r",
                           finalize=f"acc / {w.lit(float(length))}")


def _infer_mean_last(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    shape, dtype = _infer_last("mean_last", keep=True)(inputs, attrs)
    return (*shape[:-1], 1), dtype


define("sum_last", infer=_infer_last("sum_last", keep=False),
       ref=lambda args, node: _np().sum(args[0], axis=-1),
       vjp=lambda ins, out, dy, at: [broadcast_to(_keep_last(dy, ins[0].shape), ins[0].shape)],
       emit=_emit_sum_last, torch=tx.last_axis("sum(-1)"),
       doc="Sum over the last axis, dropping it: [..., D] -> [...].",
       stitch=Stitch(prologue=(0,), epilogue=True))
define("mean_last", infer=_infer_mean_last,
       ref=lambda args, node: _np().mean(args[0], axis=-1, keepdims=True),
       vjp=lambda ins, out, dy, at: [mul_scalar(broadcast_to(dy, ins[0].shape),
                                                1.0 / ins[0].shape[-1])],
       emit=_emit_mean_last, torch=tx.last_axis("mean(-1, keepdim=True)"),
       doc="Mean over the last axis, kept: [..., D] -> [..., 1].",
       stitch=Stitch(prologue=(0,), epilogue=True))


def _reduce_axis(op: str, x: Tensor, axis: int | None) -> tuple[Tensor, int | None]:
    """Check x (f32) and move `axis` to the end; axis None flattens x to one row."""
    require_dtype(op, x.node, "f32")
    if axis is None:
        return reshape(x, (-1,)), None
    if x.ndim == 0:
        raise ShapeError(op, f"cannot reduce axis {axis} of a 0-d tensor")
    axis = normalize_axis(op, axis, x.ndim)
    return move_to_last(x, axis), axis


def _kept_shape(shape: Shape, axis: int, keepdims: bool) -> Shape:
    return (*shape[:axis], 1, *shape[axis + 1:]) if keepdims else \
        (*shape[:axis], *shape[axis + 1:])


@public
def sum(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Sum of f32 x over `axis` (negative allowed), or over everything (0-d result;
    keepdims is ignored without an axis)."""
    rows, k = _reduce_axis("sum", x, axis)
    out = record("sum_last", [rows])
    return out if k is None else reshape(out, _kept_shape(x.shape, k, keepdims))


@public
def mean(x: Tensor, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Mean of f32 x over `axis` (negative allowed), or over everything (0-d result;
    keepdims is ignored without an axis)."""
    rows, k = _reduce_axis("mean", x, axis)
    if k is None:
        return mul_scalar(record("sum_last", [rows]), 1.0 / max(1, x.size))
    return reshape(record("mean_last", [rows]), _kept_shape(x.shape, k, keepdims))


# ---- argmax ----------------------------------------------------------------------------

def _emit_argmax_last(ctx: EmitContext) -> Kernel:
    rows, length = _rows(ctx.inputs[0])
    if w.use_workgroup_reduce(ctx, rows, length):
        body = f"""  let base = g * {w.u(length)};
  var best = in0[base + lid];
  var idx = lid;
  for (var j = lid + {w.u(w.WG)}; j < {w.u(length)}; j = j + {w.u(w.WG)}) {{
    let v = in0[base + j];
    if (v > best || (is_nan(v) && !is_nan(best))) {{ best = v; idx = j; }}
  }}
  sv[lid] = best;
  si[lid] = idx;
  workgroupBarrier();
  for (var step = {w.u(w.WG // 2)}; step > 0u; step = step >> 1u) {{
    if (lid < step) {{
      let ov = sv[lid + step];
      let oi = si[lid + step];
      let cv = sv[lid];
      let ci = si[lid];
      let earlier = oi < ci;
      if ((is_nan(ov) && (!is_nan(cv) || earlier)) ||
          (!is_nan(cv) && (ov > cv || (ov == cv && earlier)))) {{ sv[lid] = ov; si[lid] = oi; }}
    }}
    workgroupBarrier();
  }}
  if (lid == 0u) {{ out[g] = i32(si[0]); }}"""
        prelude = (f"var<workgroup> sv: array<f32, {w.WG}>;\n"
                   f"var<workgroup> si: array<u32, {w.WG}>;\n{w.IS_NAN_WGSL}")
        return w.workgroup_kernel(ctx, body, rows, prelude=prelude)
    body = f"""  let base = i * {w.u(length)};
  var best = in0[base];
  var idx = 0u;
  for (var j = 1u; j < {w.u(length)}; j = j + 1u) {{
    let v = in0[base + j];
    if (v > best || (is_nan(v) && !is_nan(best))) {{ best = v; idx = j; }}
  }}
  out[i] = i32(idx);"""
    return w.thread_kernel(ctx, body, rows, size=w.serial_reduce_size(ctx),
                           prelude=w.IS_NAN_WGSL)


define("argmax_last", infer=_infer_last("argmax_last", keep=False, out_dtype="i32"),
       ref=lambda args, node: _np().argmax(args[0], axis=-1).astype(_np().int32),
       vjp=NO_GRAD, emit=_emit_argmax_last, torch=tx.last_axis("argmax(-1)"),
       doc="Index of the max over the last axis (ties and NaN: the first), i32, axis dropped.")


@public
def argmax(x: Tensor, axis: int | None = None) -> Tensor:
    """i32 index of the max of f32 x along `axis` (dropped), or of the flattened x (0-d);
    ties go to the first occurrence."""
    rows, _ = _reduce_axis("argmax", x, axis)
    return record("argmax_last", [rows])


@public
def argmin(x: Tensor, axis: int | None = None) -> Tensor:
    """i32 index of the min of f32 x along `axis` (dropped), or of the flattened x (0-d);
    ties go to the first occurrence."""
    require_dtype("argmin", x.node, "f32")
    return argmax(neg(x), axis)


# ---- row programs: per-row statistics, then one write per element --------------------

@dataclass(frozen=True)
class RowStat:
    """One per-row value: `term` (a WGSL expression in `j`, the column, reading
    `in{k}[base + j]` and earlier stats) combined over the row (sum, or max from -1e30),
    then named `name` = `finish` (in `acc`, the combined value). Without a term, `finish`
    is a plain per-row value of earlier stats (no pass over the row)."""

    name: str
    term: str | None
    finish: str = "acc"
    combine: str = "sum"


def _combine(how: str, a: str, b: str) -> str:
    return f"max({a}, {b})" if how == "max" else f"{a} + {b}"


def _init_value(how: str) -> str:
    return w.lit(MAX_INIT) if how == "max" else "0.0f"


TEAM_MIN_LENGTH = 32  # on GPUs, rows at least this long get a team of threads each
# Threads per team on GPUs: 32, unless the rows are too few to fill the GPU that way
# (ROW_FILL_THREADS) or so long that a thread would read more than ROW_MAX_PER_THREAD
# columns, when teams grow up to a whole workgroup. Each stat's tree costs a workgroup
# barrier per halving, so a small team with more columns per thread is cheaper: on an H200
# (same call) GPT-2's causal softmax (98,304 rows of 256) ran 4.11 ms with a 256-thread
# team per row, 1.01 ms with teams of 32 (its backward 2.62 -> 1.36 ms, LayerNorm's
# 1.09 -> 0.42 and 2.25 -> 1.82 over 8,192 rows of 768), but its log-softmax over 8,192
# rows of 50,304 took 2.59 ms against 2.49 (backward 1.60 against 1.30).
TEAM_MAX = 32
ROW_FILL_THREADS = 1 << 17
ROW_MAX_PER_THREAD = 256


def _row_team(ctx: EmitContext, rows: int, length: int) -> int:
    """Threads per row: a power-of-two team of up to the row's length on GPUs (a thread per
    row would leave most of the chip idle, and read with strides), bigger for few or very
    long rows; on CPU rasterisers a whole workgroup for few, long rows and 1 (serial
    loops) otherwise."""
    if ctx.target.software:
        return w.WG if w.use_workgroup_reduce(ctx, rows, length) else 1
    if length < TEAM_MIN_LENGTH:
        return 1
    span = 1 << (length - 1).bit_length()
    team = min(TEAM_MAX, span)
    while team < min(w.WG, span) and (rows * team < ROW_FILL_THREADS
                                      or length > team * ROW_MAX_PER_THREAD):
        team *= 2
    return team


def _serial_passes(stats: Sequence[RowStat]) -> list[list[RowStat]]:
    """The stats in loops over the row for one thread: a stat joins the loop before it
    unless its term reads a stat of that loop (LayerNorm's backward: the mean, then the
    spread, Σg·x̂ and Σg in one loop: two loops instead of four); a stat without a term is
    a group of its own."""
    groups: list[list[RowStat]] = []
    for st in stats:
        last = groups[-1] if groups else None
        if st.term is not None and last and last[0].term is not None and not any(
                re.search(rf"\b{re.escape(other.name)}\b", st.term) for other in last):
            last.append(st)
        else:
            groups.append([st])
    return groups


def row_kernel(ctx: EmitContext, stats: Sequence[RowStat], write: str,
               count: str | None = None) -> Kernel:
    """A kernel over the rows of `ctx`'s inputs ([rows, length] each, the last axis a row):
    each stat in turn over the row's first `count` columns (default all), then statement
    `write` for each column j (it assigns `out[base + j]`). A row is read by a team of
    threads (a strided loop and a shared-memory tree per stat; see :func:`_row_team`) or
    by one thread (serial loops)."""
    rows, length = _rows(ctx.inputs[0])
    n = count or w.u(length)
    team = _row_team(ctx, rows, length)
    if team == 1:
        lines = [f"  let row = i;\n  let base = row * {w.u(length)};\n  let n = {n};"]
        k = 0
        for group in _serial_passes(stats):
            if group[0].term is None:
                lines.append(f"  let {group[0].name} = {group[0].finish};")
                continue
            ps = [f"p{k + g}" for g in range(len(group))]
            k += len(group)
            lines += [f"  var {p} = {_init_value(st.combine)};" for p, st in zip(ps, group)]
            sums = " ".join(f"{p} = {_combine(st.combine, p, st.term or '')};"
                            for p, st in zip(ps, group))
            lines.append(f"  for (var j = 0u; j < n; j = j + 1u) {{ {sums} }}")
            lines += [f"  let {st.name} = {st.finish.replace('acc', p)};"
                      for p, st in zip(ps, group)]
        lines.append(f"  for (var j = 0u; j < {w.u(length)}; j = j + 1u) {{ {write} }}")
        return w.thread_kernel(ctx, "\n".join(lines), rows, size=w.serial_reduce_size(ctx))
    per = w.WG // team  # rows per workgroup
    if per == 1:
        head = f"""  let lane = lid;
  let first = 0u;
  let row = g;
  let last = {w.u(length)};
  let base = row * {w.u(length)};
  let n = {n};"""
    else:  # a team past the last row reads and writes nothing, but joins every barrier
        head = f"""  let lane = lid % {w.u(team)};
  let first = lid - lane;
  let row = g * {w.u(per)} + lid / {w.u(team)};
  let last = select(0u, {w.u(length)}, row < {w.u(rows)});
  let base = row * {w.u(length)};
  let n = min({n}, last);"""
    lines = [head]
    stride = w.u(team)
    for k, st in enumerate(stats):
        if st.term is None:
            lines.append(f"  let {st.name} = {st.finish};")
            continue
        lines.append(f"""  var p{k} = {_init_value(st.combine)};
  for (var j = lane; j < n; j = j + {stride}) {{ p{k} = {_combine(st.combine, f"p{k}", st.term)}; }}
  scratch[lid] = p{k};
{_tree(_combine(st.combine, "scratch[lid]", "scratch[lid + step]"), team)}
  let {st.name} = {st.finish.replace("acc", "scratch[first]")};
  workgroupBarrier();""")
    lines.append(f"  for (var j = lane; j < last; j = j + {stride}) {{ {write} }}")
    return w.workgroup_kernel(ctx, "\n".join(lines), -(-rows // per),
                              prelude=f"var<workgroup> scratch: array<f32, {w.WG}>;")


# ---- log-softmax and causal softmax ----------------------------------------------------

def _emit_softmax_rows(ctx: EmitContext, causal: bool) -> Kernel:
    """Max over the row's first `n` entries (from -1e30), sum of exp(x - max), then write.
    Causal rows use n = (row % T) + 1."""
    x = "in0[base + j]"
    stats = [RowStat("mx", x, combine="max"), RowStat("total", f"exp({x} - mx)")]
    if causal:
        write = (f"if (j < n) {{ out[base + j] = exp({x} - mx) / total; }} "
                 "else { out[base + j] = 0.0f; }")
        count = f"(row % {w.u(ctx.inputs[0].shape[-1])}) + 1u"
        return row_kernel(ctx, stats, write, count)
    stats.append(RowStat("logz", None, finish="mx + log(total)"))
    return row_kernel(ctx, stats, f"out[base + j] = {x} - logz;")


def _ref_log_softmax(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    x = args[0]
    m = np.maximum(np.max(x, axis=-1, keepdims=True), MAX_INIT).astype(x.dtype)
    return x - (m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)))


def _causal_mask(shape: Shape) -> Any:
    """True where the column is past the row (the masked entries), broadcastable to shape."""
    t = shape[-1]
    return _np().triu(_np().ones((t, t), dtype=bool), 1)


def _ref_softmax_causal(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    x = args[0]
    mask = _causal_mask(x.shape)
    masked = np.where(mask, -np.inf, x)
    m = np.maximum(np.max(masked, axis=-1, keepdims=True), MAX_INIT).astype(x.dtype)
    e = np.where(mask, 0, np.exp(masked - m))
    return e / np.sum(e, axis=-1, keepdims=True)


def _ref_log_softmax_grad(args: Sequence[Any], node: Node) -> Any:
    out, dy = args
    return dy - _np().exp(out) * _np().sum(dy, axis=-1, keepdims=True)


def _ref_softmax_causal_grad(args: Sequence[Any], node: Node) -> Any:
    out, dy = args
    return (dy - _np().sum(dy * out, axis=-1, keepdims=True)) * out


def _emit_log_softmax_grad(ctx: EmitContext) -> Kernel:
    """dx = dy - exp(out) * sum(dy) per row (in0 = out, in1 = dy)."""
    return row_kernel(ctx, [RowStat("t", "in1[base + j]")],
                      "out[base + j] = in1[base + j] - exp(in0[base + j]) * t;")


def _emit_softmax_causal_grad(ctx: EmitContext) -> Kernel:
    """dx = (dy - sum(dy * out)) * out per row (masked entries have out = 0)."""
    return row_kernel(ctx, [RowStat("t", "in1[base + j] * in0[base + j]")],
                      "out[base + j] = (in1[base + j] - t) * in0[base + j];")


def _infer_row_grad(op: str) -> InferFn:
    def infer(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
        out, dy = inputs
        for what, node in (("out", out), ("dy", dy)):
            require_dtype(op, node, "f32", what=what)
        if dy.shape != out.shape or not out.shape:
            raise ShapeError(op, f"dy {list(dy.shape)} must have the shape of out "
                             f"{list(out.shape)} (rank >= 1)")
        return out.shape, "f32"
    return infer


def _vjp_log_softmax(ins: Sequence[Tensor], out: Tensor, dy: Tensor, at: Attrs) -> list[Tensor]:
    return [record("log_softmax_last_grad", [out, dy])]


def _vjp_softmax_causal(ins: Sequence[Tensor], out: Tensor, dy: Tensor,
                        at: Attrs) -> list[Tensor]:
    return [record("softmax_causal_last_grad", [out, dy])]


# Row kernels read each element three times (max, sum, write): small prologues only.
ROW_STITCH = Stitch(prologue=(0,), prologue_ops=2, epilogue=True)
define("log_softmax_last", infer=_infer_last("log_softmax_last", keep=True),
       ref=_ref_log_softmax, vjp=_vjp_log_softmax,
       emit=lambda ctx: _emit_softmax_rows(ctx, causal=False),
       torch=tx.last_axis("log_softmax(-1)"),
       doc="x - logsumexp(x) over the last axis (max-subtracted, max starts at -1e30).",
       stitch=ROW_STITCH)
define("softmax_causal_last", infer=_infer_last("softmax_causal_last", keep=True, square=True),
       ref=_ref_softmax_causal, vjp=_vjp_softmax_causal,
       emit=lambda ctx: _emit_softmax_rows(ctx, causal=True),
       torch=lambda n, a, cx: tx.call(cx.helper("softmax_causal"), a[0].text),
       doc="Softmax of row q over columns 0..q of a [..., T, T] tensor; later columns 0.",
       stitch=ROW_STITCH, zeros=lambda node, inputs, zeros: "above")
# Their backwards: one row kernel each (a sum over the row, then the write). They read dy
# twice, and a few ops recomputed per read cost far less than storing and reloading dy: the
# loss gradient of nll_loss (one-hot, scaled by the mean's 1/N) is 5 ops, computed in the
# log-softmax backward instead of being written ([B·T, vocab]: 1.65 GB on GPT-2).
ROW_GRAD_STITCH = Stitch(prologue=(0, 1), prologue_ops=8, epilogue=True)
define("log_softmax_last_grad", infer=_infer_row_grad("log_softmax_last_grad"),
       ref=_ref_log_softmax_grad, vjp=GRAD_ERROR, emit=_emit_log_softmax_grad,
       doc="The gradient of log_softmax_last given its output and dy: dy - exp(out)·Σdy.",
       stitch=ROW_GRAD_STITCH)
define("softmax_causal_last_grad", infer=_infer_row_grad("softmax_causal_last_grad"),
       ref=_ref_softmax_causal_grad, vjp=GRAD_ERROR, emit=_emit_softmax_causal_grad,
       doc="The gradient of softmax_causal_last given its output and dy: (dy - Σdy·out)·out.",
       stitch=ROW_GRAD_STITCH, zeros=lambda node, inputs, zeros: zeros[0])


def _on_last(op: str, x: Tensor, axis: int, prim: str) -> Tensor:
    """Apply row primitive `prim` along `axis` by swapping it with the last axis."""
    require_dtype(op, x.node, "f32")
    if x.ndim == 0:
        raise ShapeError(op, "input must have rank >= 1, got a 0-d tensor")
    given, axis = axis, normalize_axis(op, axis, x.ndim)
    moved = swap_axes(x, axis, -1)
    if prim == "softmax_causal_last" and (moved.ndim < 2 or moved.shape[-1] != moved.shape[-2]):
        raise ShapeError(op, f"with axis={given} the last two axes must be square [..., T, T], "
                         f"got shape {list(moved.shape)} (from input {list(x.shape)})")
    return swap_axes(record(prim, [moved]), axis, -1)


@public
def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """log(softmax(x)) along `axis`, computed stably (f32)."""
    return _on_last("log_softmax", x, axis, "log_softmax_last")


@public
def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """Softmax along `axis` (f32): exp(log_softmax(x, axis))."""
    return exp(_on_last("softmax", x, axis, "log_softmax_last"))


@public
def softmax_causal(x: Tensor, axis: int = -1) -> Tensor:
    """Causal softmax of attention scores [..., T, T]: row q covers columns 0..q; the
    masked columns are 0. With another `axis` it is swapped with the last one first."""
    return _on_last("softmax_causal", x, axis, "softmax_causal_last")


# ---- where_causal ----------------------------------------------------------------------

def _infer_where_causal(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (a,) = inputs
    require_dtype("where_causal", a, "f32")
    if len(a.shape) < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError("where_causal", f"the last two axes must be square [..., T, T], got "
                         f"shape {list(a.shape)}")
    return a.shape, "f32"


def _emit_where_causal(ctx: EmitContext) -> Kernel:
    t = ctx.node.shape[-1]
    fill = w.lit(ctx.node.attrs["fill"])
    body = f"""  let row = (i / {w.u(t)}) % {w.u(t)};
  let col = i % {w.u(t)};
  out[i] = select(in0[i], {fill}, col > row);"""
    return w.thread_kernel(ctx, body)


def _ref_where_causal(args: Sequence[Any], node: Node) -> Any:
    x = args[0]
    return _np().where(_causal_mask(x.shape), _np().asarray(node.attrs["fill"], x.dtype), x)


define("where_causal", infer=_infer_where_causal, ref=_ref_where_causal,
       vjp=lambda ins, out, dy, at: [where_causal(dy, 0.0)], emit=_emit_where_causal,
       torch=lambda n, a, cx: tx.call(cx.helper("where_causal"), a[0].text,
                                      tx.literal(float(n.attrs["fill"]))),
       doc="x with entries whose column is past their row set to `fill` ([..., T, T]).",
       zeros=lambda node, inputs, zeros: "above" if node.attrs["fill"] == 0 else None)


@public
def where_causal(x: Tensor, fill: float) -> Tensor:
    """x [..., T, T] with entries above the diagonal (column > row) set to `fill`
    (an infinite fill is stored as +-1e30, which is what the kernel can write)."""
    if isinstance(fill, bool) or not isinstance(fill, (int, float)) or math.isnan(fill):
        raise ShapeError("where_causal", f"fill must be a Python number (not NaN), got "
                         f"{fill!r}")
    fill = max(-1e30, min(1e30, float(fill)))  # +-inf become +-1e30, as in the kernel
    return record("where_causal", [x], fill=fill)


__all__ = [
    "argmax",
    "argmin",
    "log_softmax",
    "mean",
    "softmax",
    "softmax_causal",
    "sum",
    "where_causal",
]
