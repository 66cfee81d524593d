"""The source of one torch class: docstring, ``__init__`` (constructor arguments, params as
``nn.Parameter``, children), ``reset_parameters`` (the tensorgrad init specs) and ``forward``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..init import default_fan_in
from .classes import Group
from .tree import Container, Info, Param

_RESET_DOC = ('        """The tensorgrad init specs (same distributions, not the same random '
              'numbers)."""')


def ctor_attrs(grp: Group) -> list[str]:
    """The constructor arguments of a class: the attributes its chosen slots read, in the
    order the instance defines them."""
    attrs: list[str] = []
    for c in grp.chosen:
        if c is not None:
            base = c.split("[")[0]
            if base not in attrs:
                attrs.append(base)
    order = list(grp.members[0].config)
    return sorted(attrs, key=order.index)


def _ctor(info: Info) -> str:
    """The constructor call of an instance, e.g. ``Linear(in_features=1, out_features=64)``."""
    args = ", ".join(f"{a}={info.config[a]!r}" for a in ctor_attrs(info.group))
    return f"{info.group.name}({args})"



def _fan_in(ref: str, spec: Any) -> str:
    """A Python expression of the kaiming fan-in of param `ref`: from its shape where the
    fan-in is the default for it (``init.default_fan_in``), else the number given."""
    shape = tuple(spec.shape)
    if spec.fan_in == default_fan_in(shape) and shape:
        return f"{ref}.shape[0]" if len(shape) <= 2 else f"math.prod({ref}.shape[1:])"
    return str(spec.fan_in)

class _Slots:
    """Hands out a class's slots in order: the chosen attribute's name, else the literal."""

    def __init__(self, grp: Group):
        self.grp = grp
        self.k = 0

    def __call__(self, value: Any) -> str:
        c = self.grp.chosen[self.k]
        self.k += 1
        return c if c is not None else repr(value)


class ClassWriter:
    """Writes classes; `uses_math` tells whether one needs ``import math``."""

    def __init__(self, specs: Mapping[str, Any]):
        self.specs = specs
        self.uses_math = False

    def text(self, grp: Group, forward: list[str] | None) -> str:
        """The class's source; `forward`: its forward's lines (None: it has none)."""
        rep = grp.members[0]
        attrs = ctor_attrs(grp)
        src = f"{type(rep.obj).__module__}.{type(rep.obj).__qualname__}"
        doc = f"Port of {src}" + (f" ({len(grp.members)} instances)"
                                  if len(grp.members) > 1 else "")
        lines = [f"class {grp.name}(nn.Module):", f'    """{doc}."""', "",
                 f"    def __init__({', '.join(['self', *attrs])}):",
                 "        super().__init__()", *[f"        self.{a} = {a}" for a in attrs]]
        inits: list[str] = []
        lines += self._members(rep, _Slots(grp), inits)
        if not rep.params and not rep.children and not attrs:
            lines.append("        pass")
        if inits:
            lines += ["        self.reset_parameters()", "", "    def reset_parameters(self):",
                      _RESET_DOC, *[f"        {ln}" for ln in inits]]
        if forward:
            lines += ["", *["    " + ln for ln in forward]]
        return "\n".join(lines)

    def _members(self, rep: Info, slot: _Slots, inits: list[str]) -> list[str]:
        """`self.x = ...` for the params, then the children, of a class's instance."""
        lines = []
        for key, p in rep.params:
            spec = self.specs[p.name]
            dims = [slot(d) for d in spec.shape]
            if spec.init.kind == "kaiming":
                slot(spec.fan_in)  # (its slot, in the order classes.py hands them out)
            lines.append(f"        self.{key} = {self._param_ctor(spec, dims)}")
            inits.append(self._init_line(f"self.{key}", spec))
        for key, c in rep.children:
            lines.append(f"        self.{key} = {self._child_ctor(c, slot, inits, key)}")
        return lines

    def _child_ctor(self, c: Any, slot: Callable[[Any], str], inits: list[str],
                    path: str) -> str:
        if isinstance(c, Info):
            slot(None)  # consume the ctor slot
            return _ctor(c)
        if isinstance(c, Param):
            spec = self.specs[c.name]
            return self._param_ctor(spec, [slot(d) for d in spec.shape])
        assert isinstance(c, Container)
        all_params = {type(x) for _, x in c.items} == {Param}
        if c.kind == "list":
            if all_params:
                parts = [self._listed_param(x, slot, inits, f"self.{path}[{k}]")
                         for k, x in c.items]
                return f"nn.ParameterList([{', '.join(parts)}])"
            parts = [self._child_ctor(x, slot, inits, f"{path}[{k}]") for k, x in c.items]
            if parts and len(set(parts)) == 1 and len(parts) > 1:
                return f"nn.ModuleList([{parts[0]} for _ in range({len(parts)})])"
            return f"nn.ModuleList([{', '.join(parts)}])"
        entries = []
        for k, x in c.items:
            text = (self._listed_param(x, slot, inits, f"self.{path}[{k!r}]")
                    if isinstance(x, Param) else
                    self._child_ctor(x, slot, inits, f"{path}[{k!r}]"))
            entries.append(f"{k!r}: {text}")
        kind = "nn.ParameterDict" if all_params else "nn.ModuleDict"
        return f"{kind}({{{', '.join(entries)}}})"

    def _listed_param(self, x: Param, slot: Callable[[Any], str], inits: list[str],
                      ref: str) -> str:
        """A param held in a ParameterList/Dict: its constructor; its init goes to `inits`."""
        spec = self.specs[x.name]
        text = self._param_ctor(spec, [slot(d) for d in spec.shape])
        inits.append(self._init_line(ref, spec))
        return text

    def _param_ctor(self, spec: Any, dims: list[str]) -> str:
        shape = ", ".join(dims) if dims else "()"
        if spec.dtype == "f32":
            return f"nn.Parameter(torch.empty({shape}))"
        return f"nn.Parameter(torch.empty({shape}, dtype=torch.int32), requires_grad=False)"

    def _init_line(self, ref: str, spec: Any) -> str:
        """The line of ``reset_parameters`` that initialises `ref` (it runs outside
        ``__init__``, so a kaiming fan-in is read off the param's own shape)."""
        init = spec.init
        if init.kind == "zeros":
            return f"nn.init.zeros_({ref})"
        if init.kind == "ones":
            return f"nn.init.ones_({ref})"
        if init.kind == "randn":
            return f"nn.init.normal_({ref}, std={init.scale!r})"
        if init.kind == "kaiming":
            self.uses_math = True
            return f"nn.init.normal_({ref}, std={init.gain!r} / math.sqrt({_fan_in(ref, spec)}))"
        if init.kind == "literal":
            values = list(init.values)
            dims = ", ".join(str(d) for d in spec.shape) or "()"
            return (f"with torch.no_grad(): {ref}.copy_(torch.tensor({values!r}).reshape"
                    f"({dims}))")
        return f"pass  # {ref}: init {init.kind!r} (the exported weights hold the values)"
