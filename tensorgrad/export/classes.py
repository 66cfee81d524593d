"""Grouping Module instances into torch classes.

Instances of one tensorgrad class share a torch class when their structure (params, their
dtypes, ranks and inits; children and their classes) and forward code are the same; a class
whose instances differ gets variants ``Name_2``, .... Param dims, kaiming fan-ins and child
constructor arguments are *slots*: each becomes a constructor argument taken from an int
attribute of the instance that gives it in every member (``Linear(in_features=1, ...)``), or a
literal where the members agree and no attribute gives it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .analysis import Analysis
from .tree import Info, Param, modules_in


@dataclass
class Group:
    """One torch class: its members and, per slot, the attrs that may give it."""

    cls: type
    name: str = ""
    members: list[Info] = field(default_factory=list)
    skeleton: Any = None
    forward: list[str] | None = None        # body lines (None: no forward of its own)
    slots: list[Any] = field(default_factory=list)       # per slot: list of candidate attrs
    literal: list[Any] = field(default_factory=list)     # per slot: the value or MIXED
    chosen: list[str | None] = field(default_factory=list)


MIXED = object()   # a slot whose members hold different values


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _candidates(config: Mapping[str, Any], value: Any) -> list[str]:
    """The config attributes (or tuple items, ``attr[j]``) that equal the int `value`."""
    if not _is_int(value):
        return []
    out = []
    for k, v in config.items():
        if _is_int(v) and v == value:
            out.append(k)
        elif isinstance(v, tuple):
            out += [f"{k}[{j}]" for j, x in enumerate(v) if _is_int(x) and x == value]
    return out


def _init_skeleton(spec: Any) -> tuple[Any, ...]:
    values = ((f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec))
    return (type(spec).__name__,
            *((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in values))


def _is_ctor(v: Any) -> bool:
    """A slot value that is a child's constructor (its arguments are slots of their own)."""
    return isinstance(v, tuple) and bool(v) and v[0] == "ctor"


class Grouper:
    """Groups the tree's instances (children first, the root last and alone)."""

    def __init__(self, an: Analysis, specs: Mapping[str, Any], class_name: str | None):
        self.an = an
        self.specs = specs
        self.class_name = class_name
        self.groups: list[Group] = []
        self._used_names: dict[str, int] = {}

    def group(self, codes: Mapping[int, list[str]]) -> list[Group]:
        """The classes, in definition order; `codes`: the forward of each extracted module."""
        order: list[Info] = []

        def post(info: Info) -> None:
            for _, c in info.children:
                for sub in modules_in(c):
                    post(sub)
            order.append(info)

        post(self.an.root)
        for info in order:
            code = None if info is self.an.root else codes.get(id(info.obj))
            skeleton, values = self.skeleton(info)
            placed = self._place(info, code, skeleton, values)
            if placed is None:
                placed = self._new(info, skeleton, len(values))
            self._join(placed, info, values)
            if code is not None:
                placed.forward = code
            info.group = placed
        for grp in self.groups:
            self._choose(grp)
        return self.groups

    def _place(self, info: Info, code: list[str] | None, skeleton: tuple[Any, ...], values: list[Any]
               ) -> Group | None:
        """An existing class `info` fits (same structure, forward and slots), or None."""
        if info is self.an.root:
            return None
        for grp in self.groups:
            if grp.cls is type(info.obj) and grp.skeleton == skeleton \
                    and grp.members[0] is not self.an.root \
                    and (grp.forward is None or code is None or grp.forward == code) \
                    and self._fits(grp, info, values):
                return grp
        return None

    def _new(self, info: Info, skeleton: tuple[Any, ...], n_slots: int) -> Group:
        grp = Group(type(info.obj), skeleton=skeleton)
        grp.slots = [None] * n_slots
        grp.literal = [MIXED] * n_slots
        is_root = info is self.an.root
        base = self.class_name if is_root and self.class_name else type(info.obj).__name__
        k = self._used_names.get(base, 0) + 1
        self._used_names[base] = k
        grp.name = base if k == 1 else f"{base}_{k}"
        self.groups.append(grp)
        return grp

    def skeleton(self, info: Info) -> tuple[tuple[Any, ...], list[Any]]:
        """(structure, slot values): param dims, kaiming fan-ins and child constructor
        arguments are slots; everything else must be equal within a class."""
        values: list[Any] = []
        parts: list[Any] = []
        for key, p in info.params:
            spec = self.specs[p.name]
            parts.append(("param", key, spec.dtype, len(spec.shape), _init_skeleton(spec.init)))
            values.extend(spec.shape)
            if spec.init.kind == "kaiming":
                values.append(spec.fan_in)
        for key, c in info.children:
            parts.append(("child", key, self.child_skeleton(c, values)))
        return tuple(parts), values

    def child_skeleton(self, c: Any, values: list[Any]) -> Any:
        """The structure of a child slot; appends its slot values to `values`."""
        if isinstance(c, Info):
            # the child's class and its constructor arguments (filled in later: slots)
            values.append(("ctor", c))
            return ("module", type(c.obj).__qualname__)
        if isinstance(c, Param):
            spec = self.specs[c.name]
            values.extend(spec.shape)
            return ("param", spec.dtype, len(spec.shape), _init_skeleton(spec.init))
        return (c.kind, tuple((k, self.child_skeleton(x, values)) for k, x in c.items))

    def _slot_sig(self, info: Info) -> tuple[Any, ...]:
        """What decides a child's constructor arguments: its slot values, recursively."""
        _, values = self.skeleton(info)
        return tuple((id(v[1].group), self._slot_sig(v[1])) if _is_ctor(v) else v
                     for v in values)

    def _fits(self, grp: Group, info: Info, values: list[Any]) -> bool:
        for k, v in enumerate(values):
            if _is_ctor(v):
                ref = grp.literal[k]
                if ref is MIXED:
                    continue
                if ref.group is not v[1].group or self._slot_sig(v[1]) != self._slot_sig(ref):
                    return False
                continue
            cands = set(_candidates(info.config, v))
            if grp.slots[k] is not None and set(grp.slots[k]) & cands:
                continue
            if grp.literal[k] is not MIXED and grp.literal[k] == v:
                continue
            return False
        return True

    def _join(self, grp: Group, info: Info, values: list[Any]) -> None:
        first = not grp.members
        grp.members.append(info)
        for k, v in enumerate(values):
            if _is_ctor(v):
                if first:
                    grp.literal[k] = v[1]
                continue
            cands = _candidates(info.config, v)
            if first:
                grp.slots[k] = cands
                grp.literal[k] = v
            else:
                prev = grp.slots[k] or []
                grp.slots[k] = [c for c in prev if c in cands]
                if grp.literal[k] is not MIXED and grp.literal[k] != v:
                    grp.literal[k] = MIXED

    def _choose(self, grp: Group) -> None:
        """Per slot: the config attribute that gives it (distinct within a param), or None
        for a literal."""
        grp.chosen = [None] * len(grp.slots)
        if grp is self.an.root.group:
            return  # the root class has no constructor arguments
        owners = self._slot_owners(grp.members[0])
        taken: dict[int, set[str]] = {}
        for k, cands in enumerate(grp.slots):
            if isinstance(grp.literal[k], Info) or not cands:
                continue
            used = taken.setdefault(owners[k], set())
            free = [c for c in cands if c not in used]
            choice = (free or cands)[0]
            grp.chosen[k] = choice
            used.add(choice)

    def _slot_owners(self, info: Info) -> list[int]:
        """For each slot, a number naming the param (or child) it belongs to."""
        owners: list[int] = []
        for k, (_, p) in enumerate(info.params):
            spec = self.specs[p.name]
            owners += [k] * (len(spec.shape) + (spec.init.kind == "kaiming"))
        values: list[Any] = []
        for k, (_, c) in enumerate(info.children):
            before = len(values)
            self.child_skeleton(c, values)
            owners += [1000 + k] * (len(values) - before)
        return owners
