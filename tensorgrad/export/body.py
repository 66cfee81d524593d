"""Writing one forward's body: the nodes of a region in order, each through its op's
translation (``OpDef.torch``), calls of extracted modules as ``self.child(...)``.

A value used once is inlined into its user while short; a line too long gives its longest
inlined operand a line of its own. Each value is named after the left-hand side of the
user's source line that made it (else after its op), and each group of lines carries that
source line as a comment.
"""

from __future__ import annotations

import inspect
import keyword
import linecache
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..codegen.torchexpr import Expr, TorchContext, TorchNode, method
from ..ir import Node
from ..ops.registry import GRAD_ERROR, OPS
from .analysis import Analysis, CallInfo
from .errors import ExportError
from .tree import Info, relative

INLINE_MAX = 72           # longest sub-expression inlined into its single user
LINE_MAX = 96             # longest expression kept on one line

# Fused patterns (several IR nodes, one torch call; found by Analysis): kind -> translation.
FUSED: dict[str, Callable[[list[Expr], TorchContext], Expr]] = {
    "softmax": lambda inputs, cx: method(inputs[0], "softmax(-1)"),
}

# The name a value gets after its op when its source line names none ("h" by default).
_OP_NAMES = {"matmul": "h", "matmul_batched": "h", "conv2d": "conv", "max_pool2d": "pool",
             "log_softmax_last": "logp", "softmax_causal_last": "attn", "reshape": "h",
             "one_hot": "hot", "argmax_last": "idx", "dropout": "h", "randn": "noise",
             "categorical_last": "sample", "concat": "h", "arange": "pos", "full": "c",
             "less": "mask", "greater": "mask", "gather_rows": "emb"}
_NAME_RESERVED = {"self", "torch", "nn", "F", "math", "super", "range", "len", "float", "int",
                  "tuple", "list", "dict", "print", "max", "min", "sum", "abs", "input"}
_LHS = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=[^=]")


def unsupported(node: Node) -> ExportError:
    """The error for a node that has no torch translation, saying why."""
    if node.op == "state":
        return ExportError(f"node %{node.id} is a 'state' leaf ('{node.attrs.get('name')}'): "
                           "optimizer state is not part of a forward and has no torch "
                           "translation", op="state")
    opdef = OPS.get(node.op)
    if opdef is not None and opdef.vjp == GRAD_ERROR:
        return ExportError(f"op '{node.op}' (node %{node.id}, {node.dtype}"
                           f"{list(node.shape)}) is a backward/optimizer op: it appears in "
                           "training graphs, not in a forward, and has no torch translation "
                           "(torch derives gradients and runs the optimizer itself); export the "
                           "forward (tg.export.torch(model, forward=..., inputs=...))",
                           op=node.op)
    return ExportError(f"op '{node.op}' (node %{node.id}) has no torch translation",
                       op=node.op)


def translate_node(node: Node, args: list[Expr], ctx: TorchContext,
                   shape: Sequence[Any] | None = None,
                   attrs: Mapping[str, Any] | None = None) -> Expr:
    """The torch expression of one node from its operands' expressions, by its op's
    translation (or ExportError). `shape` and `attrs` replace the node's own (with Syms)."""
    opdef = OPS.get(node.op)
    if opdef is None or opdef.torch is None:
        raise unsupported(node)
    view = TorchNode(node.op, node.dtype, node.shape if shape is None else shape,
                     dict(node.attrs if attrs is None else attrs))
    return opdef.torch(view, args, ctx)


def source_range(fn: Any) -> list[tuple[str, int, int]]:
    """(file, first line, last line) of a function's source, or [] where there is none."""
    fn = getattr(fn, "__wrapped__", fn)
    try:
        lines, start = inspect.getsourcelines(fn)
        fname = inspect.getsourcefile(fn) or inspect.getfile(fn)
    except (OSError, TypeError):
        return []
    return [(fname, start, start + len(lines) - 1)]


@dataclass
class _Item:
    pos: int
    node: int | None = None
    call: CallInfo | None = None


class Body:
    """Lines of one forward: the nodes of a region, with extracted calls as `self.x(...)`."""

    def __init__(self, an: Analysis, owner: Info, outs: list[int], arg_names: dict[int, str],
                 children: list[CallInfo], sources: list[tuple[str, int, int]]):
        self.an, self.owner = an, owner
        self.outs, self.arg_names, self.children = outs, arg_names, children
        self.sources = sources
        self.taken: set[str] = set(_NAME_RESERVED) | set(arg_names.values())
        if an.size_name:
            self.taken.add(an.size_name)

    def lines(self, ctx: TorchContext) -> list[str]:
        """The body's lines (ending with `return ...`); `ctx` records sizes and helpers."""
        order, params_used = self._collect()
        self._start(ctx, order, params_used)
        for it in order:
            if it.call is not None:
                self._write_call(it.call)
            else:
                assert it.node is not None
                self._write_node(it.node)

        def build_return() -> Expr:
            return Expr(", ".join(self.exprs[o].text for o in self.outs))

        ret = self._spill(self.outs, build_return, LINE_MAX - 7)
        self.out.append(f"return {ret.text}")
        return self.out

    # -- what is written, in what order ----------------------------------------------------
    def _child_of(self, n: int) -> CallInfo | None:
        for ci in self.children:
            if ci.call.start <= n < ci.call.end:
                return ci
        return None

    def _inputs(self, n: int) -> list[int]:
        fused = self.an.fused.get(n)
        return list(fused[1]) if fused else list(self.an.graph[n].inputs)

    def _deps(self, it: _Item) -> list[int]:
        if it.node is not None:
            return self._inputs(it.node)
        assert it.call is not None
        return [t for _, t in it.call.tensor_args]

    def _collect(self) -> tuple[list[_Item], set[int]]:
        """The nodes and child calls the outputs need, in graph order, and the params read."""
        an, g = self.an, self.an.graph
        items: dict[Any, _Item] = {}
        params_used: set[int] = set()
        stack = list(self.outs)
        seen: set[int] = set()
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            if i in self.arg_names or i == an.seed_id:
                continue
            node = g[i]
            if node.op == "param":
                params_used.add(i)
                continue
            if node.op == "input":
                raise ExportError(f"input '{node.attrs['name']}' is read inside a module call "
                                  "it was not passed to")
            child = self._child_of(i)
            if child is None:
                items[i] = _Item(i, node=i)
                stack.extend(self._inputs(i))
            elif ("call", child.call.index) not in items:
                items[("call", child.call.index)] = _Item(child.call.start, call=child)
                stack.extend(t for _, t in child.tensor_args)
        return sorted(items.values(), key=lambda it: it.pos), params_used

    def _start(self, ctx: TorchContext, order: list[_Item], params_used: set[int]) -> None:
        """The writing state: uses of each value, the expressions of params and arguments."""
        an, g = self.an, self.an.graph
        self.ctx = ctx
        self.uses: dict[int, int] = {}
        for d in [d for it in order for d in self._deps(it)] + list(self.outs):
            self.uses[d] = self.uses.get(d, 0) + 1
        self.exprs: dict[int, Expr] = {}
        for i in params_used:
            ref = relative(self.owner, an.param_chain[i])
            if ref is None:
                raise ExportError(f"param '{g[i].attrs['name']}' is not below "
                                  f"'{self.owner.path or 'the root'}'")
            self.exprs[i] = Expr(ref)
        for i, name in self.arg_names.items():
            self.exprs[i] = Expr(name)
        if an.seed_id is not None:
            self.exprs[an.seed_id] = Expr("None")
        self.out: list[str] = []
        self.comment: str | None = None
        self.pending: dict[int, tuple[str, str | None]] = {}   # inlined value -> (name, comment)
        ctx.device_ref = self._device_ref()
        self.last_of_line: dict[str | None, int] = {}
        for it in order:
            if it.node is not None:
                self.last_of_line[self._site(g[it.node])[0]] = it.node

    def _device_ref(self) -> str:
        if self.arg_names:
            return next(iter(self.arg_names.values()))
        for key, _ in self.owner.params:
            return f"self.{key}"
        return "self"

    # -- writing ---------------------------------------------------------------------------
    def _emit(self, name: str, text: str, comment: str | None = None) -> None:
        if comment and comment != self.comment:
            self.out.append(f"# {comment}")
            self.comment = comment
        self.out.append(f"{name} = {text}")

    def _spill(self, ids: Sequence[int], build: Callable[[], Expr], width: int) -> Expr:
        """build(); while too long, give the longest inlined operand its own line."""
        expr = build()
        while len(expr.text) > width:
            cands = [i for i in dict.fromkeys(ids) if i in self.pending]
            if not cands:
                break
            i = max(cands, key=lambda j: len(self.exprs[j].text))
            base, comment = self.pending.pop(i)
            name = self._name(base)
            self._emit(name, self.exprs[i].text, comment)
            self.exprs[i] = Expr(name)
            expr = build()
        return expr

    def _bind(self, o: int, expr: Expr, base: str, comment: str | None) -> None:
        """Value `o` is `expr`: inlined into its single user while short, else a line."""
        self.exprs[o] = expr
        if self.uses.get(o, 0) == 1 and len(expr.text) <= INLINE_MAX:
            self.pending[o] = (base, comment)
            return
        name = self._name(base)
        self._emit(name, expr.text, comment)
        self.exprs[o] = Expr(name)

    def _write_call(self, ci: CallInfo) -> None:
        ref = relative(self.owner, ci.info.chain)
        assert ref is not None
        ids = [t for _, t in ci.tensor_args]

        def build() -> Expr:
            return Expr(f"{ref}({', '.join(self.exprs[t].text for t in ids)})")

        expr = self._spill(ids, build, LINE_MAX)
        chain = ci.info.chain
        base = chain[-1][1] if chain else "h"
        if not base.isidentifier():  # a list index: blocks.0 -> blocks0
            base = f"{chain[-2][1]}{base}" if len(chain) > 1 else "h"
        if len(ci.outs) == 1:
            self._bind(ci.outs[0], expr, base, None)
            return
        names = []
        for k, o in enumerate(ci.outs):
            names.append(self._name(f"{base}_{k}") if o in self.uses else "_")
            self.exprs[o] = Expr(names[-1])
        self.out.append(f"{', '.join(names)} = {expr.text}")

    def _write_node(self, n: int) -> None:
        an = self.an
        node = an.graph[n]
        fused = an.fused.get(n)
        ids = self._inputs(n)

        def build() -> Expr:
            args = [self.exprs[i] for i in ids]
            if fused:
                return FUSED[fused[0]](args, self.ctx)
            return translate_node(node, args, self.ctx, an.shapes[n], an.attrs[n])

        expr = self._spill(ids, build, LINE_MAX)
        comment, lhs = self._site(node)
        if lhs and self.last_of_line.get(comment) != n:
            lhs = None  # the line's name belongs to its last value
        if expr.scalar is not None:
            self.exprs[n] = expr
            return
        self._bind(n, expr, lhs or _OP_NAMES.get(node.op, "h"), comment)

    def _name(self, base: str) -> str:
        base = re.sub(r"\W", "_", base) or "h"
        if base[0].isdigit():
            base = f"h{base}"
        name, k = base, 1
        while name in self.taken or keyword.iskeyword(name):
            name = f"{base}_{k}"
            k += 1
        self.taken.add(name)
        return name

    def _site(self, node: Node) -> tuple[str | None, str | None]:
        """The user's source line of `node` inside this function's source, and its LHS."""
        for frame in node.site.splitlines():
            m = re.match(r"(.*):(\d+) in (.*)$", frame)
            if not m:
                continue
            fname, line = m[1], int(m[2])
            for src, lo, hi in self.sources:
                if src == fname and lo <= line <= hi:
                    text = linecache.getline(fname, line).strip()
                    if not text:
                        return None, None
                    lhs = _LHS.match(text)
                    return text, (lhs[1] if lhs and lhs[1] != "self" else None)
        return None, None
