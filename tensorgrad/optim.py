"""Optimizers: plain-data configs, and the update ops they append to a training graph.

Configs are frozen dataclasses (``to_dict`` / ``from_dict`` carry them across the worker
boundary). :func:`append_optimizer` appends, after autograd, the gradient transforms, the
optimizer state (zero-initialized ``state`` leaves) and the update ops, and returns an
:class:`OptimizerPlan`: the writebacks the runtime copies after each step and the hidden
0-d inputs it feeds each step (values from :meth:`OptimizerPlan.host_scalars`).

Semantics (step t is 1-based; the runtime increments t before each step):

* Gradient transforms, in this order: ``normalize_grads`` (selected params:
  ``g / (||g|| + 1e-8)``), then ``clip_grad_norm = c`` (``total`` = global L2 norm of the
  normalized gradients, every gradient times ``min(c / (total + 1e-6), 1)``). They are folded
  into the update kernels; no scaled gradient is materialized.
* Adam / AdamW: ``m' = b1 m + (1 - b1) g``, ``v' = b2 v + (1 - b2) g²``,
  ``p' = s p - lrt m' / (sqrt(v') + eps)`` with ``lrt = lr_t sqrt(1 - b2^t) / (1 - b1^t)``
  computed on the host (this is Adam with eps scaled by ``sqrt(1 - b2^t)`` relative to the
  textbook ``m_hat / (sqrt(v_hat) + eps)``). AdamW's decoupled decay ``s = 1 - lr_t wd`` is a
  per-step input too (so ``set_lr`` changes it); s = 1 for params that do not decay.
* SGD: ``g_eff = g + wd p`` for decayed params (coupled L2); with momentum ``v' = mu v + g_eff``
  and the update is ``v'`` (or ``g_eff + mu v'`` with Nesterov), else ``g_eff``;
  ``p' = p - lr_t update``.
* Which params decay (``weight_decay > 0``): a param's entry in ``decay`` (from
  ``Module.param``) wins; other params follow ``decay_filter`` (default: all).

Name filters (``normalize_grads``, ``decay_filter``): True (all), False (none), a glob pattern
matched against the whole param name with :func:`fnmatch.fnmatchcase` (``"*.weight"``), or a
callable ``name -> bool``. A callable does not serialize: ``to_dict`` writes the marker
``"<callable>"``, which is fine for the worker (filters only matter when appending the
optimizer) but is refused if a config read back with it is appended to a graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from fnmatch import fnmatchcase
from typing import Any, ClassVar, NamedTuple

from . import lr as lr_mod
from .gpu.interface import DeviceLimits
from .ir import Graph, Node
from .ops import optim_ops as oo
from .ops import update_check as uc
from .ops.arena import arena_layout, pack
from .ops.shape import narrow
from .tensor import Tensor, leaf, tracing

NameFilter = bool | str | Callable[[str], bool]
CALLABLE_MARK = "<callable>"
ADAM_LRT = "__adam_lrt"
"""The hidden per-step input of Adam/AdamW: ``lr_t sqrt(1 - b2^t) / (1 - b1^t)``."""
ADAM_SHRINK = "__adam_decay_shrink"
"""The hidden per-step input of AdamW's decoupled decay: ``1 - lr_t weight_decay``."""
SGD_LR = "__sgd_lr"
"""The hidden per-step input of SGD: the step's learning rate."""


# ---- configs -----------------------------------------------------------------------------

def _number(what: str, value: Any, low: float | None = None, high: float | None = None,
            low_open: bool = False, high_open: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{what} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{what} must be {'<' if high_open else '<='} {high}, got {value!r}")


def _check_filter(what: str, value: Any) -> None:
    if not (isinstance(value, (bool, str)) or callable(value)):
        raise TypeError(f"{what} must be True, False, a glob pattern or a callable name -> "
                        f"bool, got {value!r}")


class _Common:
    """Checks shared by every config."""

    kind: ClassVar[str]
    lr: lr_mod.LR
    clip_grad_norm: float | None
    normalize_grads: NameFilter

    def _check_common(self) -> None:
        name = type(self).__name__
        lr_mod._check_lr(f"{name}: lr", self.lr)
        if self.clip_grad_norm is not None:
            _number(f"{name}: clip_grad_norm", self.clip_grad_norm, 0.0, low_open=True)
        _check_filter(f"{name}: normalize_grads", self.normalize_grads)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: `kind`, the fields, the LR as :func:`tensorgrad.lr.to_dict` gives it."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name == "lr":
                value = lr_mod.to_dict(value)
            elif callable(value):
                value = CALLABLE_MARK
            out[f.name] = value
        return out


@dataclass(frozen=True)
class Adam(_Common):
    """Adam (no weight decay). See the module docstring for the exact update."""

    lr: lr_mod.LR
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    clip_grad_norm: float | None = None
    normalize_grads: NameFilter = False
    kind: ClassVar[str] = "adam"

    def __post_init__(self) -> None:
        self._check_common()
        _number("Adam: beta1", self.beta1, 0.0, 1.0)
        _number("Adam: beta2", self.beta2, 0.0, 1.0)
        _number("Adam: eps", self.eps, 0.0, low_open=True)


@dataclass(frozen=True)
class AdamW(_Common):
    """Adam with decoupled weight decay ``p <- (1 - lr_t wd) p`` on the decayed params."""

    lr: lr_mod.LR
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    decay_filter: NameFilter = True
    clip_grad_norm: float | None = None
    normalize_grads: NameFilter = False
    kind: ClassVar[str] = "adamw"

    def __post_init__(self) -> None:
        self._check_common()
        _number("AdamW: beta1", self.beta1, 0.0, 1.0)
        _number("AdamW: beta2", self.beta2, 0.0, 1.0)
        _number("AdamW: eps", self.eps, 0.0, low_open=True)
        _number("AdamW: weight_decay", self.weight_decay, 0.0)
        _check_filter("AdamW: decay_filter", self.decay_filter)


@dataclass(frozen=True)
class SGD(_Common):
    """SGD with optional momentum / Nesterov and coupled (L2) weight decay."""

    lr: lr_mod.LR
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    decay_filter: NameFilter = True
    clip_grad_norm: float | None = None
    normalize_grads: NameFilter = False
    kind: ClassVar[str] = "sgd"

    def __post_init__(self) -> None:
        self._check_common()
        _number("SGD: momentum", self.momentum, 0.0)
        _number("SGD: weight_decay", self.weight_decay, 0.0)
        _check_filter("SGD: decay_filter", self.decay_filter)
        if not isinstance(self.nesterov, bool):
            raise TypeError(f"SGD: nesterov must be a bool, got {self.nesterov!r}")
        if self.nesterov and self.momentum <= 0:
            raise ValueError(f"SGD: nesterov=True needs momentum > 0, got momentum="
                             f"{self.momentum!r}")


OptimizerConfig = Adam | AdamW | SGD
"""Any optimizer config."""
CONFIGS: dict[str, type] = {"adam": Adam, "adamw": AdamW, "sgd": SGD}


def to_dict(config: OptimizerConfig) -> dict[str, Any]:
    """`config` as plain data (``{kind: "adam", lr: ..., ...}``), what the worker protocol
    carries; :func:`from_dict` reads it back."""
    return config.to_dict()


def from_dict(data: Mapping[str, Any]) -> OptimizerConfig:
    """Inverse of :meth:`to_dict` (a callable filter comes back as the marker string)."""
    kind = data.get("kind")
    if kind not in CONFIGS:
        raise ValueError(f"unknown optimizer kind {kind!r} (known: {sorted(CONFIGS)})")
    args = {k: v for k, v in data.items() if k != "kind"}
    if "lr" in args:
        args["lr"] = lr_mod.from_dict(args["lr"])
    return CONFIGS[kind](**args)


# ---- per-step host scalars -----------------------------------------------------------------

def host_scalars(config: OptimizerConfig, t: int, lr: lr_mod.LR | None = None,
                 names: tuple[str, ...] | None = None) -> dict[str, float]:
    """The hidden 0-d inputs for 1-based step `t` (`lr` overrides the config's LR, e.g. a
    rebased one after ``set_lr``); `names` restricts the result to the inputs a plan has."""
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise ValueError(f"the optimizer step t is 1-based, got {t!r}")
    lr_t = lr_mod.resolve(config.lr if lr is None else lr, t)
    if isinstance(config, SGD):
        out = {SGD_LR: lr_t}
    else:
        lrt = lr_t * math.sqrt(1.0 - config.beta2 ** t) / (1.0 - config.beta1 ** t)
        out = {ADAM_LRT: lrt}
        if isinstance(config, AdamW):
            out[ADAM_SHRINK] = 1.0 - lr_t * config.weight_decay
    return out if names is None else {k: out[k] for k in names}


class Writeback(NamedTuple):
    """After each step, copy node `source` into the leaf `dest` of `kind` 'param'|'state', or
    (kind 'node') into node `dest`'s bytes at byte `offset` (a range of the param arena)."""

    source: int
    dest: str | int
    kind: str
    offset: int = 0


@dataclass(frozen=True)
class OptimizerPlan:
    """What :func:`append_optimizer` added: writebacks, hidden inputs, state and choices."""

    config: OptimizerConfig
    writebacks: tuple[Writeback, ...]
    scalar_inputs: tuple[str, ...]
    states: tuple[str, ...] = ()
    decayed: tuple[str, ...] = ()
    normalized: tuple[str, ...] = ()
    params: tuple[str, ...] = field(default=())
    status: int | None = None  # the step guard node: 1.0 when the update was applied
    # The param arena: {param name: element offset} and its element count (None: each
    # param is updated on its own).
    layout: dict[str, int] | None = None
    arena_size: int = 0

    def host_scalars(self, config_or_lr: OptimizerConfig | lr_mod.LR, t: int) -> dict[str, float]:
        """{hidden input name: value} for step `t`, from an LR (number or schedule, e.g.
        rebased by ``set_lr``) or a config that differs from this plan's at most in `lr`."""
        if isinstance(config_or_lr, tuple(CONFIGS.values())):
            base = replace(config_or_lr, lr=self.config.lr)  # type: ignore[type-var]
            if base.to_dict() != self.config.to_dict():
                raise ValueError(f"host_scalars: the config {config_or_lr.to_dict()} differs "
                                 f"from the compiled one {self.config.to_dict()} in more than "
                                 "lr; only the LR can change without recompiling")
            lr = config_or_lr.lr  # type: ignore[union-attr]
        else:
            lr = config_or_lr
        return host_scalars(self.config, t, lr=lr, names=self.scalar_inputs)

    def renumbered(self, remap: Mapping[int, int]) -> OptimizerPlan:
        """The same plan with writeback sources re-pointed through `remap` (old id → new)."""
        return replace(self, writebacks=tuple(
            wb._replace(source=remap[wb.source],
                        dest=remap[wb.dest] if wb.kind == "node" else wb.dest)
            for wb in self.writebacks),
                       status=None if self.status is None else remap[self.status])

    def __str__(self) -> str:
        head = (f"optimizer {self.config.kind}: {len(self.params)} params, hidden inputs "
                f"{list(self.scalar_inputs)}")
        lines = [head]
        if self.decayed:
            lines.append(f"  decayed: {', '.join(self.decayed)}")
        if self.normalized:
            lines.append(f"  normalized: {', '.join(self.normalized)}")
        lines += [f"  %{wb.source} -> {wb.kind} '{wb.dest}'" for wb in self.writebacks]
        return "\n".join(lines)


# ---- appending the optimizer ---------------------------------------------------------------

def _select(what: str, rule: NameFilter, name: str) -> bool:
    if rule == CALLABLE_MARK:
        raise ValueError(f"{what} was a callable that did not survive serialization; "
                         "use a glob pattern, or the original config object")
    if isinstance(rule, bool):
        return rule
    if isinstance(rule, str):
        return fnmatchcase(name, rule)
    return bool(rule(name))


def _check_grads(graph: Graph, grads: Mapping[str, int],
                 decay: Mapping[str, bool]) -> dict[str, Node]:
    params = graph.params
    out: dict[str, Node] = {}
    for name, gid in grads.items():
        if name not in params:
            raise ValueError(f"append_optimizer: gradient given for '{name}', which is not a "
                             f"param of the graph (params: {sorted(params)})")
        p = params[name]
        if not isinstance(gid, int) or not 0 <= gid < len(graph.nodes):
            raise ValueError(f"append_optimizer: gradient of '{name}' is not a node id: "
                             f"{gid!r}")
        g = graph[gid]
        if p.dtype != "f32" or g.dtype != "f32" or g.shape != p.shape:
            raise ValueError(f"append_optimizer: param '{name}' is {p.dtype}{list(p.shape)} "
                             f"but its gradient %{gid} is {g.dtype}{list(g.shape)}")
        out[name] = p
    unknown = sorted(set(decay) - set(params))
    if unknown:
        raise ValueError(f"append_optimizer: decay flags for unknown params {unknown}")
    return out


def _moments_packed(p: Node, limits: DeviceLimits) -> bool:
    """m and v share one [2, ...] state when that tensor fits one binding."""
    return 2 * max(4, p.nbytes) <= min(limits.max_storage_buffer_binding_size,
                                       limits.max_buffer_size)


@dataclass
class _Appender:
    """What the update loops share while appending: tensors, scale inputs, the step guard
    (with `loss`: each update is tried first, see ops/update_check.py), the results."""

    grads: dict[str, Tensor]
    params: dict[str, Tensor]
    gnorm: dict[str, Tensor]
    gtotal: Tensor | None
    clip: float | None
    loss: Tensor | None = None
    max_inputs: int = 7  # inputs of one kernel (storage buffers per stage, minus the output)
    arena: tuple[int, dict[str, int]] | None = None  # (pack node, {group: byte offset})
    spans: dict[str, tuple[tuple[str, int, int], ...]] = field(default_factory=dict)
    ok: Tensor | None = None
    states: list[str] = field(default_factory=list)
    writebacks: list[Writeback] = field(default_factory=list)

    def scale(self, name: str) -> dict[str, Any]:
        """The gradient-scale arguments of an update op for param `name`."""
        return {"gnorm": self.gnorm.get(name), "gtotal": self.gtotal, "clip": self.clip,
                "ok": self.ok}

    def state(self, name: str, shape: tuple[int, ...]) -> Tensor:
        self.states.append(name)
        return leaf("state", name, shape, "f32", init=0.0)

    def write(self, source: Tensor, dest: str, kind: str) -> None:
        if kind == "param" and self.arena is not None:  # a group: its range of the arena
            pack, offsets = self.arena
            self.writebacks.append(Writeback(source.id, pack, "node", offsets[dest]))
            return
        self.writebacks.append(Writeback(source.id, dest, kind))

    def guard(self, rule: str, trials: list[tuple[str, list[tuple[str, Tensor]],
                                                  list[tuple[str, Tensor | None]]]],
              attrs: dict[str, Any] | Callable[[str], dict[str, Any]]) -> None:
        """With a loss: `ok` from the loss and a trial of every update, (name, states,
        scalars) each; the update ops then write their old values unless it is 1."""
        if self.loss is None:
            return
        flags = [uc.update_partials(
            rule, self.params[n], self.grads[n], states,
            [*scalars, ("gnorm", self.gnorm.get(n)), ("gtotal", self.gtotal)],
            {**(attrs(n) if callable(attrs) else attrs), "clip": self.clip},
            self.spans.get(n, ((n, 0, self.params[n].node.size),)), self.max_inputs)
            for n, states, scalars in trials]
        self.ok = oo.guard(self.loss, flags)


def _append_sgd(a: _Appender, config: SGD, decayed: list[str]) -> tuple[str, ...]:
    lr_in = leaf("input", SGD_LR, (), "f32")
    mu = config.momentum

    def wd_of(n: str) -> float:
        return config.weight_decay if n in decayed else 0.0

    velocity = {n: a.state(f"sgd_v_{n}", a.params[n].shape) if mu > 0 else None
                for n in a.grads}
    a.guard("sgd", [(n, [("v", velocity[n])] if mu > 0 else [], [("lr", lr_in)])
                    for n in a.grads],
            lambda n: {"momentum": mu, "nesterov": config.nesterov, "weight_decay": wd_of(n)})
    for n, g in a.grads.items():
        p, v, wd = a.params[n], velocity[n], wd_of(n)
        v_new = None
        if v is not None:
            v_new = oo.sgd_velocity(v, g, mu, wd, p if wd else None, **a.scale(n))
            a.write(v_new, f"sgd_v_{n}", "state")
        needs_g = mu == 0 or config.nesterov
        p_new = oo.sgd_update_p(p, lr_in, g if needs_g else None, v_new, momentum=mu,
                                nesterov=config.nesterov, weight_decay=wd, **a.scale(n))
        a.write(p_new, n, "param")
    return (SGD_LR,)


def _append_adam(a: _Appender, config: Adam | AdamW, decayed: list[str],
                 limits: DeviceLimits) -> tuple[str, ...]:
    lrt = leaf("input", ADAM_LRT, (), "f32")
    shrink = leaf("input", ADAM_SHRINK, (), "f32") if decayed else None
    states = {}
    for n in a.grads:
        p = a.params[n]
        parts = ("mv",) if _moments_packed(p.node, limits) else ("m", "v")
        states[n] = [(part, a.state(f"adam_{part}_{n}",
                                    (2, *p.shape) if part == "mv" else p.shape))
                     for part in parts]
    a.guard("adam", [(n, states[n], [("lr", lrt), ("shrink", shrink if n in decayed else None)])
                     for n in a.grads],
            {"beta1": config.beta1, "beta2": config.beta2, "eps": config.eps})
    for n, g in a.grads.items():
        p = a.params[n]
        kw = {"beta1": config.beta1, "beta2": config.beta2, **a.scale(n)}
        moments = []
        for part, state in states[n]:
            moments.append(oo.adam_moments(state, g, part, **kw))
            a.write(moments[-1], f"adam_{part}_{n}", "state")
        p_new = oo.adam_update_p(p, moments, lrt, config.eps, shrink if n in decayed else None,
                                 ok=a.ok)
        a.write(p_new, n, "param")
    return (ADAM_LRT, ADAM_SHRINK) if decayed else (ADAM_LRT,)


def _arena_groups(order: list[str], decayed: set[str], layout: Mapping[str, int],
                  sizes: Mapping[str, int], max_bytes: int) -> list[tuple[int, int, bool]]:
    """Contiguous (start, end, decayed) element ranges of the arena, each holding params
    of one decay kind and binding as one tensor (at most `max_bytes`)."""
    groups: list[tuple[int, int, bool]] = []
    for n in order:
        start, end, flag = layout[n], layout[n] + sizes[n], n in decayed
        if groups and groups[-1][2] == flag and 4 * (end - groups[-1][0]) <= max_bytes:
            groups[-1] = (groups[-1][0], end, flag)
        else:
            groups.append((start, end, flag))
    return groups


def _append_arena(graph: Graph, g: dict[str, Tensor], params: Mapping[str, Node],
                  order: list[str], decayed: set[str], loss: int | None, clip: float | None,
                  limits: DeviceLimits) -> tuple[_Appender, list[str], dict[str, int], int]:
    """Pack the params and their gradients into arenas and make one virtual param per group
    (a range of the arenas): the update runs a few kernels for all params."""
    sizes = {n: params[n].size for n in order}
    offsets, size = arena_layout([sizes[n] for n in order])
    layout = dict(zip(order, offsets))
    arena_p = pack([Tensor(graph, params[n].id) for n in order], offsets, size)
    arena_g = pack([g[n] for n in order], offsets, size)
    cap = min(limits.max_storage_buffer_binding_size, limits.max_buffer_size)
    groups = _arena_groups(order, decayed, layout, sizes, cap)
    names = [f"arena{k}" for k in range(len(groups))]
    vp = {name: narrow(arena_p, 0, a, b - a) for name, (a, b, _) in zip(names, groups)}
    vg = {name: narrow(arena_g, 0, a, b - a) for name, (a, b, _) in zip(names, groups)}
    gtotal = oo.sumsq_total(list(vg.values())) if clip is not None else None
    spans = {name: tuple((n, layout[n] - a, sizes[n]) for n in order if a <= layout[n] < b)
             for name, (a, b, _) in zip(names, groups)}
    appender = _Appender(vg, vp, {}, gtotal, clip,
                         None if loss is None else Tensor(graph, loss), _max_inputs(limits),
                         arena=(arena_p.id, {name: 4 * a for name, (a, _, _) in
                                             zip(names, groups)}), spans=spans)
    return appender, [n for n, (_, _, d) in zip(names, groups) if d], layout, size


def _max_inputs(limits: DeviceLimits) -> int:
    return max(1, limits.max_storage_buffers_per_shader_stage - 1)


def append_optimizer(graph: Graph, grads: Mapping[str, int], config: OptimizerConfig,
                     decay: Mapping[str, bool | None] | None = None, *,
                     limits: DeviceLimits | None = None, loss: int | None = None,
                     arena: bool = False) -> OptimizerPlan:
    """Append `config`'s update of every param in `grads` ({param name: grad node id}) to
    `graph`, in `grads` order. `decay` holds per-param decay flags (None: no flag, the filter
    decides). `limits` (default: WebGPU's defaults) decides whether Adam's m and v share one
    ``[2, *shape]`` state (two kernels per param instead of three): they do when it fits one
    binding. With `loss` (its node id) the update is guarded: when the loss, a gradient or
    any new param or state value the update would write is not finite (each update is tried
    first by an ``update_partials`` node), every update op writes its old value back, and
    the plan's `status` node (1.0 applied, 0.0 skipped) says so. With `arena` (and no
    `normalize_grads`, which needs each param's own norm) the params and gradients are packed
    into arenas, decayed params first, and a handful of kernels update them all; the plan's
    `layout` says where each param lies (the param store lays its buffer out the same
    way)."""
    if not isinstance(config, tuple(CONFIGS.values())):
        raise TypeError(f"append_optimizer: expected an optim.Adam, AdamW or SGD config, got "
                        f"{type(config).__name__}")
    decay = dict(decay or {})
    params = _check_grads(graph, grads, decay)
    names = list(grads)
    if not names:
        return OptimizerPlan(config, (), ())

    normalized = [n for n in names if config.normalize_grads is not False
                  and _select("normalize_grads", config.normalize_grads, n)]
    if config.normalize_grads is not False and not normalized:
        raise ValueError(f"normalize_grads={config.normalize_grads!r} matches none of the "
                         f"params {names}")
    wd = getattr(config, "weight_decay", 0.0)
    decayed = [n for n in names if wd > 0 and (decay[n] if decay.get(n) is not None else
                                               _select("decay_filter", config.decay_filter, n))]

    clip = config.clip_grad_norm
    limits = limits or DeviceLimits()
    layout, arena_size = None, 0
    with tracing(graph, capture=False):
        g = {n: Tensor(graph, grads[n]) for n in names}
        if arena and not normalized:
            order = [n for n in names if n in decayed] + [n for n in names if n not in decayed]
            appender, groups_decayed, layout, arena_size = _append_arena(
                graph, g, params, order, set(decayed), loss, clip, limits)
            if isinstance(config, SGD):
                scalars = _append_sgd(appender, config, groups_decayed)
            else:
                scalars = _append_adam(appender, config, groups_decayed, limits)
            ok = appender.ok
            return OptimizerPlan(config, tuple(appender.writebacks), scalars,
                                 tuple(appender.states), tuple(decayed), (), tuple(names),
                                 None if ok is None else ok.id, layout, arena_size)
        # Sums of squares: every param's when clipping, else the normalized ones'.
        sumsq = {n: oo.grad_sumsq(g[n]) for n in names if clip is not None or n in normalized}
        gtotal = None
        if clip is not None:
            gtotal = oo.grad_norm_total([(sumsq[n], "normalized" if n in normalized else "raw")
                                         for n in names])
        appender = _Appender(g, {n: Tensor(graph, params[n].id) for n in names},
                             {n: sumsq[n] for n in normalized}, gtotal, clip,
                             None if loss is None else Tensor(graph, loss), _max_inputs(limits))
        if isinstance(config, SGD):
            scalars = _append_sgd(appender, config, decayed)
        else:
            scalars = _append_adam(appender, config, decayed, limits)
        ok = appender.ok
    return OptimizerPlan(config, tuple(appender.writebacks), scalars, tuple(appender.states),
                         tuple(decayed), tuple(normalized), tuple(names),
                         None if ok is None else ok.id)


__all__ = ["ADAM_LRT", "ADAM_SHRINK", "SGD", "SGD_LR", "Adam", "AdamW", "OptimizerConfig",
           "OptimizerPlan", "Writeback", "append_optimizer", "from_dict", "host_scalars",
           "to_dict"]
