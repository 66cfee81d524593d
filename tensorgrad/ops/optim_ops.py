"""Optimizer update primitives: fused kernels for gradient norms, Adam(W) and SGD.

These are appended by :mod:`tensorgrad.optim` after autograd; differentiating through them is
an error. Each node names the role of every input in ``attrs["roles"]`` (inputs are optional
depending on the configuration), so a printed graph says what each operand is.

Gradient transforms are folded into the update kernels instead of materializing scaled
gradients: a node with a ``gnorm`` input (the param's sum of squares, 0-d) normalizes its
gradient, ``g / (||g|| + 1e-8)``; a node with a ``gtotal`` input (the global sum of squares
after normalization, 0-d) clips it, ``g * min(clip / (sqrt(gtotal) + 1e-6), 1)``.

Primitives (n = the param's element count):

* ``grad_sumsq(g)`` -> f32[]: sum of g².
* ``grad_norm_total(s_1, ..., s_k)`` -> f32[]: sum of the terms; roles ``raw`` (s),
  ``normalized`` (s / (sqrt(s) + 1e-8)², the sum of squares once normalized) or ``acc`` (a
  previous partial total). At most 7 inputs (8 storage bindings), so totals are chained.
* ``adam_moments(state, g[, gnorm][, gtotal])`` with ``part``: ``mv`` (state ``[2, *shape]``
  holding m then v, both updated by one kernel), ``m`` or ``v`` (state of the param's shape).
  ``m' = b1 m + (1 - b1) g``; ``v' = b2 v + (1 - b2) g²``.
* ``adam_update_p(p, mv | m, v, lrt[, shrink])``: ``p' = s p - lrt m' / (sqrt(v') + eps)``
  with s = shrink[0] (decoupled weight decay) or 1.
* ``sgd_velocity(v, g[, p][, gnorm][, gtotal])``: ``v' = mu v + g_eff``, where
  ``g_eff = g + wd p`` (the ``p`` term only when the param decays).
* ``sgd_update_p(p[, g][, v], lr[, gnorm][, gtotal])``: ``p' = p - lr u`` with ``u = g_eff``
  (no momentum), ``v'`` (momentum) or ``g_eff + mu v'`` (Nesterov).

The step guard: ``finite_partials(x_1, ..., x_k)`` -> f32[G]: 1 where every element of every
input at a flat index ≡ j (mod G) is finite, else 0 (G threads scan interleaved, coalesced);
``step_ok(loss, partials..., [acc])`` -> f32[]: 1 when the loss and all partials are 1. The
optimizer feeds it ``update_partials`` flags (:mod:`.update_check`: a trial of each update,
with the expressions below, that also checks the gradient) rather than ``finite_partials``
of the gradients. Every update op takes an optional 0-d ``ok`` input and writes its old value
(param, moment, velocity) unchanged when ``ok`` is 0, so a step with a non-finite loss or
gradient, or whose update would make a param or state value non-finite, leaves params and
optimizer state exactly as they were.

The step guard and the gradient sums live in :mod:`.step_guard` (their names are importable
from here too); this module holds the update ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Attrs, DType, Node, Shape
from ..tensor import Tensor
from .registry import GRAD_ERROR, define, record
from .step_guard import (  # noqa: F401  (the guard's and the norms' names, importable here too)
    GUARD_PER_THREAD,
    GUARD_THREADS_MAX,
    MAX_GUARD_INPUTS,
    MAX_TOTAL_INPUTS,
    NONFINITE_WGSL,
    NORMALIZE_EPS,
    _np,
    _ok_ref,
    _ok_wgsl,
    _roles,
    grad_norm_total,
    grad_sumsq,
    guard,
    guard_width,
    step_ok,
    sumsq_total,
)

CLIP_EPS = 1e-6       # scale = min(clip / (total + CLIP_EPS), 1)
SCALE_ROLES = ("gnorm", "gtotal")
GUARD_ROLES = ("ok",)


# ---- shared checks ---------------------------------------------------------------------

def _check_inputs(op: str, inputs: Sequence[Node], attrs: Attrs,
                  required: Sequence[str], optional: Sequence[str]) -> dict[str, Node]:
    """Map role -> node after checking the roles, that every input is f32 and that the
    scale roles are 0-d and agree with `attrs["clip"]`."""
    roles = tuple(attrs.get("roles", ()))
    if len(roles) != len(inputs) or len(set(roles)) != len(roles):
        raise ShapeError(op, f"roles {list(roles)} must name each of the {len(inputs)} inputs "
                         "once")
    unknown = [r for r in roles if r not in (*required, *optional)]
    missing = [r for r in required if r not in roles]
    if unknown or missing:
        raise ShapeError(op, f"roles {list(roles)}: unknown {unknown}, missing {missing} "
                         f"(required {list(required)}, optional {list(optional)})")
    by_role = dict(zip(roles, inputs))
    for role, node in by_role.items():
        if node.dtype != "f32":
            raise ShapeError(op, f"input '{role}' must be f32, got {node.dtype}"
                             f"{list(node.shape)}")
    for role in ("gnorm", "gtotal", "lrt", "lr", "shrink", "ok"):
        if role in by_role and by_role[role].shape != ():
            raise ShapeError(op, f"input '{role}' must be 0-d, got shape "
                             f"{list(by_role[role].shape)}")
    clip = attrs.get("clip")
    if ("gtotal" in by_role) != (clip is not None):
        raise ShapeError(op, f"a 'gtotal' input and attrs clip={clip!r} go together")
    if clip is not None and not clip > 0:
        raise ShapeError(op, f"clip must be > 0, got {clip!r}")
    return by_role


def _same_shape(op: str, by_role: dict[str, Node], ref: str, *roles: str) -> None:
    for role in roles:
        if role in by_role and by_role[role].shape != by_role[ref].shape:
            raise ShapeError(op, f"input '{role}' has shape {list(by_role[role].shape)}, "
                             f"expected the shape of '{ref}' {list(by_role[ref].shape)}")


# ---- gradient scale (normalize / clip), shared by the update kernels ---------------------

def _ref_scale(args: Sequence[Any], node: Node) -> Any:
    """The gradient multiplier of a node: 1, 1/(||g||+1e-8), times the clip factor."""
    np = _np()
    r = _roles(node)
    scale = np.ones((), dtype=args[0].dtype)
    if "gnorm" in r:
        scale = scale / (np.sqrt(args[r["gnorm"]]) + NORMALIZE_EPS)
    if "gtotal" in r:
        clip = node.attrs["clip"]
        scale = scale * np.minimum(clip / (np.sqrt(args[r["gtotal"]]) + CLIP_EPS), 1.0)
    return scale.astype(args[0].dtype)


def _wgsl_scale(node: Node) -> str:
    """WGSL for `let gs = ...;` (uniform across threads)."""
    r = _roles(node)
    terms = []
    if "gnorm" in r:
        terms.append(f"(1.0f / (sqrt(in{r['gnorm']}[0]) + {w.lit(NORMALIZE_EPS)}))")
    if "gtotal" in r:
        clip = w.lit(node.attrs["clip"])
        terms.append(f"min({clip} / (sqrt(in{r['gtotal']}[0]) + {w.lit(CLIP_EPS)}), 1.0f)")
    return f"  let gs = {' * '.join(terms) if terms else '1.0f'};"


def _scale_inputs(gnorm: Tensor | None, gtotal: Tensor | None, ok: Tensor | None = None
                  ) -> tuple[list[Tensor], list[str]]:
    """The optional scale inputs (and the step guard) of an update op, with their roles."""
    tensors: list[Tensor] = []
    roles: list[str] = []
    for t, role in ((gnorm, "gnorm"), (gtotal, "gtotal"), (ok, "ok")):
        if t is not None:
            tensors.append(t)
            roles.append(role)
    return tensors, roles




# ---- Adam --------------------------------------------------------------------------------

ADAM_PARTS = ("mv", "m", "v")


def _infer_moments(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    op = "adam_moments"
    by = _check_inputs(op, inputs, attrs, ("state", "g"), (*SCALE_ROLES, *GUARD_ROLES))
    part = attrs.get("part")
    if part not in ADAM_PARTS:
        raise ShapeError(op, f"part must be one of {list(ADAM_PARTS)}, got {part!r}")
    g, state = by["g"].shape, by["state"].shape
    want = (2, *g) if part == "mv" else g
    if state != want:
        raise ShapeError(op, f"state has shape {list(state)}, expected {list(want)} for part "
                         f"'{part}' and a gradient of shape {list(g)}")
    for beta in ("beta1", "beta2"):
        if not 0.0 <= attrs.get(beta, -1.0) < 1.0:
            raise ShapeError(op, f"{beta} must be in [0, 1), got {attrs.get(beta)!r}")
    return state, "f32"


def _ref_moments(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    r, a = _roles(node), node.attrs
    state, g = args[r["state"]], args[r["g"]] * _ref_scale(args, node)

    def m_new(m: Any) -> Any:
        return a["beta1"] * m + (1.0 - a["beta1"]) * g

    def v_new(v: Any) -> Any:
        return a["beta2"] * v + (1.0 - a["beta2"]) * (g * g)

    if a["part"] == "m":
        new = m_new(state)
    elif a["part"] == "v":
        new = v_new(state)
    else:
        new = np.stack([m_new(state[0]), v_new(state[1])])
    return _ok_ref(args, node, new, "state")


# The update arithmetic as WGSL expressions of already-read values, shared by the update
# kernels and the step guard's trial of them (ops/update_check.py): both compute the same
# text, so the trial sees the values the update would write.

def adam_m_wgsl(attrs: Attrs, m: str, g: str) -> str:
    """m' = b1 m + (1 - b1) g (g already scaled)."""
    return f"{w.lit(attrs['beta1'])} * {m} + {w.lit(1.0 - attrs['beta1'])} * {g}"


def adam_v_wgsl(attrs: Attrs, v: str, g: str) -> str:
    """v' = b2 v + (1 - b2) g²."""
    return f"{w.lit(attrs['beta2'])} * {v} + {w.lit(1.0 - attrs['beta2'])} * ({g} * {g})"


def adam_p_wgsl(p: str, m: str, v: str, lrt: str, eps: float, shrink: str | None) -> str:
    """p' = s p - lrt m' / (sqrt(v') + eps)."""
    s = f"{shrink} * " if shrink else ""
    return f"{s}{p} - {lrt} * {m} / (sqrt({v}) + {w.lit(eps)})"


def sgd_wgsl(attrs: Attrs, p: str, g: str, v: str | None, lr: str
             ) -> tuple[str | None, str]:
    """(v' or None, p') of SGD from the effective gradient `g` (scaled, decay added) and the
    old velocity `v` (None without momentum): v' = mu v + g; p' = p - lr u with u = g, v', or
    g + mu v' (Nesterov). Where the update reads v' it is named `vn`."""
    mu = attrs.get("momentum", 0.0)
    if v is None or not mu > 0:
        return None, f"{p} - {lr} * {g}"
    vn = f"{w.lit(mu)} * {v} + {g}"
    u = f"({g} + {w.lit(mu)} * vn)" if attrs.get("nesterov") else "vn"
    return vn, f"{p} - {lr} * {u}"


def _emit_moments(ctx: EmitContext) -> Kernel:
    r, a = _roles(ctx.node), ctx.node.attrs
    n = ctx.inputs[r["g"]].size
    s = f"in{r['state']}"
    lines = [_wgsl_scale(ctx.node), f"  let g = in{r['g']}[i] * gs;"]
    node = ctx.node
    if a["part"] == "m":
        lines.append(f"  out[i] = {_ok_wgsl(node, adam_m_wgsl(a, f'{s}[i]', 'g'), f'{s}[i]')};")
    elif a["part"] == "v":
        lines.append(f"  out[i] = {_ok_wgsl(node, adam_v_wgsl(a, f'{s}[i]', 'g'), f'{s}[i]')};")
    else:
        j = f"i + {w.u(n)}"
        lines.append(f"  out[i] = {_ok_wgsl(node, adam_m_wgsl(a, f'{s}[i]', 'g'), f'{s}[i]')};")
        lines.append(f"  out[{j}] = "
                     f"{_ok_wgsl(node, adam_v_wgsl(a, f'{s}[{j}]', 'g'), f'{s}[{j}]')};")
    return w.thread_kernel(ctx, "\n".join(lines), n)


define("adam_moments", infer=_infer_moments, ref=_ref_moments, vjp=GRAD_ERROR,
       emit=_emit_moments,
       doc="Adam's first/second moment update (m and v packed in one [2, ...] state, or one "
           "of them), gradient normalize/clip folded in.")


def adam_moments(state: Tensor, g: Tensor, part: str, beta1: float, beta2: float,
                 gnorm: Tensor | None = None, gtotal: Tensor | None = None,
                 clip: float | None = None, ok: Tensor | None = None) -> Tensor:
    """New moments from `state` (m, v or both packed as [2, *g.shape]) and gradient `g`
    (the old `state` where the step guard `ok` is 0)."""
    extra, roles = _scale_inputs(gnorm, gtotal, ok)
    return record("adam_moments", [state, g, *extra], roles=("state", "g", *roles), part=part,
                  beta1=float(beta1), beta2=float(beta2), clip=clip)


def _infer_adam_p(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    op = "adam_update_p"
    by = _check_inputs(op, inputs, attrs, ("p", "lrt"), ("mv", "m", "v", "shrink", "ok"))
    p = by["p"].shape
    if "mv" in by:
        if "m" in by or "v" in by or by["mv"].shape != (2, *p):
            raise ShapeError(op, f"expected a packed 'mv' of shape {[2, *p]} alone, got roles "
                             f"{list(attrs['roles'])} with mv {list(by['mv'].shape)}")
    elif "m" in by and "v" in by:
        _same_shape(op, by, "p", "m", "v")
    else:
        raise ShapeError(op, f"needs 'mv' or both 'm' and 'v', got roles {list(attrs['roles'])}")
    if not attrs.get("eps", 0.0) > 0.0:
        raise ShapeError(op, f"eps must be > 0, got {attrs.get('eps')!r}")
    return p, "f32"


def _ref_adam_p(args: Sequence[Any], node: Node) -> Any:
    np = _np()
    r = _roles(node)
    p = args[r["p"]]
    if "mv" in r:
        m, v = args[r["mv"]][0], args[r["mv"]][1]
    else:
        m, v = args[r["m"]], args[r["v"]]
    shrink = args[r["shrink"]] if "shrink" in r else 1.0
    new = shrink * p - args[r["lrt"]] * m / (np.sqrt(v) + node.attrs["eps"])
    return _ok_ref(args, node, np.asarray(new, dtype=p.dtype), "p")


def _emit_adam_p(ctx: EmitContext) -> Kernel:
    r = _roles(ctx.node)
    n = ctx.node.size
    if "mv" in r:
        m, v = f"in{r['mv']}[i]", f"in{r['mv']}[i + {w.u(n)}]"
    else:
        m, v = f"in{r['m']}[i]", f"in{r['v']}[i]"
    shrink = f"in{r['shrink']}[0]" if "shrink" in r else None
    new = adam_p_wgsl(f"in{r['p']}[i]", "m", "v", f"in{r['lrt']}[0]", ctx.node.attrs["eps"],
                      shrink)
    body = f"""  let m = {m};
  let v = {v};
  out[i] = {_ok_wgsl(ctx.node, new, f"in{r['p']}[i]")};"""
    return w.thread_kernel(ctx, body)


define("adam_update_p", infer=_infer_adam_p, ref=_ref_adam_p, vjp=GRAD_ERROR,
       emit=_emit_adam_p,
       doc="Adam param update p' = s·p − lrt·m'/(√v' + eps), s the decoupled-decay shrink.")


def adam_update_p(p: Tensor, moments: Sequence[Tensor], lrt: Tensor, eps: float,
                  shrink: Tensor | None = None, ok: Tensor | None = None) -> Tensor:
    """The new param from the new moments (one packed [2, ...] tensor, or m and v); the old
    param where the step guard `ok` is 0."""
    roles: tuple[str, ...] = ("mv",) if len(moments) == 1 else ("m", "v")
    inputs, extra = [p, *moments, lrt], ("lrt",)
    extra_roles: tuple[str, ...] = extra
    for t, role in ((shrink, "shrink"), (ok, "ok")):
        if t is not None:
            inputs.append(t)
            extra_roles += (role,)
    return record("adam_update_p", inputs, roles=("p", *roles, *extra_roles), eps=float(eps))


# ---- SGD ---------------------------------------------------------------------------------

def _check_sgd_attrs(op: str, by: dict[str, Node], attrs: Attrs) -> None:
    mu, wd = attrs.get("momentum", 0.0), attrs.get("weight_decay", 0.0)
    if mu < 0 or wd < 0:
        raise ShapeError(op, f"momentum {mu!r} and weight_decay {wd!r} must be >= 0")
    if attrs.get("nesterov") and not mu > 0:
        raise ShapeError(op, f"nesterov needs momentum > 0, got {mu!r}")


def _g_eff_ref(args: Sequence[Any], node: Node) -> Any:
    r, wd = _roles(node), node.attrs["weight_decay"]
    g = args[r["g"]] * _ref_scale(args, node)
    return g + wd * args[r["p"]] if wd else g


def _g_eff_wgsl(node: Node) -> str:
    r, wd = _roles(node), node.attrs["weight_decay"]
    decay = f" + {w.lit(wd)} * in{r['p']}[i]" if wd else ""
    return f"{_wgsl_scale(node)}\n  let g = in{r['g']}[i] * gs{decay};"


def _infer_velocity(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    op = "sgd_velocity"
    by = _check_inputs(op, inputs, attrs, ("v", "g"), ("p", *SCALE_ROLES, *GUARD_ROLES))
    _same_shape(op, by, "v", "g", "p")
    _check_sgd_attrs(op, by, attrs)
    if not attrs["momentum"] > 0:
        raise ShapeError(op, f"momentum must be > 0, got {attrs['momentum']!r}")
    if ("p" in by) != (attrs["weight_decay"] > 0):
        raise ShapeError(op, "a 'p' input and weight_decay > 0 go together")
    return by["v"].shape, "f32"


def _ref_velocity(args: Sequence[Any], node: Node) -> Any:
    new = node.attrs["momentum"] * args[_roles(node)["v"]] + _g_eff_ref(args, node)
    return _ok_ref(args, node, new, "v")


def _emit_velocity(ctx: EmitContext) -> Kernel:
    r = _roles(ctx.node)
    vn, _ = sgd_wgsl(ctx.node.attrs, "p", "g", f"in{r['v']}[i]", "lr")
    new = _ok_wgsl(ctx.node, str(vn), f"in{r['v']}[i]")
    return w.thread_kernel(ctx, f"{_g_eff_wgsl(ctx.node)}\n  out[i] = {new};")


define("sgd_velocity", infer=_infer_velocity, ref=_ref_velocity, vjp=GRAD_ERROR,
       emit=_emit_velocity,
       doc="SGD momentum buffer v' = μ·v + g_eff (g_eff = scaled g + wd·p).")


def _infer_sgd_p(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    op = "sgd_update_p"
    by = _check_inputs(op, inputs, attrs, ("p", "lr"), ("g", "v", *SCALE_ROLES, *GUARD_ROLES))
    _same_shape(op, by, "p", "g", "v")
    _check_sgd_attrs(op, by, attrs)
    has_v, needs_g = "v" in by, "v" not in by or bool(attrs.get("nesterov"))
    if has_v != (attrs["momentum"] > 0) or ("g" in by) != needs_g:
        raise ShapeError(op, f"roles {list(attrs['roles'])} do not fit momentum="
                         f"{attrs['momentum']!r}, nesterov={attrs.get('nesterov')!r}")
    if "g" not in by and (attrs["weight_decay"] or "gnorm" in by or "gtotal" in by):
        raise ShapeError(op, "weight decay and gradient scaling need the 'g' input")
    return by["p"].shape, "f32"


def _ref_sgd_p(args: Sequence[Any], node: Node) -> Any:
    r, a = _roles(node), node.attrs
    if "v" not in r:
        update = _g_eff_ref(args, node)
    elif a["nesterov"]:
        update = _g_eff_ref(args, node) + a["momentum"] * args[r["v"]]
    else:
        update = args[r["v"]]
    return _ok_ref(args, node, args[r["p"]] - args[r["lr"]] * update, "p")


def _emit_sgd_p(ctx: EmitContext) -> Kernel:
    r = _roles(ctx.node)
    lines = [_g_eff_wgsl(ctx.node)] if "g" in r else []
    p, lr = f"in{r['p']}[i]", f"in{r['lr']}[0]"
    if "v" in r:  # the new velocity, as sgd_velocity wrote it
        lines.append(f"  let vn = in{r['v']}[i];")
    _, new = sgd_wgsl(ctx.node.attrs, p, "g", "v" if "v" in r else None, lr)
    lines.append(f"  out[i] = {_ok_wgsl(ctx.node, new, p)};")
    return w.thread_kernel(ctx, "\n".join(lines))


define("sgd_update_p", infer=_infer_sgd_p, ref=_ref_sgd_p, vjp=GRAD_ERROR, emit=_emit_sgd_p,
       doc="SGD param update p' = p − lr·u, u = g_eff, v' or g_eff + μ·v' (Nesterov).")


def sgd_velocity(v: Tensor, g: Tensor, momentum: float, weight_decay: float = 0.0,
                 p: Tensor | None = None, gnorm: Tensor | None = None,
                 gtotal: Tensor | None = None, clip: float | None = None,
                 ok: Tensor | None = None) -> Tensor:
    """The new momentum buffer; pass `p` exactly when `weight_decay > 0`; the old one where
    the step guard `ok` is 0."""
    extra, roles = _scale_inputs(gnorm, gtotal, ok)
    inputs, names = [v, g], ["v", "g"]
    if p is not None:
        inputs.append(p)
        names.append("p")
    return record("sgd_velocity", [*inputs, *extra], roles=(*names, *roles),
                  momentum=float(momentum), weight_decay=float(weight_decay), clip=clip)


def sgd_update_p(p: Tensor, lr: Tensor, g: Tensor | None = None, v: Tensor | None = None,
                 momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                 gnorm: Tensor | None = None, gtotal: Tensor | None = None,
                 clip: float | None = None, ok: Tensor | None = None) -> Tensor:
    """The new param; `g` is needed without momentum and with Nesterov, `v` with momentum;
    the old param where the step guard `ok` is 0."""
    inputs, names = [p], ["p"]
    for t, name in ((g, "g"), (v, "v")):
        if t is not None:
            inputs.append(t)
            names.append(name)
    inputs.append(lr)
    names.append("lr")
    extra, roles = _scale_inputs(gnorm, gtotal) if g is not None else ([], [])
    if ok is not None:
        extra, roles = [*extra, ok], [*roles, "ok"]
    return record("sgd_update_p", [*inputs, *extra], roles=(*names, *roles),
                  momentum=float(momentum), nesterov=bool(nesterov),
                  weight_decay=float(weight_decay) if g is not None else 0.0,
                  clip=clip if g is not None else None)


__all__ = ["adam_moments", "adam_update_p", "grad_norm_total", "grad_sumsq", "guard",
           "guard_width", "sgd_update_p", "sgd_velocity", "step_ok", "sumsq_total"]
