"""WGSL for fused programs: elementwise chains, and a core kernel with prologues/epilogue.

A program (:class:`tensorgrad.ir.FusedProgram`) is evaluated per element, in f32 (an f16
node's value rounded to f16, as a kernel of its own would store it): each node at a
flat index of its own shape, derived from its consumer's (right-aligned broadcasting, the
same index through a reshape, the source index through a permute), each external input read
at that index. Without a core the kernel is one thread per output element. With a core (a
matmul, a reduction), the core op's own kernel is emitted and then rewritten: a read
`in{s}[x]` of a computed input becomes `load_s(x)` (its prologue evaluated at x), and each
write `out[x] = y;` becomes `out[x] = epilogue(x, y);` (the nodes after the core, with the
core's value `acc` at index x). The op table tells which ops' kernels allow that (`Stitch`).

Code generation takes the op table as an argument (`ops`): it never imports the ops.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Protocol

from ..ir import DType, FusedProgram, Node, Shape
from . import wgsl as w
from .kernel import EmitContext, Kernel
from .storage import closing

LAYOUT_OPS = ("reshape", "permute")
_OPERAND = re.compile(r"\ba(\d+)\b")
_READ = re.compile(r"\bin(\d+)\[")
_WRITE = re.compile(r"\bout\[")
_ASSIGN = re.compile(r"\s*=(?!=)\s*")


class ProgramOp(Protocol):
    """An op-table entry as program emission sees it."""

    @property
    def expr(self) -> Callable[[Node], str] | None: ...

    @property
    def prelude(self) -> str: ...

    @property
    def emit(self) -> Callable[[EmitContext], Kernel] | None: ...


def is_core(node: Node, ops: Mapping[str, ProgramOp]) -> bool:
    """True for a program node that is neither elementwise nor a layout op."""
    return node.op not in LAYOUT_OPS and ops[node.op].expr is None


class _Writer:
    """Emits `let` lines for values of one program at symbolic flat indices (memoised per
    (node, index), so shared subexpressions are computed once)."""

    def __init__(self, program: FusedProgram, ops: Mapping[str, ProgramOp],
                 external_shape: Callable[[int], Shape], core: int | None = None) -> None:
        self.program, self.ops, self.external_shape, self.core = program, ops, external_shape, core
        self.lines: list[str] = []
        self.preludes: list[str] = []
        self._names: dict[tuple[int, str], str] = {}
        self._indices: dict[str, str] = {}

    def shape(self, ref: int) -> Shape:
        return self.external_shape(-ref - 1) if ref < 0 else self.program.nodes[ref].shape

    def index(self, expr: str) -> str:
        """A name for an index expression (bound once, so that nested index math keeps its
        precedence)."""
        if re.fullmatch(r"\w+", expr):
            return expr
        if expr not in self._indices:
            name = f"j{len(self._indices)}"
            self.lines.append(f"  let {name} = {expr};")
            self._indices[expr] = name
        return self._indices[expr]

    def value(self, ref: int, index: str) -> str:
        key = (ref, index)
        if key in self._names:
            return self._names[key]
        if ref < 0:
            text = f"in{-ref - 1}[{index}]"
        elif ref == self.core:
            if index != "i":
                raise ValueError("an epilogue reads its core at the output index only")
            if self.program.nodes[ref].dtype != "f16":
                return "acc"
            text = "acc"  # rounded below, as the unstitched core would store it
        else:
            n = self.program.nodes[ref]
            if n.op == "reshape":
                self._names[key] = self.value(n.inputs[0], index)
                return self._names[key]
            if n.op == "permute":
                src = w.strides(self.shape(n.inputs[0]))
                moved = w.decompose(index, n.shape, [src[p] for p in n.attrs["perm"]])
                self._names[key] = self.value(n.inputs[0], self.index(moved))
                return self._names[key]
            operands = [self.value(r, self.index(w.broadcast_index(n.shape, self.shape(r), index)))
                        for r in n.inputs]
            op = self.ops[n.op]
            assert op.expr is not None
            own = w.OWN_INDEX.sub(index, op.expr(n))
            text = _OPERAND.sub(lambda m: operands[int(m.group(1))], own)
            if op.prelude and op.prelude not in self.preludes:
                self.preludes.append(op.prelude)
        if ref >= 0 and self.program.nodes[ref].dtype == "f16":
            text = f"f32(f16({text}))"  # an f16 node holds f16 values (see codegen/storage.py)
        name = f"v{len(self._names)}"
        self.lines.append(f"  let {name} = {text};")
        self._names[key] = name
        return name


def emit_program(ctx: EmitContext, program: FusedProgram, ops: Mapping[str, ProgramOp]
                 ) -> Kernel:
    """The kernel of a `fused` node (ctx.inputs are its external inputs)."""
    core = program.core(lambda n: is_core(n, ops))
    if core is not None:
        return _emit_stitched(ctx, program, core, ops)
    writer = _Writer(program, ops, lambda k: ctx.inputs[k].shape)
    result = writer.value(len(program.nodes) - 1, "i")
    body = "\n".join([*writer.lines, f"  out[i] = {result};"])
    return w.thread_kernel(ctx, body, prelude="\n".join(writer.preludes))


def _emit_stitched(ctx: EmitContext, program: FusedProgram, core: int,
                   ops: Mapping[str, ProgramOp]) -> Kernel:
    cnode = program.nodes[core]

    def shape_of(ref: int) -> Shape:
        return ctx.inputs[-ref - 1].shape if ref < 0 else program.nodes[ref].shape

    def dtype_of(ref: int) -> DType:
        return ctx.inputs[-ref - 1].dtype if ref < 0 else program.nodes[ref].dtype

    emit = ops[cnode.op].emit
    assert emit is not None
    swapped = frozenset(s for s, ref in enumerate(cnode.inputs)
                        if contiguous_axis(program, ref, lambda k: ctx.inputs[k].shape) == -2)
    inner = emit(EmitContext(
        Node(ctx.node.id, cnode.op, (), cnode.attrs, cnode.shape, cnode.dtype),
        tuple(Node(-1, "input", (), {}, shape_of(r), dtype_of(r)) for r in cnode.inputs),
        ctx.target, swapped))
    text = "\n".join(line for line in inner.wgsl.splitlines()
                     if not line.startswith("@group(0) @binding("))
    functions: list[str] = []
    preludes: list[str] = []
    slots: dict[int, str] = {}
    vectors = _vector_bindings(program, core, inner.vector_inputs)
    for s, ref in enumerate(cnode.inputs):
        if ref < 0 and (s not in inner.vector_inputs or -ref - 1 in vectors):
            slots[s] = f"in{-ref - 1}["
            continue
        writer = _Writer(program, ops, lambda k: ctx.inputs[k].shape)
        if s in inner.vector_inputs:  # the core reads vec4 q: elements 4 q .. 4 q + 3
            lanes = [writer.value(ref, writer.index(f"i + {j}u") if j else "i")
                     for j in range(4)]
            functions.append(_function(f"load_{s}", "q: u32", "f32", writer,
                                       f"vec4<f32>({', '.join(lanes)})", vector=True))
        else:
            result = writer.value(ref, "i")
            functions.append(_function(f"load_{s}", "i: u32", dtype_of(ref), writer, result))
        preludes += writer.preludes
        slots[s] = f"load_{s}("
    text = _rewrite_reads(text, slots)
    if core != len(program.nodes) - 1:
        writer = _Writer(program, ops, lambda k: ctx.inputs[k].shape, core=core)
        result = writer.value(len(program.nodes) - 1, "i")
        functions.append(_function("epilogue", f"i: u32, acc: {w.wgsl_type(cnode.dtype)}",
                                   ctx.node.dtype, writer, result))
        preludes += writer.preludes
        text = _rewrite_writes(text, cnode.op)
    shared = [p for p in dict.fromkeys(preludes) if p not in text]
    wgsl = "\n".join([w.bindings(ctx.inputs, ctx.node, vectors), *shared, *functions, text])
    return Kernel(wgsl, inner.threads, inner.workgroup_size, vector_inputs=vectors,
                  quick_refused=inner.quick_refused)


def contiguous_axis(program: FusedProgram, ref: int, external_shape: Callable[[int], Shape]
                    ) -> int | None:
    """Which trailing axis of value `ref` (-1 or -2) steps by one element in the storage it
    is read from, following reshapes, permutes and elementwise ops of one full-size operand
    back to an external input (from the value's first elements); None for anything else
    (an external input itself reads its last axis contiguously: -1)."""
    def shape(r: int) -> Shape:
        return external_shape(-r - 1) if r < 0 else program.nodes[r].shape

    def source(flat: int) -> int | None:
        r = ref
        while r >= 0:
            n = program.nodes[r]
            if n.op == "permute":
                src = w.strides(shape(n.inputs[0]))
                weights = [src[p] for p in n.attrs["perm"]]
                moved = 0
                for dim, weight in zip(reversed(n.shape), reversed(weights)):
                    flat, i = divmod(flat, dim)
                    moved += i * weight
                flat = moved
            elif n.op != "reshape":
                full = [x for x in n.inputs if shape(x) == n.shape]
                if len(full) != 1:
                    return None
                r = full[0]
                continue
            r = n.inputs[0]
        return flat

    dims = shape(ref)
    if len(dims) < 2 or (first := source(0)) is None:
        return None
    if dims[-1] > 1 and source(1) == first + 1:
        return -1
    if dims[-2] > 1 and source(dims[-1]) == first + 1:
        return -2
    return None


def _vector_bindings(program: FusedProgram, core: int, slots: frozenset[int]) -> frozenset[int]:
    """The external inputs to bind as vec4 arrays: those the core reads as vec4s at `slots`
    and that nothing else in the program reads (a scalar read needs a scalar binding; such
    an input's vec4s are then gathered from scalars by its load function)."""
    cnode = program.nodes[core]
    candidates = {-cnode.inputs[s] - 1 for s in slots if cnode.inputs[s] < 0}
    for k, node in enumerate(program.nodes):
        for s, ref in enumerate(node.inputs):
            if ref < 0 and not (k == core and s in slots):
                candidates.discard(-ref - 1)
    return frozenset(candidates)


def _function(name: str, params: str, dtype: DType, writer: _Writer, result: str,
              vector: bool = False) -> str:
    body = "\n".join(writer.lines)
    if vector:  # `q` indexes vec4s: `i` is the first element's flat index
        body = f"  let i = q * 4u;\n{body}"
    kind = "vec4<f32>" if vector else w.wgsl_type(dtype)
    return f"fn {name}({params}) -> {kind} {{\n{body}\n  return {result};\n}}"


def _rewrite_reads(text: str, slots: Mapping[int, str]) -> str:
    """`in{s}[x]` -> `{slots[s]}x]` (another input) or `load_s(x)` (a prologue)."""
    out: list[str] = []
    pos = 0
    while (m := _READ.search(text, pos)) is not None:
        end = closing(text, m.end())
        inner = _rewrite_reads(text[m.end():end], slots)
        opening = slots[int(m.group(1))]
        out += [text[pos:m.start()], opening, inner, "]" if opening.endswith("[") else ")"]
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


def _rewrite_writes(text: str, op: str) -> str:
    """Each `out[x] = y;` -> `out[x] = epilogue(x, y);`."""
    out: list[str] = []
    pos = 0
    while (m := _WRITE.search(text, pos)) is not None:
        end = closing(text, m.end())
        index = text[m.end():end]
        assign = _ASSIGN.match(text, end + 1)
        semi = text.find(";", end + 1)
        if assign is None or semi < 0:
            raise ValueError(f"the '{op}' kernel reads `out` (it cannot take an epilogue)")
        value = text[assign.end():semi]
        out += [text[pos:m.start()], f"out[{index}] = epilogue({index}, {value});"]
        pos = semi + 1
    out.append(text[pos:])
    return "".join(out)


def program_reads(program: FusedProgram, external_shape: Callable[[int], Shape]
                  ) -> dict[int, set[bool]]:
    """For each external input k: whether each read of it is at the output index itself
    (True) or elsewhere (False). A core can take an elementwise consumer as its epilogue only
    where every read of it is at the output index."""
    reads: dict[int, set[bool]] = {}
    seen: set[tuple[int, bool]] = set()

    def shape(ref: int) -> Shape:
        return external_shape(-ref - 1) if ref < 0 else program.nodes[ref].shape

    def walk(ref: int, identity: bool) -> None:
        if (ref, identity) in seen:
            return
        seen.add((ref, identity))
        if ref < 0:
            reads.setdefault(-ref - 1, set()).add(identity)
            return
        n = program.nodes[ref]
        for r in n.inputs:
            same = n.op == "reshape" or (n.op != "permute" and shape(r) == n.shape)
            walk(r, identity and same)

    walk(len(program.nodes) - 1, True)
    return reads


def count_arithmetic(program: FusedProgram) -> int:
    """Nodes that compute (not layout or broadcast)."""
    return sum(1 for n in program.nodes if n.op not in (*LAYOUT_OPS, "broadcast_to"))


__all__ = ["LAYOUT_OPS", "ProgramOp", "count_arithmetic", "emit_program", "is_core",
           "program_reads"]
