"""Symbolic tensors and the trace context that records them into an IR graph."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .errors import ShapeError, TraceError, user_call_site
from .ir import DTYPES, DType, Graph, Node, Shape

PRNG_SEED_INPUT = "__prng_seed"


@dataclass
class TraceState:
    """What a trace in progress records into."""

    graph: Graph
    capture_enabled: bool = True
    stochastic_count: int = 0
    seed: Tensor | None = None
    names: set[str] = field(default_factory=set)


class _Trace(threading.local):
    """The trace in progress in this thread (each thread traces on its own: forwards run
    from several threads each trace their new shapes)."""

    state: TraceState | None = None


_trace = _Trace()


@contextmanager
def tracing(graph: Graph | None = None, capture: bool = True) -> Iterator[TraceState]:
    """Record ops into `graph` (a fresh one by default). Traces do not nest (in a thread)."""
    if _trace.state is not None:
        raise TraceError("a trace is already in progress; traces do not nest")
    g = graph if graph is not None else Graph()
    state = TraceState(g, capture_enabled=capture)
    state.names = {n.attrs["name"] for n in g.nodes if n.op in ("param", "input")}
    seeds = [n for n in g.nodes if n.op == "input" and n.attrs["name"] == PRNG_SEED_INPUT]
    if seeds:
        state.seed = Tensor(g, seeds[0].id)
    state.stochastic_count = sum(1 for n in g.nodes if n.attrs.get("salt") is not None
                                 and n.op in ("dropout", "randn", "categorical_last"))
    _trace.state = state
    try:
        yield state
    finally:
        _trace.state = None


def current_trace(op: str = "") -> TraceState:
    """The trace in progress; raises TraceError naming `op` when there is none."""
    state = _trace.state
    if state is None:
        what = f"'{op}'" if op else "an op"
        raise TraceError(f"{what} was called outside a trace: tensorgrad ops only run while "
                         "tg.compile / tg.trace traces your loss or forward function")
    return state


def is_tracing() -> bool:
    return _trace.state is not None


def leaf(op: str, name: str, shape: Sequence[int], dtype: DType = "f32", **attrs: Any) -> Tensor:
    """A named leaf: 'param' or 'input' (one namespace) or 'state' (its own namespace)."""
    state = current_trace(op)
    shape = tuple(shape)
    if dtype not in DTYPES:
        raise ShapeError(op, f"'{name}': dtype must be one of {DTYPES}, got {dtype!r}")
    if any(not isinstance(d, int) or d <= 0 for d in shape):
        raise ShapeError(op, f"'{name}': dims must be positive ints, got {list(shape)}")
    key = name if op in ("param", "input") else f"state:{name}"
    if key in state.names:
        raise TraceError(f"duplicate {op} name '{name}'")
    state.names.add(key)
    node = state.graph.add(op, (), {"name": name, **attrs}, shape, dtype, user_call_site())
    return Tensor(state.graph, node.id)


def prng_seed() -> Tensor:
    """The hidden per-step seed input (0-d i32), created on first use in a graph."""
    state = current_trace("prng")
    if state.seed is None:
        state.seed = leaf("input", PRNG_SEED_INPUT, (), "i32")
    return state.seed


def next_salt() -> int:
    """Salt for a new stochastic op: how many stochastic ops the graph already has."""
    state = current_trace("prng")
    salt = state.stochastic_count
    state.stochastic_count += 1
    return salt


# Python operator -> op function; filled by tensorgrad.ops (the op functions live above this
# module, so it cannot import them).
OPERATORS: dict[str, Callable[..., Tensor]] = {}


def _operator(name: str, reflected: bool = False) -> Callable[[Tensor, Any], Tensor]:
    def method(self: Tensor, other: Any) -> Tensor:
        fn = OPERATORS[name]
        return fn(other, self) if reflected else fn(self, other)

    method.__name__ = f"__{'r' if reflected else ''}{name}__"
    return method


class Tensor:
    """A symbolic tensor inside a trace: a shape, a dtype and the node that makes it.

    Python operators build ops: `+ - * / @`, unary `-`, `<`, `>`, `** 2`; Python scalars
    broadcast on either side."""

    __slots__ = ("graph", "id")
    __array_priority__ = 1000  # so numpy scalars defer to our reflected operators

    def __init__(self, graph: Graph, node_id: int):
        self.graph = graph
        self.id = node_id

    @property
    def node(self) -> Node:
        """The IR node that computes this tensor."""
        return self.graph[self.id]

    @property
    def shape(self) -> Shape:
        """The static shape, a tuple of ints (known while tracing)."""
        return self.graph[self.id].shape

    @property
    def dtype(self) -> DType:
        """"f32", "i32" or "bool"."""
        return self.graph[self.id].dtype

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements (the product of the shape)."""
        return self.graph[self.id].size

    def __repr__(self) -> str:
        return f"Tensor(%{self.id}, shape={list(self.shape)}, dtype={self.dtype})"

    def __bool__(self) -> bool:
        raise TypeError("a traced Tensor has no value yet, so it cannot be used as a bool "
                        "(use tg.where for data-dependent choices)")

    def __getitem__(self, index: Any) -> Tensor:
        raise TypeError(f"a traced Tensor cannot be indexed with [] (got [{index!r}] on shape "
                        f"{list(self.shape)}): use tg.narrow for a slice, tg.take_along_axis "
                        "to gather, tg.reshape or tg.split_heads to reshape")

    def __iter__(self) -> Any:
        raise TypeError(f"a traced Tensor of shape {list(self.shape)} cannot be iterated: "
                        "use tg.split or tg.narrow")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # Python operators: the op functions of tensorgrad.ops (which fill OPERATORS on import).
    __add__ = _operator("add")
    __radd__ = _operator("add", reflected=True)
    __sub__ = _operator("sub")
    __rsub__ = _operator("sub", reflected=True)
    __mul__ = _operator("mul")
    __rmul__ = _operator("mul", reflected=True)
    __truediv__ = _operator("div")
    __rtruediv__ = _operator("div", reflected=True)
    __matmul__ = _operator("matmul")
    __rmatmul__ = _operator("matmul", reflected=True)
    __lt__ = _operator("less")
    __gt__ = _operator("greater")
    __pow__ = _operator("pow")

    def __neg__(self) -> Tensor:
        return OPERATORS["neg"](self)
