"""The forwards: which Module calls are written as ``self.child(...)`` and the ``forward``
text of each module class, the root's included."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..codegen.torchexpr import Sym, TorchContext
from .analysis import Analysis, CallInfo
from .body import Body, source_range
from .errors import ExportError
from .tree import relative


def _size_from(name: str, axis: int, d: Sym) -> str:
    """The None dim's size read from `name`'s axis, whose size is `d` (a * N + c)."""
    text = f"{name}.shape[{axis}]"
    if d.c:
        text = f"({text} - {d.c})" if d.c > 0 else f"({text} + {-d.c})"
    if d.a != 1:
        text = f"{text} // {d.a}"
    return text


class Forwards:
    """Decides which calls are extracted and writes the forwards; `helpers` collects the
    runtime helpers their translations use."""

    def __init__(self, an: Analysis, input_decls: Mapping[str, Any]):
        self.an = an
        self.decls = input_decls
        self.helpers: set[str] = set()
        self.active: list[CallInfo] = []

    def decide(self) -> dict[int, list[str]]:
        """The forward lines of each extracted module (by id of its Module). A fixpoint:
        instances only ever go from extracted to inlined (when a call reaches a module not
        below it, or two calls of one instance would need different code)."""
        an = self.an
        an.check_calls()
        candidates = [ci for ci in an.calls if ci.valid]
        inlined: set[int] = {id(ci.info.obj) for ci in an.calls
                             if not ci.valid and ci.info is not None}
        while True:
            active = [ci for ci in candidates if id(ci.info.obj) not in inlined]
            codes = self._codes(active)
            if isinstance(codes, int):
                inlined.add(codes)
                continue
            self.active = active
            return codes

    def _codes(self, active: list[CallInfo]) -> dict[int, list[str]] | int:
        """Each active module's forward, or the id of the first one to inline instead."""
        codes: dict[int, list[str]] = {}
        for ci in sorted(active, key=lambda c: (c.call.end - c.call.start, c.call.index)):
            kids = self._top_children(ci, active)
            key = id(ci.info.obj)
            if any(relative(ci.info, kid.info.chain) is None for kid in kids):
                return key  # it calls a module that is not its own child
            lines = self._call_lines(ci, kids)
            if key in codes and codes[key] != lines:
                return key
            codes[key] = lines
        return codes

    def _top_children(self, parent: CallInfo | None, active: list[CallInfo]
                      ) -> list[CallInfo]:
        an = self.an
        inside = [ci for ci in active if parent is None or an.contains(parent, ci)]
        return [ci for ci in inside
                if not any(an.contains(o, ci) for o in inside if o is not ci)]

    def _call_lines(self, ci: CallInfo, kids: list[CallInfo]) -> list[str]:
        names: dict[int, str] = {}
        for pname, t in ci.tensor_args:
            names.setdefault(t, pname)
        body = Body(self.an, ci.info, ci.outs, names, kids, source_range(ci.call.fn))
        ctx = TorchContext(self.an.size_name, "self")
        lines = body.lines(ctx)
        if ctx.uses_size:
            lines = [self._size_line(ci, names)] + lines
        self.helpers |= ctx.helpers
        sig = ", ".join(["self", *[p for p, _ in ci.tensor_args]])
        return [f"def forward({sig}):", *["    " + ln for ln in lines]]

    def _size_line(self, ci: CallInfo, names: Mapping[int, str]) -> str:
        an = self.an
        for t, name in names.items():
            for k, d in enumerate(an.shapes[t]):
                if isinstance(d, Sym):
                    return f"{an.size_name} = {_size_from(name, k, d)}"
        raise ExportError(f"{type(ci.info.obj).__name__}.forward uses the None dim but none "
                          "of its tensor arguments has it")

    def root_forward(self) -> list[str]:
        """The root class's forward (after :meth:`decide`)."""
        an = self.an
        names = {an.input_ids[n]: n for n in an.input_names if n in an.input_ids}
        kids = self._top_children(None, self.active)
        body = Body(an, an.root, [an.tr.out], names, kids,
                    source_range(an.forward_fn) + source_range(type(an.root.obj).forward))
        ctx = TorchContext(an.size_name, "self")
        lines = body.lines(ctx)
        if ctx.uses_size:
            for name in an.input_names:
                shape = self.decls[name][0]
                if None in shape:
                    lines = [f"{an.size_name} = {name}.shape[{shape.index(None)}]"] + lines
                    break
        self.helpers |= ctx.helpers
        sig = ", ".join(["self", *an.input_names])
        return [f"def forward({sig}):", f'    """{self.doc()}"""', *["    " + ln for ln in lines]]

    def doc(self) -> str:
        """The root forward's inputs and output, e.g. ``x: float32 [B, 1] -> float32 [B, 1]``."""
        an = self.an
        size = an.size_name or ""  # (set whenever a dim is None or a Sym)
        parts = []
        for name in an.input_names:
            shape, dtype = self.decls[name]
            dims = ", ".join(size if d is None else str(d) for d in shape)
            kind = "float32" if dtype == "f32" else "integer"
            parts.append(f"{name}: {kind} [{dims}]")
        out = an.graph[an.tr.out]
        dims = ", ".join(d.render(size) if isinstance(d, Sym) else str(d)
                         for d in an.shapes[an.tr.out])
        kind = {"f32": "float32", "i32": "int64", "bool": "bool"}[out.dtype]
        text = f"{'; '.join(parts)} -> {kind} [{dims}]"
        if an.size_name:
            text += f" (any {an.size_name})"
        return text
