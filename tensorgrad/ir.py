"""The IR: a graph of nodes, each one op producing one tensor. Plain data.

Nodes are kept in construction order, which is a topological order and also the dispatch
order. Leaves are `param`, `input` and `state` nodes, named by `attrs["name"]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from typing import Any, Literal

# The element types of tensors: 4 bytes each (bool is stored as a u32), but for f16, a
# storage type of 2 bytes that only mixed precision gives nodes (passes/precision.py): kernels
# read an f16 value into an f32 and compute in f32, and round what they write to f16.
DType = Literal["f32", "i32", "bool", "f16"]
Shape = tuple[int, ...]
# The dtypes a user can declare (inputs, `tg.full`); f16 is the compiler's alone.
DTYPES: tuple[DType, ...] = ("f32", "i32", "bool")
ITEMSIZE: dict[DType, int] = {"f32": 4, "i32": 4, "bool": 4, "f16": 2}
# An op's static arguments: ints, floats, strings, tuples of them, and for a `fused` node its
# FusedProgram (each op documents its own).
Attrs = dict[str, Any]
LEAF_OPS = frozenset({"param", "input", "state"})


@dataclass(frozen=True, eq=False)
class Node:
    """One op application. `inputs` are node ids; `attrs` hold the op's static arguments."""

    id: int
    op: str
    inputs: tuple[int, ...]
    attrs: Attrs
    shape: Shape
    dtype: DType
    site: str = ""

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (2 each for f16, else 4)."""
        return ITEMSIZE[self.dtype] * self.size

    @property
    def buffer_bytes(self) -> int:
        """Bytes of a buffer that holds the node: `nbytes` rounded up to a multiple of 4
        (WebGPU's storage bindings), at least 4."""
        return max(4, (self.nbytes + 3) & ~3)

    @property
    def label(self) -> str:
        """The op's name, for messages; a fused node names the ops it holds."""
        if self.op != "fused":
            return self.op
        inner = dict.fromkeys(n.op for n in self.attrs["program"].nodes
                              if n.op not in ("reshape", "broadcast_to"))
        return f"fused({', '.join(inner)})"

    def describe(self) -> str:
        args = ", ".join(f"%{i}" for i in self.inputs)
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items())
        inner = ", ".join(x for x in (args, attrs) if x)
        return f"%{self.id}: {self.dtype}{list(self.shape)} = {self.op}({inner})"


@dataclass
class Graph:
    """An IR graph. `outputs` are node ids; `captures` maps capture names to node ids."""

    nodes: list[Node] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    captures: dict[str, int] = field(default_factory=dict)

    def add(self, op: str, inputs: tuple[int, ...], attrs: Attrs, shape: Shape,
            dtype: DType, site: str = "") -> Node:
        node = Node(len(self.nodes), op, tuple(inputs), dict(attrs), tuple(shape), dtype, site)
        self.nodes.append(node)
        return node

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def leaves(self, op: str) -> dict[str, Node]:
        """Named leaves of one kind ('param', 'input' or 'state'), in graph order."""
        return {n.attrs["name"]: n for n in self.nodes if n.op == op}

    @property
    def params(self) -> dict[str, Node]:
        return self.leaves("param")

    @property
    def inputs(self) -> dict[str, Node]:
        return self.leaves("input")

    @property
    def states(self) -> dict[str, Node]:
        return self.leaves("state")

    def users(self) -> list[list[int]]:
        """For each node, the ids of the nodes that read it."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for n in self.nodes:
            for i in n.inputs:
                users[i].append(n.id)
        return users

    def __repr__(self) -> str:
        """One line of counts (``print()`` / ``str()`` give the whole IR)."""
        captures = ", ".join(f"{k}=%{v}" for k, v in self.captures.items())
        return (f"<Graph: {len(self.nodes)} nodes, {len(self.inputs)} inputs, "
                f"{len(self.params)} params, {len(self.states)} states, outputs "
                f"{', '.join(f'%{i}' for i in self.outputs) or 'none'}"
                + (f", captures {captures}" if captures else "") + ">")

    def __str__(self) -> str:
        lines = [n.describe() for n in self.nodes]
        lines.append("outputs: " + ", ".join(f"%{i}" for i in self.outputs))
        if self.captures:
            lines.append("captures: " + ", ".join(f"{k}=%{v}" for k, v in self.captures.items()))
        return "\n".join(lines)


@dataclass(frozen=True)
class FusedProgram:
    """The nodes one `fused` kernel evaluates, in evaluation order (made by the fusion and
    stitching passes). A local node's inputs are local indices (>= 0) or external inputs
    encoded as -(k + 1) for input k of the fused node; the last node is the result.

    Every node is elementwise or a layout op (reshape, permute), except at most one *core*:
    an op with a kernel of its own (a matmul, a reduction) whose inputs the nodes before it
    compute on the fly (its prologues) and whose result the nodes after it transform as it
    is written (its epilogue)."""

    nodes: tuple[Node, ...]

    def core(self, is_core: Callable[[Node], bool]) -> int | None:
        """Local index of the node for which `is_core(node)` holds (None: none)."""
        found = [n.id for n in self.nodes if is_core(n)]
        if len(found) > 1:
            raise ValueError(f"a fused program has one core at most, got {len(found)}")
        return found[0] if found else None

    def __repr__(self) -> str:
        def show(ref: int) -> str:
            return f"x{-ref - 1}" if ref < 0 else show_node(self.nodes[ref])

        def show_node(n: Node) -> str:
            return f"{n.op}({', '.join(show(r) for r in n.inputs)})"
        return show_node(self.nodes[-1])

