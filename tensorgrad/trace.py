"""Tracing entry points: a model plus a loss (or forward) function → an IR graph.

``trace(model, loss, inputs, seed)`` records the forward graph on a clone of `model`, appends
the backward graph and removes dead code, giving a :class:`TrainingTrace`.
``trace_forward(model, forward, inputs)`` gives a :class:`ForwardTrace` (no gradients).

Input declarations: ``{name: shape}`` (f32) or ``{name: (shape, "i32")}`` (or
``{"shape": ..., "dtype": ...}``). Forward declarations may leave one dim per input as None;
:func:`resolve_shapes` fixes it from the data before tracing. The functions are called as
``loss(model, **inputs)`` with one symbolic Tensor per declared input.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any

from . import init as _init
from .autograd import append_grad
from .errors import ShapeError, TraceError
from .ir import Graph
from .module import Module, ParamSpec, materialize
from .passes.dce import eliminate_dead_code
from .tensor import Tensor, leaf, tracing

__all__ = ["ForwardTrace", "InputDecl", "TrainingTrace", "normalize_inputs", "resolve_shapes",
           "trace", "trace_forward"]

INPUT_DTYPES = ("f32", "i32")


@dataclass(frozen=True)
class InputDecl:
    """A declared input: shape (None marks the one wildcard dim, forward graphs only), dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str = "f32"

    @property
    def concrete(self) -> bool:
        return None not in self.shape

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


class _ParamsView:
    """Param accessors shared by the trace records."""

    params: dict[str, ParamSpec]

    @property
    def param_names(self) -> list[str]:
        return list(self.params)

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: p.shape for k, p in self.params.items()}


@dataclass
class TrainingTrace(_ParamsView):
    """A traced training step: forward + backward graph (after DCE), before the optimizer.

    graph: the IR; loss: the loss node id; grads: {param name: gradient node id} (f32
    params); params: {name: ParamSpec} (shape, dtype, init spec, decay flag, fan-in) in
    param order; inputs: {name: InputDecl} in declaration order; seed: the init seed."""

    graph: Graph
    loss: int
    grads: dict[str, int]
    params: dict[str, ParamSpec]
    inputs: dict[str, InputDecl]
    seed: int

    @property
    def decay(self) -> dict[str, bool]:
        return {k: p.decay for k, p in self.params.items()}

    def init_params(self, seed: int | None = None) -> dict[str, Any]:
        """Initial param values ({name: flat array}) from `seed` (default: the trace seed)."""
        return _init.init_params(self.params, self.seed if seed is None else seed)


@dataclass
class ForwardTrace(_ParamsView):
    """A traced forward pass (after DCE): graph, output node id, params and inputs."""

    graph: Graph
    output: int
    params: dict[str, ParamSpec]
    inputs: dict[str, InputDecl]
    grads: dict[str, int] = field(default_factory=dict)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.graph[self.output].shape

    @property
    def output_dtype(self) -> str:
        return self.graph[self.output].dtype

    def init_params(self, seed: int) -> dict[str, Any]:
        return _init.init_params(self.params, seed)


# ---- input declarations ----------------------------------------------------------------

def _decl(name: Any, raw: Any, wildcards: bool, op: str) -> InputDecl:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("__"):
        raise ShapeError(op, f"input name {name!r} must be a Python identifier not starting "
                         "with '__' (inputs are passed as keyword arguments)")
    dtype: Any = "f32"
    shape: Any = raw
    if isinstance(raw, Mapping):
        if "shape" not in raw or set(raw) - {"shape", "dtype"}:
            raise ShapeError(op, f"input '{name}': a dict declaration needs the keys 'shape' "
                             f"and optionally 'dtype', got {dict(raw)!r}")
        shape, dtype = raw["shape"], raw.get("dtype", "f32")
    elif isinstance(raw, (tuple, list)) and len(raw) == 2 and isinstance(raw[1], str):
        shape, dtype = raw
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise ShapeError(op, f"input '{name}': expected a shape (a tuple of dims) or "
                         f"(shape, dtype), got {raw!r}")
    if dtype not in INPUT_DTYPES:
        raise ShapeError(op, f"input '{name}': dtype must be 'f32' or 'i32', got {dtype!r}")
    for d in shape:
        if d is None:
            continue
        if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
            raise ShapeError(op, f"input '{name}': dims must be positive ints"
                             f"{' (or one None)' if wildcards else ''}, got {list(shape)}")
    wild = sum(d is None for d in shape)
    if wild and not wildcards:
        raise ShapeError(op, f"input '{name}' has an unresolved None dim in {list(shape)}: "
                         "training inputs must be fully concrete"
                         if op == "trace" else
                         f"input '{name}' has an unresolved None dim in {list(shape)}; "
                         "resolve it from the data first with resolve_shapes(decls, arrays)")
    if wild > 1:
        raise ShapeError(op, f"input '{name}': at most one None dim per input, got "
                         f"{list(shape)}")
    return InputDecl(name, tuple(shape), dtype)


def normalize_inputs(decls: Mapping[str, Any], wildcards: bool = True,
                     op: str = "inputs") -> dict[str, InputDecl]:
    """Validate input declarations into {name: InputDecl} (declaration order kept)."""
    if isinstance(decls, Mapping) and all(isinstance(v, InputDecl) for v in decls.values()):
        decls = {k: (v.shape, v.dtype) for k, v in decls.items()}
    if not isinstance(decls, Mapping):
        raise ShapeError(op, f"inputs must be a dict {{name: shape}} or {{name: (shape, "
                         f"dtype)}}, got {type(decls).__name__}")
    return {name: _decl(name, raw, wildcards, op) for name, raw in decls.items()}


def _length(value: Any) -> int:
    if hasattr(value, "size") and not callable(value.size):  # numpy arrays
        return int(value.size)
    if isinstance(value, memoryview):
        return value.nbytes // max(1, value.itemsize)
    return len(value)


def resolve_shapes(decls: Mapping[str, Any], arrays: Mapping[str, Any]
                   ) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for forward input declarations, given the data (flat or not).

    A None dim is the data length divided by the product of the other dims; every wildcard
    must resolve to the same value. Raises ShapeError on a missing or unknown input, a length
    that does not divide (or match), or wildcards that disagree."""
    specs = normalize_inputs(decls, wildcards=True)
    missing = [k for k in specs if k not in arrays]
    if missing:
        raise ShapeError("inputs", f"missing input(s) {missing}; declared: {list(specs)}")
    extra = [k for k in arrays if k not in specs]
    if extra:
        raise ShapeError("inputs", f"unknown input(s) {extra}; declared: {list(specs)}")
    out: dict[str, tuple[int, ...]] = {}
    wild_value: tuple[str, int] | None = None
    for name, d in specs.items():
        n = _length(arrays[name])
        known = prod(x for x in d.shape if x is not None)
        if d.concrete:
            if n != known:
                raise ShapeError("inputs", f"input '{name}' has {n} elements but its declared "
                                 f"shape {list(d.shape)} needs {known}")
            out[name] = d.shape  # type: ignore[assignment]
            continue
        if n % known or n == 0:
            raise ShapeError("inputs", f"input '{name}' has {n} elements, which is not a "
                             f"positive multiple of {known} (the product of the known dims "
                             f"of {list(d.shape)})")
        value = n // known
        if wild_value is not None and wild_value[1] != value:
            raise ShapeError("inputs", f"the None dims disagree: input '{wild_value[0]}' gives "
                             f"{wild_value[1]} but input '{name}' gives {value}")
        wild_value = (name, value)
        out[name] = tuple(value if x is None else x for x in d.shape)
    return out


# ---- tracing ---------------------------------------------------------------------------

def _check_signature(fn: Callable[..., Any], names: Sequence[str], what: str) -> None:
    """The function must accept (model, **inputs) with exactly the declared names."""
    if not callable(fn):
        raise TraceError(f"the {what} function must be callable, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    P = inspect.Parameter
    params = list(sig.parameters.values())
    label = f"{getattr(fn, '__name__', what)}{sig}"
    if params and params[0].kind is P.VAR_POSITIONAL:
        return
    if not params or params[0].kind not in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
        raise TraceError(f"the {what} function {label} must take the model as its first "
                         "positional argument")
    rest = params[1:]
    keywords = [p.name for p in rest if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)]
    required = [p.name for p in rest if p.default is P.empty
                and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
    open_kw = any(p.kind is P.VAR_KEYWORD for p in rest)
    extra = [] if open_kw else [n for n in names if n not in keywords]
    missing = [n for n in required if n not in names]
    if extra or missing:
        parts = []
        if missing:
            parts.append(f"it requires {missing}, which {'is' if len(missing) == 1 else 'are'} "
                         "not declared as input(s)")
        if extra:
            parts.append(f"the declared input(s) {extra} are not among its parameters")
        call = ", ".join(["model", *(f"{n}=..." for n in names)])
        raise TraceError(f"input name mismatch: the {what} function {label} is called as "
                         f"({call}), but " + " and ".join(parts))


def _run(model: Module, fn: Callable[..., Any], decls: dict[str, InputDecl], what: str,
         graph: Graph) -> tuple[Any, dict[str, ParamSpec]]:
    _check_signature(fn, list(decls), what)
    clone, specs, _ = materialize(model)
    for name in decls:
        if name in specs:
            raise TraceError(f"input '{name}' has the same name as a param; rename the input")
    symbolic = {name: leaf("input", name, d.shape, d.dtype)  # type: ignore[arg-type]
                for name, d in decls.items()}
    result = fn(clone, **symbolic)
    if not isinstance(result, Tensor):
        raise TraceError(f"the {what} function must return one tg.Tensor, got "
                         f"{type(result).__name__}" + (
                             " (return a single tensor; captures carry extra values)"
                             if isinstance(result, (tuple, list, dict)) else ""))
    if result.graph is not graph:
        raise TraceError(f"the {what} function returned a tensor from another trace")
    return result, specs


def _seed(seed: int | None) -> int:
    if seed is None:
        return _init.random_seed()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TraceError(f"seed must be an int (32-bit), got {seed!r}")
    return seed & _init.MASK32


def trace(model: Module, loss: Callable[..., Tensor], inputs: Mapping[str, Any],
          seed: int | None = None) -> TrainingTrace:
    """Trace `loss(model, **inputs)` → forward + backward graph (after dead-code elimination).

    The loss must be a 0-d f32 tensor. All input dims must be concrete. `seed` (32-bit; random
    by default) seeds the param init stream."""
    decls = normalize_inputs(inputs, wildcards=False, op="trace")
    seed = _seed(seed)
    graph = Graph()
    with tracing(graph):
        out, specs = _run(model, loss, decls, "loss", graph)
    graph.outputs = [out.id]
    grads = append_grad(graph, out.id)  # checks that the loss is a 0-d f32 tensor
    graph, remap = eliminate_dead_code(graph, [out.id, *grads.values()])
    return TrainingTrace(graph, remap[out.id], {k: remap[v] for k, v in grads.items()}, specs,
                         decls, seed)


def trace_forward(model: Module, forward: Callable[..., Tensor],
                  inputs: Mapping[str, Any]) -> ForwardTrace:
    """Trace `forward(model, **inputs)` → forward graph (after dead-code elimination).

    Input dims must be concrete (resolve None dims with :func:`resolve_shapes` first)."""
    decls = normalize_inputs(inputs, wildcards=False, op="trace_forward")
    graph = Graph()
    with tracing(graph):
        out, specs = _run(model, forward, decls, "forward", graph)
    graph.outputs = [out.id]
    graph, remap = eliminate_dead_code(graph, [out.id])
    return ForwardTrace(graph, remap[out.id], specs, decls)
