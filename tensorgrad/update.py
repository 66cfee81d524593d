"""What every optimizer shares: the config interface, the appender its update is written with,
and appending it to a training graph.

An optimizer is an :class:`OptimizerConfig`: a frozen dataclass with a ``kind`` (subclassing
registers it in :data:`CONFIGS`, which makes it plain data for the worker protocol) that
appends its own update ops (:meth:`OptimizerConfig.append_update`, with an
:class:`Appender`) and computes its own per-step hidden inputs
(:meth:`OptimizerConfig.host_scalars`). :func:`append_optimizer` does what is common to all:
it checks the gradients, picks the params that decay and those whose gradients are
normalized, folds clipping in, packs the params into arenas, then lets the config append its
update, and returns the :class:`OptimizerPlan` the runtime follows. The configs themselves,
and the exact update each makes, are in :mod:`tensorgrad.optim`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields, replace
from fnmatch import fnmatchcase
from typing import ClassVar, NamedTuple, TypedDict

from . import lr as lr_mod
from .gpu.interface import DeviceLimits
from .ir import Attrs, Graph, Node
from .ops import optim_ops as oo
from .ops import update_check as uc
from .ops.arena import arena_layout, pack
from .ops.shape import narrow
from .tensor import Tensor, leaf, tracing

NameFilter = bool | str | Callable[[str], bool]
"""Which params a config option applies to: True (all), False (none), a glob pattern matched
against the whole param name, or a callable ``name -> bool``."""
CALLABLE_MARK = "<callable>"
"""What :meth:`OptimizerConfig.to_dict` writes for a callable name filter."""
Trial = tuple[str, list[tuple[str, Tensor]], list[tuple[str, Tensor | None]]]
"""One update's trial for the step guard: (param name, [(role, old state)], [(role, 0-d
input or None)])."""


# ---- checks ------------------------------------------------------------------------------

def check_number(what: str, value: object, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = True) -> None:
    """ValueError naming `what` unless `value` is a finite number in the range given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{what} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{what} must be {'<' if high_open else '<='} {high}, got {value!r}")


def check_filter(what: str, value: object) -> None:
    """TypeError naming `what` unless `value` is a :data:`NameFilter`."""
    if not (isinstance(value, (bool, str)) or callable(value)):
        raise TypeError(f"{what} must be True, False, a glob pattern or a callable name -> "
                        f"bool, got {value!r}")


# ---- the config interface ----------------------------------------------------------------

CONFIGS: dict[str, type[OptimizerConfig]] = {}
"""{kind: config class} of every optimizer (filled by subclassing :class:`OptimizerConfig`)."""


class OptimizerConfig(ABC):
    """The interface of an optimizer config (``tg.optim.Adam``, ``AdamW``, ``SGD``).

    A subclass is a frozen dataclass with the fields ``lr``, ``clip_grad_norm`` and
    ``normalize_grads`` (and ``weight_decay`` / ``decay_filter`` if params decay; without
    them none does) and a class-level ``kind``, which registers it in :data:`CONFIGS`. It
    checks its fields in ``__post_init__`` (:meth:`check_common` for the shared ones) and
    implements :meth:`append_update` and :meth:`host_scalars`."""

    kind: ClassVar[str]
    # What @dataclass gives each subclass (so `fields` and `replace` take a config).
    __dataclass_fields__: ClassVar[dict[str, Field[object]]]
    lr: lr_mod.LR
    clip_grad_norm: float | None
    normalize_grads: NameFilter
    weight_decay: float = 0.0
    decay_filter: NameFilter = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind is None:
            return  # a shared base (Adam's and AdamW's update), not an optimizer
        known = CONFIGS.get(kind)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise ValueError(f"optimizer kind {kind!r} is taken by {known.__qualname__}")
        CONFIGS[kind] = cls

    def check_common(self) -> None:
        """Check the fields every config has (ValueError / TypeError naming the config)."""
        name = type(self).__name__
        lr_mod._check_lr(f"{name}: lr", self.lr)
        if self.clip_grad_norm is not None:
            check_number(f"{name}: clip_grad_norm", self.clip_grad_norm, 0.0, low_open=True)
        check_filter(f"{name}: normalize_grads", self.normalize_grads)

    def to_dict(self) -> dict[str, object]:
        """Plain data: `kind`, the fields, the LR as :func:`tensorgrad.lr.to_dict` gives it."""
        out: dict[str, object] = {"kind": self.kind}
        for f in fields(self):
            value: object = getattr(self, f.name)
            if f.name == "lr":
                value = lr_mod.to_dict(self.lr)
            elif callable(value):
                value = CALLABLE_MARK
            out[f.name] = value
        return out

    @abstractmethod
    def append_update(self, a: Appender, decayed: Sequence[str], limits: DeviceLimits
                      ) -> tuple[str, ...]:
        """Append the update of every param of `a` (``a.params``, gradients ``a.grads``;
        `decayed` those that decay) inside the trace of the graph; return the names of the
        hidden 0-d inputs it reads (made with :meth:`Appender.scalar`), whose values
        :meth:`host_scalars` gives. It makes its state with :meth:`Appender.state`, then calls
        :meth:`Appender.guard` before any update op, passes ``**a.scale(name)`` to each update
        op, and writes each new param and state back with :meth:`Appender.write`. `limits`
        are the device's (an update may lay its state out by them)."""

    @abstractmethod
    def host_scalars(self, lr: float, t: int) -> dict[str, float]:
        """{hidden input name: value} for 1-based step `t` whose learning rate is `lr` (the
        config's LR or schedule resolved at that step): every input :meth:`append_update`
        may have made."""


def host_scalars(config: OptimizerConfig, t: int, lr: lr_mod.LR | None = None,
                 names: tuple[str, ...] | None = None) -> dict[str, float]:
    """The hidden 0-d inputs for 1-based step `t` (`lr` overrides the config's LR, e.g. a
    rebased one after ``set_lr``); `names` restricts the result to the inputs a plan has."""
    if isinstance(t, bool) or not isinstance(t, int) or t < 1:
        raise ValueError(f"the optimizer step t is 1-based, got {t!r}")
    out = config.host_scalars(lr_mod.resolve(config.lr if lr is None else lr, t), t)
    return out if names is None else {k: out[k] for k in names}


STEP_CHAIN = "_step_chain"
"""The step guard's chain flag, a 0-d f32 state: each guarded step requires it to be 1 and
leaves its own outcome there (1.0 applied, 0.0 skipped). A step submitted before the host
knows whether the step before it was applied (a speculative step, see
:class:`tensorgrad.training.Training`) leaves it as the step before left it, so that it is
skipped after a skipped step; any other step has the host write 1.0 into it first (and 0.0
forces a skip)."""


# ---- the plan ----------------------------------------------------------------------------

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
        if isinstance(config_or_lr, OptimizerConfig):
            base = replace(config_or_lr, lr=self.config.lr)
            if base.to_dict() != self.config.to_dict():
                raise ValueError(f"host_scalars: the config {config_or_lr.to_dict()} differs "
                                 f"from the compiled one {self.config.to_dict()} in more than "
                                 "lr; only the LR can change without recompiling")
            lr = config_or_lr.lr
        else:
            lr = config_or_lr
        return host_scalars(self.config, t, lr=lr, names=self.scalar_inputs)

    def renumbered(self, remap: Mapping[int, int]) -> OptimizerPlan:
        """The same plan with writeback sources re-pointed through `remap` (old id → new)."""
        return replace(self, writebacks=tuple(
            wb._replace(source=remap[wb.source],
                        dest=remap[wb.dest] if isinstance(wb.dest, int) else wb.dest)
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


# ---- the appender ------------------------------------------------------------------------

class Scale(TypedDict):
    """The gradient-scale arguments every update op takes (:meth:`Appender.scale`)."""

    gnorm: Tensor | None
    gtotal: Tensor | None
    clip: float | None
    ok: Tensor | None


@dataclass
class Appender:
    """What an update is written with (:meth:`OptimizerConfig.append_update`): the params and
    gradients to update (each a param, or a group of params packed in the arena), the
    gradient scale inputs, the step guard (with `loss`: each update is tried first, see
    ops/update_check.py), and what the update made (state names, writebacks)."""

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

    def scale(self, name: str) -> Scale:
        """The gradient-scale arguments of an update op for param `name` (normalization,
        clipping and the step guard's flag)."""
        return {"gnorm": self.gnorm.get(name), "gtotal": self.gtotal, "clip": self.clip,
                "ok": self.ok}

    def scalar(self, name: str) -> Tensor:
        """A hidden 0-d f32 input `name`, fed each step from :meth:`OptimizerConfig.host_scalars`."""
        return leaf("input", name, (), "f32")

    def state(self, name: str, shape: tuple[int, ...]) -> Tensor:
        """A zero-initialized optimizer state `name` of `shape` (kept across steps)."""
        self.states.append(name)
        return leaf("state", name, shape, "f32", init=0.0)

    def write(self, source: Tensor, dest: str, kind: str) -> None:
        """After each step copy `source` into the param (`kind` "param") or state ("state")
        named `dest`."""
        if kind == "param" and self.arena is not None:  # a group: its range of the arena
            pack_id, offsets = self.arena
            self.writebacks.append(Writeback(source.id, pack_id, "node", offsets[dest]))
            return
        self.writebacks.append(Writeback(source.id, dest, kind))

    def guard(self, rule: str, trials: Sequence[Trial],
              attrs: Attrs | Callable[[str], Attrs]) -> None:
        """With a loss: the step guard's flag `ok` from the loss and a trial of every update
        (an ``update_partials`` node of `rule`, see ops/update_check.py), one per param:
        (name, states, scalars) each; `attrs` (or `attrs(name)`) the update's own. The update
        ops then write their old values unless it is 1."""
        if self.loss is None:
            return
        flags: list[Tensor] = [uc.update_partials(
            rule, self.params[n], self.grads[n], states,
            [*scalars, ("gnorm", self.gnorm.get(n)), ("gtotal", self.gtotal)],
            {**(attrs(n) if callable(attrs) else attrs), "clip": self.clip},
            self.spans.get(n, ((n, 0, self.params[n].node.size),)), self.max_inputs)
            for n, states, scalars in trials]
        # The chain flag: 1 unless the step before was skipped and this one was submitted
        # before the host knew (see STEP_CHAIN); the flag this step leaves is its own `ok`.
        chain = leaf("state", STEP_CHAIN, (), "f32", init=1.0)
        self.ok = oo.guard(self.loss, [chain, *flags])
        self.writebacks.append(Writeback(self.ok.id, STEP_CHAIN, "state"))


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
                 decay: Mapping[str, bool | None]) -> dict[str, Node]:
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
                  limits: DeviceLimits) -> tuple[Appender, list[str], dict[str, int], int]:
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
    appender = Appender(vg, vp, {}, gtotal, clip,
                        None if loss is None else Tensor(graph, loss), _max_inputs(limits),
                        arena=(arena_p.id, {name: 4 * a for name, (a, _, _) in
                                            zip(names, groups)}), spans=spans)
    return appender, [n for n, (_, _, d) in zip(names, groups) if d], layout, size


def _append_each(graph: Graph, g: dict[str, Tensor], params: Mapping[str, Node],
                 normalized: list[str], loss: int | None, clip: float | None,
                 limits: DeviceLimits) -> Appender:
    """The appender of params updated one by one (each with its own norm when normalized)."""
    names = list(g)
    # Sums of squares: every param's when clipping, else the normalized ones'.
    sumsq = {n: oo.grad_sumsq(g[n]) for n in names if clip is not None or n in normalized}
    gtotal = None
    if clip is not None:
        gtotal = oo.grad_norm_total([(sumsq[n], "normalized" if n in normalized else "raw")
                                     for n in names])
    return Appender(g, {n: Tensor(graph, params[n].id) for n in names},
                    {n: sumsq[n] for n in normalized}, gtotal, clip,
                    None if loss is None else Tensor(graph, loss), _max_inputs(limits))


def _max_inputs(limits: DeviceLimits) -> int:
    return max(1, limits.max_storage_buffers_per_shader_stage - 1)


def _kinds() -> str:
    names = [cls.__name__ for cls in CONFIGS.values()]
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def _choices(config: OptimizerConfig, names: list[str], decay: Mapping[str, bool | None],
             default_decay: Mapping[str, bool]) -> tuple[list[str], list[str]]:
    """(normalized, decayed): the params whose gradients are normalized, those that decay (a
    flag in `decay` wins; else a `decay_filter` other than True; else `default_decay`)."""
    normalized = [n for n in names if config.normalize_grads is not False
                  and _select("normalize_grads", config.normalize_grads, n)]
    if config.normalize_grads is not False and not normalized:
        raise ValueError(f"normalize_grads={config.normalize_grads!r} matches none of the "
                         f"params {names}")

    def decays(name: str) -> bool:
        flag = decay.get(name)
        if flag is not None:
            return flag
        if config.decay_filter is True:
            return default_decay.get(name, True)
        return _select("decay_filter", config.decay_filter, name)

    decayed = [n for n in names if config.weight_decay > 0 and decays(n)]
    return normalized, decayed


def append_optimizer(graph: Graph, grads: Mapping[str, int], config: OptimizerConfig,
                     decay: Mapping[str, bool | None] | None = None, *,
                     default_decay: Mapping[str, bool] | None = None,
                     limits: DeviceLimits | None = None, loss: int | None = None,
                     arena: bool = False) -> OptimizerPlan:
    """Append `config`'s update of every param in `grads` ({param name: grad node id}) to
    `graph`, in `grads` order. `decay` holds the decay flags params were declared with
    (None: none given: a ``decay_filter`` other than True decides, else `default_decay`,
    each param's flag by its init, default True). `limits` (default: WebGPU's defaults)
    decides whether Adam's m and v share one ``[2, *shape]`` state (two kernels per param
    instead of three): they do when it fits one binding. With `loss` (its node id) the
    update is guarded: when the loss, a gradient or any new param or state value the update
    would write is not finite (each update is tried first by an ``update_partials`` node),
    every update op writes its old value back, and the plan's `status` node (1.0 applied,
    0.0 skipped) says so. With `arena` (and no
    `normalize_grads`, which needs each param's own norm) the params and gradients are packed
    into arenas, decayed params first, and a handful of kernels update them all; the plan's
    `layout` says where each param lies (the param store lays its buffer out the same
    way)."""
    if not isinstance(config, OptimizerConfig):
        raise TypeError(f"append_optimizer: expected an optim.{_kinds()} config, got "
                        f"{type(config).__name__}")
    decay = dict(decay or {})
    params = _check_grads(graph, grads, decay)
    names = list(grads)
    if not names:
        return OptimizerPlan(config, (), ())
    normalized, decayed = _choices(config, names, decay, default_decay or {})
    limits = limits or DeviceLimits()
    layout, arena_size = None, 0
    with tracing(graph, capture=False):
        g = {n: Tensor(graph, grads[n]) for n in names}
        if arena and not normalized:
            order = [n for n in names if n in decayed] + [n for n in names if n not in decayed]
            appender, update_decayed, layout, arena_size = _append_arena(
                graph, g, params, order, set(decayed), loss, config.clip_grad_norm, limits)
        else:
            appender = _append_each(graph, g, params, normalized, loss, config.clip_grad_norm,
                                    limits)
            update_decayed = decayed
        scalars = config.append_update(appender, update_decayed, limits)
    ok = appender.ok
    return OptimizerPlan(config, tuple(appender.writebacks), scalars, tuple(appender.states),
                         tuple(decayed), tuple(normalized), tuple(names),
                         None if ok is None else ok.id, layout, arena_size)


__all__ = ["CALLABLE_MARK", "CONFIGS", "STEP_CHAIN", "Appender", "NameFilter",
           "OptimizerConfig", "OptimizerPlan", "Scale", "Trial", "Writeback", "append_optimizer",
           "check_filter", "check_number", "host_scalars"]
