"""Index ops: one_hot, arange, row gathers and the gathers built on them (embedding,
take_along_axis).

`embedding` is a row gather (`gather_rows`) whose backward is a deterministic row scatter-add
(`scatter_add_rows`); `take_along_axis` is a one-hot product. An index outside the valid
range selects nothing (a zero row) and receives no gradient instead of failing.

Indices that come straight from an i32 input are checked when a step or run is called
(:func:`input_index_bounds` says which inputs and what each use allows, an
:class:`IndexBound`): a value outside 0..bound - 1 fails the call, except a use's sentinel
(a one-hot's `ignore_index`, which cross_entropy's padding targets use), which that use
turns into a zero row on purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..hostdata import IndexBound
from ..ir import DTYPES, Attrs, DType, Graph, Node, Shape
from ..tensor import Tensor
from .elementwise import mul
from .registry import GRAD_ERROR, NO_GRAD, Stitch, define, public, record
from .rules import is_int, normalize_axis, require_dtype
from .shape import move_to_last, permute, reshape

_NP_DTYPES = {"i32": "int32", "bool": "bool"}
I32_RANGE = (-(1 << 31), (1 << 31) - 1)


def _np() -> ModuleType:
    import numpy as np
    return np


def _check_dtype(op: str, dtype: Any) -> None:
    if dtype not in DTYPES:
        raise ShapeError(op, f"dtype must be one of {DTYPES}, got {dtype!r}")


def _np_out(dtype: DType, like: Any) -> Any:
    """NumPy dtype for an op output: f32 follows the float inputs (float32 or float64)."""
    return _NP_DTYPES.get(dtype, like)


# ---- one_hot ---------------------------------------------------------------------------

def _infer_one_hot(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    (idx,) = inputs
    require_dtype("one_hot", idx, "i32", what="indices")
    depth = attrs["depth"]
    if not is_int(depth) or depth <= 0:
        raise ShapeError("one_hot", f"depth must be a positive int, got {depth!r}")
    _check_dtype("one_hot", attrs["dtype"])
    ignore = attrs.get("ignore_index")
    if ignore is not None and not (is_int(ignore) and I32_RANGE[0] <= ignore <= I32_RANGE[1]):
        raise ShapeError("one_hot", f"ignore_index must be None or an int in "
                         f"{I32_RANGE[0]}..{I32_RANGE[1]} (indices are i32), got {ignore!r}")
    if not idx.shape or idx.shape[-1] != 1:
        raise ShapeError("one_hot", f"the primitive takes indices [..., 1], got shape "
                         f"{list(idx.shape)}")
    return (*idx.shape[:-1], depth), attrs["dtype"]


def _ignored_class(node: Node) -> int | None:
    """The one-hot's ignore_index where it names a class (0..depth - 1): that class then
    gets no 1. An ignore_index outside the classes needs no test (it never hits)."""
    ignore = node.attrs.get("ignore_index")
    return ignore if ignore is not None and 0 <= ignore < node.attrs["depth"] else None


def _ref_one_hot(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    hot = args[0] == np.arange(node.attrs["depth"])
    ignored = _ignored_class(node)
    if ignored is not None:
        hot &= args[0] != ignored
    return hot.astype(_np_out(node.dtype, np.float32))


def _expr_one_hot(node: Node) -> str:
    dt = node.dtype  # bool is stored as u32, like the comparisons' results
    hit = f"u32(a0) == ix % {w.u(node.attrs['depth'])}"  # a negative index wraps: no hit
    ignored = _ignored_class(node)
    if ignored is not None:
        hit = f"{hit} && a0 != {w.lit(ignored, 'i32')}"
    return f"select({w.lit(0, dt)}, {w.lit(1, dt)}, {hit})"


def _torch_one_hot(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    args = [a[0].text, cx.dim(n.attrs["depth"])]  # indices [..., 1], as the primitive takes them
    ignore = n.attrs.get("ignore_index")  # cross_entropy / nll_loss targets: torch's ignore_index
    if n.dtype != "f32" or ignore is not None:
        args.append(tx.TORCH_DTYPES[n.dtype])
    if ignore is not None:
        args.append(f"ignore_index={ignore}")
    return tx.call(cx.helper("one_hot"), *args)


# Elementwise (the indices [..., 1] broadcast along the classes), so a one-hot product such as
# nll_loss's is fused into the kernel that reads it instead of being stored.
define("one_hot", infer=_infer_one_hot, ref=_ref_one_hot, vjp=NO_GRAD, expr=_expr_one_hot,
       torch=_torch_one_hot,
       doc="i32 [..., 1] -> [..., depth]: 1 where the index equals the position along the "
           "last axis, else 0 (no 1 when out of range, nor for an index equal to the "
           "ignore_index attr, None for none; the bound check of inputs allows that value).")


# Ops that move index values without changing them: an index read through them still comes
# straight from an input.
_INDEX_PRESERVING = ("reshape", "permute", "slice_range", "broadcast_to", "stop_gradient")


def _index_use(node: Node, input_shape: Callable[[int], Shape]
               ) -> tuple[int, IndexBound] | None:
    """(input position of the indices, what they may hold) for a node whose op reads i32
    indices; None for other ops. `input_shape(k)`: the shape of the node's input k."""
    if node.op == "one_hot":
        depth = int(node.attrs["depth"])
        ignore = node.attrs.get("ignore_index")
        if ignore is None:
            return 0, IndexBound(depth, f"one_hot(depth={depth})")
        return 0, IndexBound(depth, f"one_hot(depth={depth}, ignore_index={ignore})", ignore)
    if node.op == "gather_rows":
        rows = int(input_shape(0)[0])
        return 1, IndexBound(rows, f"embedding(vocab={rows})")
    if node.op == "scatter_add_rows":
        rows = int(node.attrs["rows"])
        return 1, IndexBound(rows, f"embedding(vocab={rows})")
    return None


def _index_reads(graph: Graph, node: Node) -> list[tuple[Node, IndexBound]]:
    """(graph node the indices come from, what they may hold) for each index read of
    `node`, looking into fused programs too (a one-hot fused into the kernel that reads it,
    a gather with a stitched epilogue)."""
    if node.op != "fused":
        use = _index_use(node, lambda k: graph[node.inputs[k]].shape)
        return [] if use is None else [(graph[node.inputs[use[0]]], use[1])]
    program = node.attrs["program"].nodes

    def shape(ref: int) -> Shape:
        return graph[node.inputs[-ref - 1]].shape if ref < 0 else program[ref].shape

    reads = []
    for pn in program:
        def input_shape(k: int, pn: Node = pn) -> Shape:
            return shape(pn.inputs[k])

        use = _index_use(pn, input_shape)
        if use is None:
            continue
        ref = pn.inputs[use[0]]
        while ref >= 0 and program[ref].op in _INDEX_PRESERVING:
            ref = program[ref].inputs[0]
        if ref < 0:  # computed inside the kernel otherwise: not straight from an input
            reads.append((graph[node.inputs[-ref - 1]], use[1]))
    return reads


def input_index_bounds(graph: Graph) -> dict[str, tuple[IndexBound, ...]]:
    """{i32 input name: its uses} for the inputs whose values directly index a one_hot
    (cross_entropy and nll_loss targets, take_along_axis) or a row gather/scatter
    (embedding), one :class:`IndexBound` per distinct (bound, sentinel): every value must
    be allowed by every use, or it would silently select an all-zero row (and get no
    gradient). Check values with :func:`tensorgrad.hostdata.first_rejected`."""
    uses: dict[str, dict[tuple[int, int | None], IndexBound]] = {}
    for node in graph.nodes:
        for src, use in _index_reads(graph, node):
            while src.op in _INDEX_PRESERVING:
                src = graph[src.inputs[0]]
            if src.op == "input" and src.dtype == "i32":
                site = node.site.splitlines()[0] if node.site else ""
                what = use.what + (f" at {site}" if site else "")
                uses.setdefault(src.attrs["name"], {}).setdefault(
                    (use.bound, use.sentinel), IndexBound(use.bound, what, use.sentinel))
    return {name: tuple(by_key.values()) for name, by_key in uses.items()}


@public
def one_hot(idx: Tensor, depth: int, dtype: DType = "f32") -> Tensor:
    """[...] i32 indices -> [..., depth] of `dtype`; an out-of-range index gives a zero row.
    Indices that come straight from an input are checked when a step or run is called: one
    outside 0..depth - 1 fails it, naming the input and the value."""
    if not isinstance(idx, Tensor):
        raise ShapeError("one_hot", f"indices must be a Tensor, got {type(idx).__name__}")
    require_dtype("one_hot", idx.node, "i32", what="indices")
    return record("one_hot", [reshape(idx, (*idx.shape, 1))], depth=depth, dtype=dtype)


# ---- arange ----------------------------------------------------------------------------

def _infer_arange(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    n = attrs["n"]
    if not is_int(n) or n <= 0:
        raise ShapeError("arange", f"n must be a positive int, got {n!r}")
    if attrs["dtype"] not in ("f32", "i32"):
        raise ShapeError("arange", f"dtype must be 'f32' or 'i32', got {attrs['dtype']!r}")
    return (n,), attrs["dtype"]


def _torch_arange(n: tx.TorchNode, a: Sequence[tx.Expr], cx: tx.TorchContext) -> tx.Expr:
    args = [cx.dim(n.attrs["n"])]
    if n.dtype == "f32":
        args.append("dtype=torch.float32")
    return tx.call("torch.arange", *args, f"device={cx.device()}")


define("arange", infer=_infer_arange,
       ref=lambda args, node: _np().arange(node.attrs["n"]),
       vjp=NO_GRAD,
       emit=lambda ctx: w.thread_kernel(ctx, f"  out[i] = {w.wgsl_type(ctx.node.dtype)}(i);"),
       torch=_torch_arange, doc="[n] of 0..n-1.")


@public
def arange(n: int, dtype: DType = "i32") -> Tensor:
    """[n] holding 0, 1, ..., n-1 as i32 (or f32)."""
    return record("arange", [], n=n, dtype=dtype)


# ---- row gather and scatter-add ------------------------------------------------------------

def _infer_gather_rows(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    table, idx = inputs
    require_dtype("gather_rows", table, "f32", what="table")
    require_dtype("gather_rows", idx, "i32", what="indices")
    if len(table.shape) != 2:
        raise ShapeError("gather_rows", f"table must have rank 2 [V, D], got shape "
                         f"{list(table.shape)}")
    return (*idx.shape, table.shape[1]), "f32"


def _valid_rows(idx: Any, rows: int) -> Any:
    return (idx >= 0) & (idx < rows)


def _ref_gather_rows(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    table, idx = args
    rows = table.shape[0]
    picked = table[np.clip(idx, 0, rows - 1)]
    return np.where(_valid_rows(idx, rows)[..., None], picked, np.zeros((), table.dtype))


def _vjp_gather_rows(ins: Sequence[Tensor], out: Tensor, dy: Tensor, at: Attrs
                     ) -> list[Tensor | None]:
    table, idx = ins
    return [record("scatter_add_rows", [dy, idx], rows=table.shape[0]), None]


def _emit_gather_rows(ctx: EmitContext) -> Kernel:
    rows, dim = ctx.inputs[0].shape
    body = f"""  let r = in1[i / {w.u(dim)}];
  var v = 0.0f;
  if (r >= 0i && r < {rows}i) {{ v = in0[u32(r) * {w.u(dim)} + i % {w.u(dim)}]; }}
  out[i] = v;"""
    return w.thread_kernel(ctx, body)


def _infer_scatter_add_rows(inputs: Sequence[Node], attrs: Attrs
                            ) -> tuple[Shape, DType]:
    dy, idx = inputs
    require_dtype("scatter_add_rows", dy, "f32", what="dy")
    require_dtype("scatter_add_rows", idx, "i32", what="indices")
    rows = attrs["rows"]
    if not is_int(rows) or rows <= 0:
        raise ShapeError("scatter_add_rows", f"rows must be a positive int, got {rows!r}")
    if len(dy.shape) != len(idx.shape) + 1 or dy.shape[:-1] != idx.shape:
        raise ShapeError("scatter_add_rows", f"dy {list(dy.shape)} must be the indices' shape "
                         f"{list(idx.shape)} plus one last axis (D)")
    return (rows, dy.shape[-1]), "f32"


def _ref_scatter_add_rows(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    dy, idx = args
    rows, dim = node.shape
    flat_idx, flat_dy = idx.reshape(-1), dy.reshape(-1, dim)
    keep = _valid_rows(flat_idx, rows)
    out = np.zeros((rows, dim), dy.dtype)
    np.add.at(out, flat_idx[keep], flat_dy[keep])  # in index order, as the kernels add
    return out


# scatter_add_rows kernels. WGSL has no f32 atomics, and a kernel's output is not zeroed
# before it runs (pooled buffers), so both variants are deterministic gathers in disguise:
# each output element is owned by one invocation, which adds the matching rows of dy in
# increasing n and writes its sum once. "scan": one thread per (v, d) looping over all N
# indices (V·D·N steps; for small tables and batches). "rows": one workgroup per row v, which
# reads the indices in tiles of WG, compacts the tile's hits in order with a prefix sum in
# workgroup memory and adds only those rows of dy (V·N compares and N·D adds in all, for
# large vocabularies); each invocation keeps ceil(D / WG) column sums in registers.
SCATTER_SCAN_MAX_STEPS = 1 << 24


def _emit_scatter_add_rows(ctx: EmitContext) -> Kernel:
    rows, dim = ctx.node.shape
    n = ctx.inputs[1].size
    if rows * dim * n <= SCATTER_SCAN_MAX_STEPS:
        body = f"""  let v = i32(i / {w.u(dim)});
  let d = i % {w.u(dim)};
  var acc = 0.0f;
  for (var k = 0u; k < {w.u(n)}; k = k + 1u) {{
    if (in1[k] == v) {{ acc = acc + in0[k * {w.u(dim)} + d]; }}
  }}
  out[i] = acc;"""
        return w.thread_kernel(ctx, body)
    cols = -(-dim // w.WG)
    steps = "\n".join(f"""    if (lid >= {w.u(s)}) {{ x = x + scan[lid - {w.u(s)}]; }}
    workgroupBarrier();
    scan[lid] = x;
    workgroupBarrier();""" for s in (1 << k for k in range(w.WG.bit_length() - 1)))
    body = f"""  var acc: array<f32, {cols}>;
  for (var t = 0u; t < {w.u(n)}; t = t + {w.u(w.WG)}) {{
    let k = t + lid;
    var hit = 0u;
    if (k < {w.u(n)}) {{ hit = select(0u, 1u, in1[k] == i32(g)); }}
    var x = hit;
    scan[lid] = x;
    workgroupBarrier();
{steps}
    if (hit == 1u) {{ hits[x - 1u] = k; }}
    workgroupBarrier();
    let nhits = scan[{w.u(w.WG - 1)}];
    for (var h = 0u; h < nhits; h = h + 1u) {{
      let src = hits[h] * {w.u(dim)};
      for (var c = 0u; c < {w.u(cols)}; c = c + 1u) {{
        let d = lid + c * {w.u(w.WG)};
        if (d < {w.u(dim)}) {{ acc[c] = acc[c] + in0[src + d]; }}
      }}
    }}
    workgroupBarrier();
  }}
  for (var c = 0u; c < {w.u(cols)}; c = c + 1u) {{
    let d = lid + c * {w.u(w.WG)};
    if (d < {w.u(dim)}) {{ out[g * {w.u(dim)} + d] = acc[c]; }}
  }}"""
    prelude = (f"var<workgroup> scan: array<u32, {w.WG}>;\n"
               f"var<workgroup> hits: array<u32, {w.WG}>;")
    return w.workgroup_kernel(ctx, body, rows, prelude=prelude)


# Stitching: the gather reads the table once and each index D times per output row, and
# writes each output once; the scatter reads each dy element at most once (indices: V·D or V
# times each, so they are not stitched) and writes each output once.
define("gather_rows", infer=_infer_gather_rows, ref=_ref_gather_rows, vjp=_vjp_gather_rows,
       emit=_emit_gather_rows, stitch=Stitch(prologue=(0, 1), prologue_ops=2, epilogue=True),
       torch=lambda n, a, cx: tx.call(cx.helper("embedding"), a[0].text, a[1].text),
       doc="table [V, D], i32 idx [...] -> [..., D]: row idx of table (a zero row when out "
           "of range); one thread per output element.")
define("scatter_add_rows", infer=_infer_scatter_add_rows, ref=_ref_scatter_add_rows,
       vjp=GRAD_ERROR, emit=_emit_scatter_add_rows,
       stitch=Stitch(prologue=(0,), epilogue=True),
       doc="dy [..., D], i32 idx [...] -> [rows, D]: out[v] = sum of dy[n] over idx[n] == v "
           "(out-of-range n skipped), summed in n order (deterministic, no atomics).")


@public
def embedding(table: Tensor, idx: Tensor) -> Tensor:
    """Rows of table [V, D] picked by i32 idx [...] -> [..., D] (ids from an input must be in
    0..V - 1: checked at each step or run; computed ids out of range give zeros).
    A row gather; the table gradient is a deterministic scatter-add of dy into [V, D]."""
    if table.ndim != 2:
        raise ShapeError("embedding", f"table must have rank 2 [V, D], got shape "
                         f"{list(table.shape)}")
    require_dtype("embedding", table.node, "f32", what="table")
    require_dtype("embedding", idx.node, "i32", what="indices")
    return record("gather_rows", [table, idx])


@public
def take_along_axis(x: Tensor, idx: Tensor, axis: int) -> Tensor:
    """out[..., k, ...] = x[..., idx[..., k, ...], ...] along `axis`: f32 x and i32 idx of
    the same rank, shapes equal except on `axis`; the output has idx's shape
    (indices from an input are checked at each step or run; computed ones out of range give
    0)."""
    from .reduce import sum as reduce_sum

    require_dtype("take_along_axis", x.node, "f32", what="input")
    require_dtype("take_along_axis", idx.node, "i32", what="indices")
    if x.ndim != idx.ndim or x.ndim == 0:
        raise ShapeError("take_along_axis", f"input {list(x.shape)} and indices "
                         f"{list(idx.shape)} must have the same rank >= 1")
    axis = normalize_axis("take_along_axis", axis, x.ndim)
    if any(a != b for k, (a, b) in enumerate(zip(x.shape, idx.shape)) if k != axis):
        raise ShapeError("take_along_axis", f"input {list(x.shape)} and indices "
                         f"{list(idx.shape)} must match except on axis {axis}")
    xs = move_to_last(x, axis)                       # [..., D]
    ids = move_to_last(idx, axis)                    # [..., K]
    depth = x.shape[axis]
    hot = one_hot(ids, depth)                        # [..., K, D]
    rows = reshape(xs, (*xs.shape[:-1], 1, depth))   # [..., 1, D]
    picked = reduce_sum(mul(hot, rows), axis=-1)     # [..., K]
    perm = list(range(x.ndim - 1))
    perm.insert(axis, x.ndim - 1)
    return permute(picked, perm)


__all__ = ["arange", "embedding", "one_hot", "take_along_axis"]
