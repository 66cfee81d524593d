"""Stochastic ops: dropout, randn, categorical.

Every draw is a pure function of (seed, salt, element index): the seed is the hidden 0-d i32
input `__prng_seed` (one per graph, fed per step), the salt is the number of stochastic ops
already in the graph when the op was recorded. The hash (PCG-style, u32 wrapping) is:

    h = u32(seed) ^ (salt * 0x9E3779B1) ^ idx
    h = h * 747796405 + 2891336453
    h = ((h >> ((h >> 28) + 4)) ^ h) * 277803737
    h = (h >> 22) ^ h
    u = f32(h) / 2^32

The NumPy reference computes the same bits, so kernels and reference agree exactly on the
uniforms. Kernels evaluate -ln(u) for u near 1 by its series in t = 1 - u (exact in f32): GPU
`log` is only accurate to ~5e-7 absolute near 1, which would make sqrt(-2 ln u) and
ln(-ln u) lose most of their digits there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import tensorgrad.codegen.torchexpr as tx
import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Attrs, DType, Node, Shape
from ..tensor import Tensor, next_salt, prng_seed
from .registry import NO_GRAD, define, public, record
from .rules import check_dims, normalize_axis, require_dtype

GOLDEN = 0x9E3779B1
PCG_MUL = 747796405
PCG_INC = 2891336453
PCG_MIX = 277803737
MASK32 = 0xFFFFFFFF
U_MIN = 1e-10  # lower clamp of uniforms that go through a log

HASH_WGSL = f"""fn pcg_mix(x: u32) -> u32 {{
  var h = x * {PCG_MUL}u + {PCG_INC}u;
  h = ((h >> ((h >> 28u) + 4u)) ^ h) * {PCG_MIX}u;
  return (h >> 22u) ^ h;
}}
fn pcg_hash(seed: i32, salt: u32, idx: u32) -> u32 {{
  return pcg_mix(bitcast<u32>(seed) ^ salt ^ idx);
}}
fn to_unit(h: u32) -> f32 {{
  return f32(h) / 4294967296.0f;
}}
fn neg_log_unit(u: f32) -> f32 {{
  let t = 1.0f - u;
  if (t < 0.05f) {{
    return t * (1.0f + t * (0.5f + t * (0.33333334f + t * (0.25f + t * 0.2f))));
  }}
  return -log(u);
}}"""


def salt_constant(salt: int) -> int:
    return (salt * GOLDEN) & MASK32


# ---- NumPy twin of the hash ------------------------------------------------------------

def _np() -> ModuleType:
    import numpy as np
    return np


def pcg_mix(x: Any) -> Any:
    """The three mixing steps on a uint64 array holding u32 values."""
    h = (x * PCG_MUL + PCG_INC) & MASK32
    h = (((h >> ((h >> 28) + 4)) ^ h) * PCG_MIX) & MASK32
    return (h >> 22) ^ h


def pcg_hash(seed: Any, salt: int, idx: Any) -> Any:
    """u32 hashes (as uint64) of element indices `idx` for a seed and a salt."""
    np = _np()
    s = int(np.asarray(seed).astype(np.int64).reshape(())) & MASK32
    return pcg_mix(np.uint64(s ^ salt_constant(salt)) ^ np.asarray(idx, dtype=np.uint64))


def to_unit(h: Any) -> Any:
    """f32(h) / 2^32 in float32, as the kernel computes it."""
    np = _np()
    return h.astype(np.float32) / np.float32(4294967296.0)


def _uniform(seed: Any, salt: int, shape: Shape) -> Any:
    np = _np()
    return to_unit(pcg_hash(seed, salt, np.arange(math.prod(shape), dtype=np.uint64))
                   ).reshape(shape)


# ---- dropout ---------------------------------------------------------------------------

def _scale(p: float) -> float:
    return 1.0 / (1.0 - p)


def _infer_dropout(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    x, seed = inputs
    require_dtype("dropout", x, "f32")
    require_dtype("dropout", seed, "i32", what="seed")
    return x.shape, "f32"


def _ref_dropout(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    x, seed = args
    p = node.attrs["p"]
    keep = _uniform(seed, node.attrs["salt"], x.shape) >= np.float32(p)
    return np.where(keep, x * x.dtype.type(np.float32(_scale(p))), x.dtype.type(0))


def _emit_dropout(ctx: EmitContext) -> Kernel:
    at = ctx.node.attrs
    body = (f"  let u = to_unit(pcg_hash(in1[0], {w.u(salt_constant(at['salt']))}, i));\n"
            f"  out[i] = select(0.0f, in0[i] * {w.lit(_scale(at['p']))}, u >= {w.lit(at['p'])});")
    return w.thread_kernel(ctx, body, prelude=HASH_WGSL)


def _vjp_dropout(ins: Sequence[Tensor], out: Tensor, dy: Tensor, at: Attrs
                 ) -> list[Tensor | None]:
    return [record("dropout", [dy, ins[1]], p=at["p"], salt=at["salt"]), None]


# torch draws from its own generator (same distribution); dropout follows module.train().
define("dropout", infer=_infer_dropout, ref=_ref_dropout, vjp=_vjp_dropout,
       emit=_emit_dropout,
       torch=lambda n, a, cx: tx.call("F.dropout", a[0].text,
                                      f"p={tx.literal(float(n.attrs['p']))}",
                                      "training=self.training"),
       doc="Inverted dropout: keep with probability 1-p (u >= p), scale kept by 1/(1-p).")


@public
def dropout(x: Tensor, p: float) -> Tensor:
    """Inverted dropout with drop probability p in [0, 1): each element is kept with
    probability 1-p and scaled by 1/(1-p). p == 0 returns x unchanged (no op)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ShapeError("dropout", f"p must be a number in [0, 1), got {p!r}")
    if not isinstance(x, Tensor):
        raise ShapeError("dropout", f"x must be a Tensor, got {type(x).__name__}")
    require_dtype("dropout", x.node, "f32")
    if p == 0:
        return x
    return record("dropout", [x, prng_seed()], p=float(p), salt=next_salt())


# ---- randn -----------------------------------------------------------------------------

def _infer_randn(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    require_dtype("randn", inputs[0], "i32", what="seed")
    return tuple(attrs["shape"]), "f32"


def _ref_randn(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    n = node.size
    h1 = pcg_hash(args[0], node.attrs["salt"], np.arange(n, dtype=np.uint64))
    h2 = pcg_mix(h1)
    u1 = np.maximum(np.float32(U_MIN), to_unit(h1))
    u2 = to_unit(h2)
    two_pi = np.float32(2.0 * math.pi)
    out = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(two_pi * u2)
    return out.reshape(node.shape)


def _emit_randn(ctx: EmitContext) -> Kernel:
    body = f"""  let h1 = pcg_hash(in0[0], {w.u(salt_constant(ctx.node.attrs['salt']))}, i);
  let h2 = pcg_mix(h1);
  let u1 = max({w.lit(U_MIN)}, to_unit(h1));
  let u2 = to_unit(h2);
  out[i] = sqrt(2.0f * neg_log_unit(u1)) * cos({w.lit(2.0 * math.pi)} * u2);"""
    return w.thread_kernel(ctx, body, prelude=HASH_WGSL)


define("randn", infer=_infer_randn, ref=_ref_randn, vjp=NO_GRAD, emit=_emit_randn,
       torch=lambda n, a, cx: tx.call("torch.randn", cx.tuple_(n.attrs["shape"]),
                                      f"device={cx.device()}"),
       doc="Standard normal samples (Box-Muller on two hashed uniforms).")


@public
def randn(shape: Sequence[int]) -> Tensor:
    """A tensor of `shape` (positive ints) of N(0, 1) samples, fresh every step."""
    if isinstance(shape, int):
        shape = (shape,)
    shape = check_dims("randn", tuple(shape))
    return record("randn", [prng_seed()], salt=next_salt(), shape=shape)


# ---- categorical -----------------------------------------------------------------------

def _infer_categorical(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    logits, seed = inputs
    require_dtype("categorical", logits, "f32", what="logits")
    require_dtype("categorical", seed, "i32", what="seed")
    if not logits.shape:
        raise ShapeError("categorical", "logits must have rank >= 1, got a 0-d tensor")
    return logits.shape[:-1], "i32"


def _ref_categorical(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    logits, seed = args
    lg = logits.astype(np.float32)
    u = np.maximum(np.float32(U_MIN), _uniform(seed, node.attrs["salt"], lg.shape))
    with np.errstate(divide="ignore"):
        v = lg - np.log(-np.log(u))
    return np.argmax(v, axis=-1).astype(np.int32)  # argmax: the first maximum


def _emit_categorical(ctx: EmitContext) -> Kernel:
    d = ctx.inputs[0].shape[-1]
    salt = w.u(salt_constant(ctx.node.attrs["salt"]))
    body = f"""  var best = {w.lit(-1e30)};
  var arg = 0i;
  for (var j = 0u; j < {w.u(d)}; j = j + 1u) {{
    let k = i * {w.u(d)} + j;
    let u = max({w.lit(U_MIN)}, to_unit(pcg_hash(in1[0], {salt}, k)));
    let v = in0[k] - log(neg_log_unit(u));
    if (v > best) {{ best = v; arg = i32(j); }}
  }}
  out[i] = arg;"""
    return w.thread_kernel(ctx, body, prelude=HASH_WGSL)


define("categorical_last", infer=_infer_categorical, ref=_ref_categorical, vjp=NO_GRAD,
       emit=_emit_categorical,
       torch=lambda n, a, cx: tx.call(cx.helper("categorical"), a[0].text),
       doc="One i32 sample per row of the last axis by Gumbel-max over raw logits.")


@public
def categorical(logits: Tensor, axis: int = -1) -> Tensor:
    """Sample one index per row along `axis` with probabilities softmax(logits) (Gumbel-max),
    as i32 with that axis removed. Not differentiable; for a temperature T pass logits / T."""
    if not isinstance(logits, Tensor):
        raise ShapeError("categorical", f"logits must be a Tensor, got {type(logits).__name__}")
    require_dtype("categorical", logits.node, "f32", what="logits")
    if not logits.shape:
        raise ShapeError("categorical", "logits must have rank >= 1, got a 0-d tensor")
    axis = normalize_axis("categorical", axis, logits.ndim)
    if axis != logits.ndim - 1:
        from .shape import move_to_last
        logits = move_to_last(logits, axis)
    return record("categorical_last", [logits, prng_seed()], salt=next_salt())


__all__ = ["categorical", "dropout", "randn"]
