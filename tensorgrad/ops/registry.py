"""The op table: every primitive op kind defined once, with everything about it.

An :class:`OpDef` carries the shape/dtype rule, the backward rule (written in forward ops),
the reference semantics (NumPy), the WGSL kernel emitter and the PyTorch translation (what
``tg.export.torch`` writes for the op). Public op functions (what users call, e.g.
`tg.gelu`) are registered with :func:`public` and compose primitives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..codegen.kernel import EmitContext, Kernel
from ..codegen.torchexpr import TorchFn
from ..codegen.wgsl import elementwise
from ..errors import ShapeError, TraceError, user_call_site
from ..ir import Attrs, DType, Node, Shape
from ..tensor import Tensor, current_trace

# infer(inputs, attrs) -> (shape, dtype); raises ShapeError on bad input.
InferFn = Callable[[Sequence[Node], Attrs], tuple[Shape, DType]]
# ref(values, node) -> value, with numpy arrays; float inputs may be float32 or float64.
RefFn = Callable[[Sequence[Any], Node], Any]
# vjp(inputs, out, dy, attrs) -> one cotangent Tensor (or None) per input, at that input's
# shape or at a broadcast of it (the output's shape): autograd sums it back to the input's.
VjpFn = Callable[[Sequence[Tensor], Tensor, Tensor, Attrs], Sequence[Tensor | None]]
EmitFn = Callable[[EmitContext], Kernel]
# view(node, input) -> the byte offset at which the node's output lies in input 0's bytes, or
# None when, for these shapes, it does not (then the op's kernel runs).
ViewFn = Callable[[Node, Node], int | None]
# expr(node) -> WGSL expression of one output element in terms of a0, a1, ... (the inputs
# read at the same, broadcast, index) and `ix`, the element's flat index (u32) in the node's
# shape. Ops with an expr are elementwise and fusable.
ExprFn = Callable[[Node], str]
# zeros(node, inputs, zeros of the inputs) -> which triangle of the node's last two axes is
# exactly zero ("above", "below") or None; see rules.TRIANGLES. Ops without one give None.
ZerosFn = Callable[[Node, Sequence[Node], Sequence[str | None]], str | None]

NO_GRAD = "no_grad"          # the op contributes no gradient (argmax, comparisons, ...)
# Differentiating through it is an error: backward and optimizer ops, and ops a pass makes.
# They are made after the trace (by autograd, the optimizer or a pass), so they never appear
# in a traced forward, which is all that tg.export.torch writes: they have no `torch`.
GRAD_ERROR = "grad_error"


@dataclass(frozen=True)
class Stitch:
    """How the stitching pass may merge elementwise work into an op's kernel.

    `prologue`: input slots that the kernel reads only as `in{slot}[index]`, so a producer's
    elementwise program can be evaluated at each read instead of being stored; `prologue_ops`
    caps the arithmetic nodes of such a program (a kernel that reads each element many times,
    a matmul, recomputes it at every read; None: no cap). `epilogue`: the kernel writes each
    output element once, as `out[index] = value;`, and never reads `out`, so an elementwise
    consumer can be applied to the value as it is written. `software_permutes`: False where
    a permute read through a prologue costs a software target (lavapipe, SwiftShader) more
    than a kernel of its own that stores the permuted tensor: the index arithmetic of every
    read (a plain matmul's register blocks read each element N / bn times)."""

    prologue: tuple[int, ...] = ()
    prologue_ops: int | None = None
    epilogue: bool = False
    software_permutes: bool = True


@dataclass(frozen=True)
class OpDef:
    """Everything about one primitive op kind."""

    name: str
    infer: InferFn
    ref: RefFn
    vjp: VjpFn | str
    emit: EmitFn | None
    doc: str = ""
    expr: ExprFn | None = None
    prelude: str = ""  # WGSL helper functions the expr needs
    # Layout ops run no kernel where the buffer plan can arrange the bytes instead. A view
    # (reshape, a contiguous slice) reads input 0's buffer at the offset `view` gives; a pack
    # places each input in its output's buffer at `attrs["offsets"]`. Where the plan cannot
    # (the output needs a buffer of its own: a gradient, an output, a capture), `emit` runs.
    view: ViewFn | None = None
    pack: bool = False
    stitch: Stitch | None = None
    zeros: ZerosFn | None = None
    # The PyTorch translation (see codegen/torchexpr.py): every op a traced forward can hold
    # has one (tests/unit/test_op_table.py checks it); GRAD_ERROR ops have none.
    torch: TorchFn | None = None


OPS: dict[str, OpDef] = {}
PUBLIC: dict[str, Callable[..., Any]] = {}


def define(name: str, *, infer: InferFn, ref: RefFn, vjp: VjpFn | str,
           emit: EmitFn | None = None, doc: str = "", expr: ExprFn | None = None,
           prelude: str = "", view: ViewFn | None = None, pack: bool = False,
           stitch: Stitch | None = None, zeros: ZerosFn | None = None,
           torch: TorchFn | None = None) -> OpDef:
    """Add a primitive to the op table (each name once). An elementwise op gives `expr`
    instead of `emit`: its kernel is derived, and the fusion pass can inline it. `torch`
    writes the op as PyTorch source (every op but GRAD_ERROR ones needs one; checked by
    tests/unit/test_op_table.py)."""
    if name in OPS:
        raise ValueError(f"op '{name}' is defined twice")
    if emit is None and expr is not None:
        def emit(ctx: EmitContext) -> Kernel:
            return elementwise(ctx, expr(ctx.node), prelude=prelude)
    op = OpDef(name, infer, ref, vjp, emit, doc, expr, prelude, view, pack, stitch, zeros,
               torch)
    OPS[name] = op
    return op


def record(op: str, inputs: Sequence[Tensor], **attrs: Any) -> Tensor:
    """Append one `op` node to the trace in progress, checking shapes and dtypes with the
    op's rule; returns its tensor."""
    state = current_trace(op)
    for t in inputs:
        if not isinstance(t, Tensor):
            raise ShapeError(op, f"expected a Tensor input, got {type(t).__name__}")
        if t.graph is not state.graph:
            raise TraceError(f"'{op}' got a tensor from another trace (tensors do not outlive "
                             "the trace that made them)")
    nodes = [state.graph[t.id] for t in inputs]
    shape, dtype = OPS[op].infer(nodes, attrs)
    node = state.graph.add(op, tuple(t.id for t in inputs), attrs, shape, dtype, user_call_site())
    return Tensor(state.graph, node.id)


OpFunction = TypeVar("OpFunction", bound=Callable[..., Any])


def public(fn: OpFunction) -> OpFunction:
    """Register a user-facing op function under its own name (its signature unchanged)."""
    PUBLIC[fn.__name__] = fn
    return fn
