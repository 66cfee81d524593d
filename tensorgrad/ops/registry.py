"""The op table: every primitive op kind defined once, with everything about it.

An :class:`OpDef` carries the shape/dtype rule, the backward rule (written in forward ops),
the reference semantics (NumPy) and the WGSL kernel emitter. Public op functions (what users
call, e.g. `tg.gelu`) are registered with :func:`public` and compose primitives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from ..codegen.kernel import EmitContext, Kernel
    from ..ir import Node, Shape
    from ..tensor import Tensor


# infer(inputs, attrs) -> (shape, dtype); raises ShapeError on bad input.
InferFn = Callable[[Sequence["Node"], dict[str, Any]], tuple["Shape", str]]
# ref(values, node) -> value, with numpy arrays; float inputs may be float32 or float64.
RefFn = Callable[[Sequence[Any], "Node"], Any]
# vjp(inputs, out, dy, attrs) -> one cotangent Tensor (or None) per input.
VjpFn = Callable[[Sequence["Tensor"], "Tensor", "Tensor", dict[str, Any]],
                 Sequence["Tensor | None"]]
EmitFn = Callable[["EmitContext"], "Kernel"]

NO_GRAD = "no_grad"          # the op contributes no gradient (argmax, comparisons, ...)
GRAD_ERROR = "grad_error"    # differentiating through it is an error (backward/optimizer ops)


@dataclass(frozen=True)
class OpDef:
    """Everything about one primitive op kind."""

    name: str
    infer: InferFn
    ref: RefFn
    vjp: VjpFn | str
    emit: EmitFn | None
    doc: str = ""


OPS: dict[str, OpDef] = {}
PUBLIC: dict[str, Callable[..., Any]] = {}


def define(name: str, *, infer: InferFn, ref: RefFn, vjp: VjpFn | str,
           emit: EmitFn | None, doc: str = "") -> OpDef:
    """Add a primitive to the op table (each name once)."""
    if name in OPS:
        raise ValueError(f"op '{name}' is defined twice")
    op = OpDef(name, infer, ref, vjp, emit, doc)
    OPS[name] = op
    return op


def public(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register a user-facing op function under its own name."""
    PUBLIC[fn.__name__] = fn
    return fn
