"""The step guard's trial of an optimizer update: would the new params and state be finite?

``update_partials(p, g, state..., lr[, shrink][, gnorm][, gtotal])`` -> f32[G] with ``rule``
``adam`` (state ``mv`` packed, or ``m`` and ``v``; ``lr`` is Adam's lrt) or ``sgd`` (state
``v`` with momentum): 1 where, at every flat index ≡ j (mod G), the gradient, the new state
and the new param the update would write are all finite, else 0. It computes them with the
update kernels' own expressions (:func:`~tensorgrad.ops.optim_ops.adam_m_wgsl` and friends)
and writes nothing else, so the guard (``step_ok`` over these flags and the loss) is known
before any update op runs: a step whose update would overflow (a huge learning rate, a
gradient whose square is inf) is skipped with params and optimizer state unchanged, like one
with a non-finite loss or gradient. One node per param (or per arena group); G threads scan
interleaved, coalesced slices, as ``finite_partials`` does.

``attrs["params"]`` names the params the node covers, ``((name, start, size), ...)`` in its
flat range, so a failed step can say which param would have become non-finite
(:func:`new_values` gives the values on the host). Without room for every input (9 bindings:
split Adam moments with decay, normalization and clipping, on a device of 8 storage buffers
per stage), the trial checks the gradient and the new moments only (``check_p`` False, no
``p`` input): a kernel binds only what it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorgrad.codegen.wgsl as w

from ..codegen.kernel import EmitContext, Kernel
from ..errors import ShapeError
from ..ir import Attrs, DType, Node, Shape
from ..tensor import Tensor
from . import optim_ops as oo
from . import step_guard as sg
from .registry import GRAD_ERROR, define, record

RULES = {"adam": ("mv", "m", "v"), "sgd": ("v",)}
SCALARS = ("lr", "shrink", "gnorm", "gtotal")


def _infer(inputs: Sequence[Node], attrs: Attrs) -> tuple[Shape, DType]:
    op = "update_partials"
    rule = attrs.get("rule")
    if rule not in RULES:
        raise ShapeError(op, f"rule must be one of {sorted(RULES)}, got {rule!r}")
    by = oo._check_inputs(op, inputs, attrs, ("g",), ("p", *RULES[rule], *SCALARS))
    n = by["g"].shape
    oo._same_shape(op, by, "g", "p", *(s for s in ("m", "v") if s in by))
    if ("p" in by) != bool(attrs.get("check_p", True)) and rule == "adam" or \
            rule == "sgd" and "p" not in by:
        raise ShapeError(op, f"a 'p' input and check_p={attrs.get('check_p')!r} go together "
                         f"(sgd always needs 'p'), got roles {list(attrs['roles'])}")
    if "mv" in by and (by["mv"].shape != (2, *n) or "m" in by or "v" in by):
        raise ShapeError(op, f"expected a packed 'mv' of shape {[2, *n]} alone, got roles "
                         f"{list(attrs['roles'])}")
    if rule == "adam" and "mv" not in by and not ("m" in by and "v" in by):
        raise ShapeError(op, f"adam needs 'mv' or both 'm' and 'v', got roles "
                         f"{list(attrs['roles'])}")
    if attrs.get("check_p", True) and "lr" not in by:
        raise ShapeError(op, "checking the new param needs the 'lr' input")
    return (oo.guard_width([by["g"].size]),), "f32"


def new_values(args: Sequence[Any], node: Node) -> dict[str, Any]:
    """{name: array} of what the update would write (NumPy, the node's float dtype): the
    gradient "g", then "m", "v" (Adam) or "v" (SGD with momentum), then "p" (if checked)."""
    np = sg._np()
    r, a = sg._roles(node), node.attrs
    g0 = args[r["g"]]
    gs = oo._ref_scale(args, node)
    p: Any = args[r["p"]] if "p" in r else None  # (an array, or None for no param input)
    out = {"g": g0}
    with np.errstate(all="ignore"):
        if a["rule"] == "adam":
            g = g0 * gs
            m0, v0 = (args[r["mv"]][0], args[r["mv"]][1]) if "mv" in r else \
                (args[r["m"]], args[r["v"]])
            out["m"] = a["beta1"] * m0 + (1.0 - a["beta1"]) * g
            out["v"] = a["beta2"] * v0 + (1.0 - a["beta2"]) * (g * g)
            if a.get("check_p", True):
                s = args[r["shrink"]] if "shrink" in r else 1.0
                out["p"] = s * p - args[r["lr"]] * out["m"] / (np.sqrt(out["v"]) + a["eps"])
        else:
            g = g0 * gs + (a["weight_decay"] * p if a["weight_decay"] else 0.0)
            u = g
            if "v" in r:
                out["v"] = a["momentum"] * args[r["v"]] + g
                u = g + a["momentum"] * out["v"] if a["nesterov"] else out["v"]
            out["p"] = p - args[r["lr"]] * u
    return {k: np.asarray(v, dtype=g0.dtype) for k, v in out.items()}


def _ref(args: Sequence[Any], node: Node) -> Any:
    np = sg._np()
    width = node.shape[0]
    ok = np.ones(width, dtype=bool)
    for x in new_values(args, node).values():
        flat = np.asarray(x).reshape(-1)
        padded = np.ones(-(-flat.size // width) * width, dtype=flat.dtype)
        padded[:flat.size] = flat
        ok &= np.isfinite(padded.reshape(-1, width)).all(axis=0)
    return ok.astype(args[0].dtype)


def _emit(ctx: EmitContext) -> Kernel:
    r, a = sg._roles(ctx.node), ctx.node.attrs
    n, width = ctx.inputs[r["g"]].size, ctx.node.shape[0]

    def at(role: str, offset: int = 0) -> str:
        return f"in{r[role]}[e + {w.u(offset)}]" if offset else f"in{r[role]}[e]"

    lines = [oo._wgsl_scale(ctx.node), "  var bad = false;",
             f"  for (var e = i; e < {w.u(n)}; e = e + {w.u(width)}) {{",
             f"    let g0 = {at('g')};", "    bad = bad || nonfinite(g0);"]
    lr = f"in{r['lr']}[0]" if "lr" in r else ""
    if a["rule"] == "adam":
        m0, v0 = (at("mv"), at("mv", n)) if "mv" in r else (at("m"), at("v"))
        lines += ["    let g = g0 * gs;", f"    let m = {oo.adam_m_wgsl(a, m0, 'g')};",
                  f"    let v = {oo.adam_v_wgsl(a, v0, 'g')};",
                  "    bad = bad || nonfinite(m) || nonfinite(v);"]
        if a.get("check_p", True):
            shrink = f"in{r['shrink']}[0]" if "shrink" in r else None
            lines += [f"    let pn = {oo.adam_p_wgsl(at('p'), 'm', 'v', lr, a['eps'], shrink)};",
                      "    bad = bad || nonfinite(pn);"]
    else:
        decay = f" + {w.lit(a['weight_decay'])} * {at('p')}" if a["weight_decay"] else ""
        lines.append(f"    let g = g0 * gs{decay};")
        vn, pn = oo.sgd_wgsl(a, at("p"), "g", at("v") if "v" in r else None, lr)
        if vn is not None:
            lines += [f"    let vn = {vn};", "    bad = bad || nonfinite(vn);"]
        lines += [f"    let pn = {pn};", "    bad = bad || nonfinite(pn);"]
    lines += ["  }", "  out[i] = select(1.0f, 0.0f, bad);"]
    return w.thread_kernel(ctx, "\n".join(lines), width, prelude=sg.NONFINITE_WGSL)


define("update_partials", infer=_infer, ref=_ref, vjp=GRAD_ERROR, emit=_emit,
       doc="Partial all-finite flags of what an optimizer update would write (gradient, new "
           "state, new param), for the step guard.")


def update_partials(rule: str, p: Tensor, g: Tensor, states: Sequence[tuple[str, Tensor]],
                    scalars: Sequence[tuple[str, Tensor | None]], attrs: Attrs,
                    params: Sequence[tuple[str, int, int]], max_inputs: int = 7) -> Tensor:
    """The trial of one update (`rule` "adam" | "sgd"): `states` are (role, old state)
    pairs, `scalars` (role, 0-d tensor or None) pairs of SCALARS, `attrs` the update's own
    (beta1, beta2, eps | momentum, nesterov, weight_decay; clip), `params` (name, start,
    size) of the params it covers. Past `max_inputs` inputs the new param is not checked."""
    inputs, roles = [p, g], ["p", "g"]
    for role, t in [*states, *scalars]:
        if t is not None:
            inputs.append(t)
            roles.append(role)
    check_p = len(inputs) <= max_inputs or rule != "adam"
    if not check_p:  # keep g, the moments and the gradient scale: drop what only p' needs
        keep = [k for k, role in enumerate(roles) if role not in ("p", "lr", "shrink")]
        inputs, roles = [inputs[k] for k in keep], [roles[k] for k in keep]
    return record("update_partials", inputs, roles=tuple(roles), rule=rule, check_p=check_p,
                  params=tuple(params), **attrs)


__all__ = ["new_values", "update_partials"]
