"""The trace stage: a model plus a loss (or forward) function → the IR graph it computes.

:func:`trace_graph` records ``fn(model, **inputs)`` on a clone of `model` with one symbolic
tensor per declared input, and returns the :class:`TracedGraph` — nothing more (autograd,
passes and the rest are later stages of :mod:`tensorgrad.compiler`).

Input declarations: ``{name: shape}`` (f32) or ``{name: (shape, "i32")}`` (or
``{"shape": ..., "dtype": ...}``). Forward declarations may leave one dim per input as None;
:func:`resolve_shapes` fixes it from the data before tracing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Any, TypeAlias

from . import init as _init
from .errors import ShapeError, TraceError
from .hostdata import element_count
from .init import ParamSpec
from .ir import DType, Graph
from .module import Module, materialize
from .tensor import Tensor, leaf, tracing

if TYPE_CHECKING:
    from .hostdata import InputData

__all__ = ["InputDecl", "TracedGraph", "check_seed", "normalize_inputs", "resolve_shapes",
           "trace_graph"]

INPUT_DTYPES = ("f32", "i32")


@dataclass(frozen=True)
class InputDecl:
    """A declared input: shape (None marks the one wildcard dim, forward graphs only), dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: DType = "f32"

    @property
    def concrete(self) -> bool:
        return None not in self.shape


# An input declaration as written: a shape (a sequence of dims, None for the one free dim a
# forward input may have; an int for one dim), (shape, dtype), {"shape": ..., "dtype": ...}
# or an InputDecl (see the module docstring).
Dims = Sequence[int | None]
InputSpec: TypeAlias = Dims | int | tuple[Dims, DType] | Mapping[str, Dims | DType] | InputDecl


@dataclass
class TracedGraph:
    """What tracing records: the graph (its `outputs` = [output]), the output node id, the
    params ({name: ParamSpec}, in param order) and the inputs ({name: InputDecl})."""

    graph: Graph
    output: int
    params: dict[str, ParamSpec]
    inputs: dict[str, InputDecl]


# ---- input declarations ----------------------------------------------------------------

def _decl(name: object, raw: object, wildcards: bool, op: str) -> InputDecl:
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
        raise ShapeError(op, _none_dim_message(name, shape, dtype, op))
    if wild > 1:
        raise ShapeError(op, f"input '{name}': at most one None dim per input, got "
                         f"{list(shape)}")
    return InputDecl(name, tuple(shape), dtype)


def _none_dim_message(name: str, shape: Sequence[Any], dtype: DType, op: str) -> str:
    """Why a None dim is refused here, and the public calls that take one."""
    free = f"{{'{name}': {tuple(shape)!r}}}" if dtype == "f32" else \
        f"{{'{name}': ({tuple(shape)!r}, '{dtype}')}}"
    if op == "trace_forward":
        lead = "trace_forward traces one concrete shape: give every dim"
    else:
        lead = ("training inputs must be fully concrete (a training step is compiled for one "
                "shape: declare the batch size you train with)")
    return (f"input '{name}' has an unresolved None dim in {list(shape)}: {lead}. None dims "
            "are for inference graphs, which resolve them from the data and compile once per "
            f"size: predict = await train.attach(forward=..., inputs={free}) shares the "
            f"training's params, or await tg.compile_forward(model=..., forward=..., "
            f"inputs={free})")


def normalize_inputs(decls: Mapping[str, InputSpec], wildcards: bool = True,
                     op: str = "inputs") -> dict[str, InputDecl]:
    """Validate input declarations into {name: InputDecl} (declaration order kept)."""
    if isinstance(decls, Mapping) and all(isinstance(v, InputDecl) for v in decls.values()):
        decls = {k: (v.shape, v.dtype) for k, v in decls.items() if isinstance(v, InputDecl)}
    if not isinstance(decls, Mapping):
        raise ShapeError(op, f"inputs must be a dict {{name: shape}} or {{name: (shape, "
                         f"dtype)}}, e.g. {{'x': (32, 784), 'y': ((32,), 'i32')}}; got "
                         f"{type(decls).__name__} {decls!r:.60}")
    return {name: _decl(name, raw, wildcards, op) for name, raw in decls.items()}


def resolve_shapes(decls: Mapping[str, InputSpec], arrays: Mapping[str, InputData]
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
        n = element_count(arrays[name])
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
         graph: Graph) -> tuple[Tensor, dict[str, ParamSpec]]:
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


def check_seed(seed: int | None) -> int:
    """A 32-bit init seed: `seed` masked to 32 bits, or a random one for None. TypeError for
    anything else (bools, floats and strings too: nothing is converted)."""
    if seed is None:
        return _init.random_seed()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int (32-bit), got {seed!r} ({type(seed).__name__}); "
                        "pass an int, or None for a random seed")
    return seed & _init.MASK32


def model_params(model: Module) -> dict[str, ParamSpec]:
    """{dotted name: ParamSpec} of `model`'s params, in param order, without tracing (what a
    trace of it binds); TraceError when `model` is not a tg.Module."""
    if not isinstance(model, Module):
        raise TraceError(f"the model must be a tg.Module instance, got {type(model).__name__}")
    return model.named_params()


def trace_graph(model: Module, fn: Callable[..., Tensor], inputs: Mapping[str, InputSpec],
                what: str = "loss") -> TracedGraph:
    """Trace ``fn(model, **inputs)`` (`what`: "loss" or "forward", for messages).

    Every input dim must be concrete (``train.attach`` and ``tg.compile_forward`` take None
    dims: they resolve them from the data with :func:`resolve_shapes` and trace each size)."""
    op = "trace" if what == "loss" else "trace_forward"
    decls = normalize_inputs(inputs, wildcards=False, op=op)
    graph = Graph()
    with tracing(graph):
        out, specs = _run(model, fn, decls, what, graph)
    graph.outputs = [out.id]
    return TracedGraph(graph, out.id, specs, decls)
