"""Tracing a model for export: the forward's graph, the Module calls made in it, and the
None dim as a * N + c.

A dim declared None is traced at three probe sizes (two to fit a * N + c, one to check);
every shape and op attribute that changes with it must follow that form, and becomes a
:class:`~tensorgrad.codegen.torchexpr.Sym` (a :class:`SymFloat` for a float attribute).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..codegen.torchexpr import Sym, SymFloat
from ..errors import ShapeError
from ..ir import Graph
from ..module import Module
from ..tensor import Tensor, current_trace
from .errors import ExportError


@dataclass
class Call:
    """One call of a Module's forward recorded while tracing."""

    index: int
    module: Module
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any
    start: int
    end: int


class CallRecorder:
    """Wraps `forward` of every Module class in a tree for one trace; records each call."""

    def __init__(self, classes: Sequence[type[Module]]):
        self.classes = list(classes)
        self.calls: list[Call] = []
        self._saved: list[tuple[type[Module], bool, Any]] = []
        self._active: set[int] = set()

    def __enter__(self) -> CallRecorder:  # noqa: PYI034
        for cls in self.classes:
            own = "forward" in cls.__dict__
            orig = cls.__dict__["forward"] if own else cls.forward
            self._saved.append((cls, own, orig))
            setattr(cls, "forward", self._wrap(orig))  # noqa: B010
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, own, orig in reversed(self._saved):
            if own:
                cls.forward = orig
            else:
                delattr(cls, "forward")
        self._saved.clear()

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if id(module) in recorder._active:
                return fn(module, *args, **kwargs)
            graph = current_trace("forward").graph
            start = len(graph.nodes)
            recorder._active.add(id(module))
            try:
                result = fn(module, *args, **kwargs)
            finally:
                recorder._active.discard(id(module))
            recorder.calls.append(Call(len(recorder.calls), module, fn, args, kwargs, result,
                                        start, len(graph.nodes)))
            return result

        forward.__wrapped__ = fn  # type: ignore[attr-defined]
        return forward


@dataclass
class Traced:
    """One trace: its graph, output, the traced clone of the model and its Module calls."""

    graph: Graph
    out: int
    clone: Module
    calls: list[Call]


def _module_classes(root: Module) -> list[type]:
    seen: dict[type, None] = {}
    for info in _walk_modules(root):
        for cls in type(info).__mro__:
            if cls is Module:
                break
            if issubclass(cls, Module):
                seen.setdefault(cls)
    return list(seen)


def _walk_modules(root: Module) -> list[Module]:
    out: list[Module] = []
    seen: set[int] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, Module):
            if id(obj) in seen:
                return
            seen.add(id(obj))
            out.append(obj)
            children: Any = vars(obj).values()
        elif isinstance(obj, (list, tuple)):
            children = obj
        elif isinstance(obj, dict):
            children = obj.values()
        else:
            return
        for v in children:
            walk(v)

    walk(root)
    return out


def trace_model(model: Module, forward: Callable[..., Tensor], shapes: Mapping[str, Any],
                record: bool) -> Traced:
    """Trace `forward(model, **inputs)` at `shapes`, recording its Module calls if `record`."""
    from ..compiler import trace_forward

    holder: dict[str, Any] = {}
    classes = _module_classes(model) if record else []

    def traced(m: Module, **inputs: Tensor) -> Tensor:
        holder["clone"] = m
        if record:
            with CallRecorder(classes) as rec:
                out = forward(m, **inputs)
            holder["calls"] = rec.calls
        else:
            out = forward(m, **inputs)
        holder["out"] = out
        return out

    trace_forward(model, traced, shapes)
    out = holder["out"]
    return Traced(out.graph, out.id, holder["clone"], holder.get("calls", []))


def fit(values: Sequence[Any], probes: Sequence[int], where: str) -> Any:
    """The value (int, float, nested tuple) traced at each probe as constants and Syms."""
    first = values[0]
    if all(v == first and type(v) is type(first) for v in values):
        return first
    if all(isinstance(v, bool) for v in values) or any(v is None for v in values):
        raise ExportError(f"{where} changes with the None dim ({values} at sizes {list(probes)})")
    if all(isinstance(v, int) for v in values):
        (p0, p1, p2), (v0, v1, v2) = probes[:3], values[:3]
        if (v1 - v0) % (p1 - p0) == 0:
            a = (v1 - v0) // (p1 - p0)
            c = v0 - a * p0
            if a * p2 + c == v2:
                return Sym(a, c) if a else c
        raise ExportError(f"{where} is {list(values)} at None-dim sizes {list(probes)}: not "
                          "a * N + c with integers, which export can write (declare that dim "
                          "fixed instead)")
    if all(isinstance(v, (int, float)) for v in values):
        (p0, p1, p2), (v0, v1, v2) = probes[:3], [float(v) for v in values[:3]]
        for recip in (True, False):
            if recip and 0.0 in (v0, v1, v2):
                continue
            y0, y1, y2 = (1 / v0, 1 / v1, 1 / v2) if recip else (v0, v1, v2)
            a = (y1 - y0) / (p1 - p0)
            c = y0 - a * p0
            if math.isclose(a * p2 + c, y2, rel_tol=1e-6, abs_tol=1e-12):
                ra, rc = round(a), round(c)
                if math.isclose(a, ra, abs_tol=1e-6) and math.isclose(c, rc, abs_tol=1e-6):
                    a, c = ra, rc
                return SymFloat(a, c, recip)
        raise ExportError(f"{where} is {list(values)} at None-dim sizes {list(probes)}: "
                          "not expressible in the size")
    if all(isinstance(v, (tuple, list)) for v in values) and len({len(v) for v in values}) == 1:
        return tuple(fit([v[k] for v in values], probes, f"{where}[{k}]")
                     for k in range(len(first)))
    raise ExportError(f"{where} changes with the None dim ({values} at sizes {list(probes)})")


def symbolic(traces: Sequence[Traced], probes: Sequence[int]
              ) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """Per node of the first trace: its shape and attrs with Syms where they follow N."""
    g0 = traces[0].graph
    for t in traces[1:]:
        if len(t.graph.nodes) != len(g0.nodes) or any(
                a.op != b.op or a.inputs != b.inputs for a, b in zip(g0.nodes, t.graph.nodes)):
            raise ExportError("the traced graph changes with the size of the None dim (the "
                              "forward branches on it); declare the dim fixed")
    shapes, attrs = [], []
    for k, node in enumerate(g0.nodes):
        others = [t.graph[k] for t in traces]
        where = f"node %{k} ({node.op})"
        shapes.append(fit([n.shape for n in others], probes, f"the shape of {where}"))
        at = {}
        for key in node.attrs:
            at[key] = fit([n.attrs[key] for n in others], probes, f"attr {key!r} of {where}")
        attrs.append(at)
    return shapes, attrs


@dataclass
class Probed:
    """The first trace, with each node's shape and attrs (Syms where they follow the None
    dim), and the None dim's name in the source (None: no dim was declared None)."""

    first: Traced
    shapes: list[Any]
    attrs: list[dict[str, Any]]
    size_name: str | None


def trace_probes(root: Module, forward: Callable[..., Tensor],
                 decls: Mapping[str, tuple[tuple[Any, ...], str]], probes: Sequence[int]) -> Probed:
    """Trace `forward` once, or, with a None dim in `decls`, at three probe sizes, and fit
    every shape and attr to the size."""
    wild = [(name, shape.index(None)) for name, (shape, _) in decls.items() if None in shape]
    probes = tuple(probes)
    if wild and (len(probes) < 3 or len(set(probes)) < 3):
        raise ExportError(f"probes must be three different sizes, got {list(probes)}")

    def shapes_at(n: int) -> dict[str, Any]:
        return {k: (tuple(n if d is None else d for d in s), dt) for k, (s, dt) in
                decls.items()}

    try:
        first = trace_model(root, forward, shapes_at(probes[0]), record=True)
        traces = [first]
        if wild:
            traces += [trace_model(root, forward, shapes_at(p), record=False)
                       for p in probes[1:3]]
    except ShapeError as exc:
        if wild:
            raise ExportError(f"tracing the forward with the None dim at size(s) "
                              f"{list(probes)} failed (pass probes=(a, b, c) the model "
                              f"accepts): {exc}") from exc
        raise
    if not wild:
        return Probed(first, [n.shape for n in first.graph.nodes],
                      [dict(n.attrs) for n in first.graph.nodes], None)
    shapes, attrs = symbolic(traces, probes)
    size_name = "B" if wild[0][1] == 0 else "N"
    while size_name in decls:
        size_name += "_"
    return Probed(first, shapes, attrs, size_name)
