"""Analysis of the traced graph: liveness, users, which Module calls can be written as
``self.child(...)`` (their traced body reads only their tensor arguments and own params), and
fused patterns (several nodes written as one torch call)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..tensor import PRNG_SEED_INPUT, Tensor
from .tracing import Call, Traced
from .tree import Info, build_tree, holds_any, param_chains, relative


@dataclass
class CallInfo:
    """A Module call and whether it can be written as `self.child(...)` (else `why` not)."""

    call: Call
    info: Info
    outs: list[int]
    tensor_args: list[tuple[str, int]]      # (param name, node id)
    valid: bool = True
    why: str = ""


class Analysis:
    """The traced forward and what the writer needs to know about it."""

    def __init__(self, tr: Traced, shapes: list[Any], attrs: list[Any], size_name: str | None,
                 forward_fn: Callable[..., Any], input_names: list[str]):
        self.tr, self.graph = tr, tr.graph
        self.shapes, self.attrs = shapes, attrs
        self.size_name = size_name
        self.forward_fn = forward_fn
        self.input_names = input_names
        self.root, self.infos = build_tree(tr.clone, tr.graph)
        self.param_chain = param_chains(self.root)
        g = self.graph
        self.input_ids = {n.attrs["name"]: n.id for n in g.nodes if n.op == "input"}
        self.seed_id = self.input_ids.pop(PRNG_SEED_INPUT, None)
        self.live = self._live([tr.out])
        self.users: list[list[int]] = [[] for _ in g.nodes]
        for n in g.nodes:
            if n.id in self.live:
                for i in n.inputs:
                    self.users[i].append(n.id)
        self.calls = [self._call_info(c) for c in tr.calls]
        self.fused: dict[int, tuple[str, list[int]]] = {}
        self.consumed: set[int] = set()
        self._find_patterns()

    def _live(self, roots: Sequence[int]) -> set[int]:
        live: set[int] = set()
        stack = list(roots)
        while stack:
            i = stack.pop()
            if i in live:
                continue
            live.add(i)
            stack.extend(self.graph[i].inputs)
        return live

    # -- module calls -----------------------------------------------------------------------
    def _call_info(self, c: Call) -> CallInfo:
        info = self.infos.get(id(c.module))
        ci = CallInfo(c, info, [], [])  # type: ignore[arg-type]

        def invalid(why: str) -> CallInfo:
            ci.valid, ci.why = False, why
            return ci

        if info is None:
            return invalid("module not in the tree")
        if info is self.root:
            return invalid("the root module")
        res = c.result
        if isinstance(res, Tensor):
            ci.outs = [res.id]
        elif isinstance(res, (tuple, list)) and res and all(isinstance(t, Tensor) for t in res):
            ci.outs = [t.id for t in res]
        else:
            return invalid("its result is not a tensor or a tuple of tensors")
        try:
            bound = inspect.signature(c.fn).bind(c.module, *c.args, **c.kwargs)
        except (TypeError, ValueError):
            return invalid("its arguments do not bind")
        params = list(inspect.signature(c.fn).parameters.values())[1:]
        for p in params:
            if p.name not in bound.arguments:
                continue
            v = bound.arguments[p.name]
            if isinstance(v, Tensor):
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    return invalid("tensors passed through *args/**kwargs")
                ci.tensor_args.append((p.name, v.id))
            elif holds_any(v, lambda x: isinstance(x, Tensor)):
                return invalid(f"argument '{p.name}' holds tensors inside a container")
        if not ci.tensor_args:
            return invalid("no tensor arguments")
        return ci

    def check_calls(self) -> None:
        """Mark calls whose traced body reads anything but its tensor args and own params."""
        g = self.graph
        for ci in self.calls:
            if not ci.valid:
                continue
            c = ci.call
            args = {i for _, i in ci.tensor_args}
            body = self._body_nodes(c.start, c.end, ci.outs, args)
            for n in body:
                for i in g[n].inputs:
                    if c.start <= i < c.end or i in args or i == self.seed_id:
                        continue
                    if g[i].op == "param" and relative(ci.info, self.param_chain[i]) is not None:
                        continue
                    ci.valid, ci.why = False, f"node %{n} reads %{i} from outside"
                    break
                if not ci.valid:
                    break
            if not ci.valid:
                continue
            outs = set(ci.outs)
            for n in range(c.start, c.end):
                if n in outs or n == self.seed_id or n not in self.live:
                    continue
                if any(not (c.start <= u < c.end) for u in self.users[n]) or n == self.tr.out:
                    ci.valid, ci.why = False, f"node %{n} is used outside the call"
                    break

    def _body_nodes(self, start: int, end: int, outs: Sequence[int], args: set[int]) -> set[int]:
        body: set[int] = set()
        stack = [o for o in outs if start <= o < end]
        while stack:
            i = stack.pop()
            if i in body or i in args:
                continue
            body.add(i)
            stack.extend(j for j in self.graph[i].inputs if start <= j < end)
        return body

    def contains(self, outer: CallInfo, inner: CallInfo) -> bool:
        a, b = outer.call, inner.call
        if a is b:
            return False
        if (a.start, a.end) == (b.start, b.end):
            return a.index > b.index
        return a.start <= b.start and b.end <= a.end

    # -- fused patterns ---------------------------------------------------------------------
    def _single(self, i: int) -> bool:
        return len(self.users[i]) == 1 and i != self.tr.out

    def _find_patterns(self) -> None:
        g = self.graph
        for n in g.nodes:
            if n.id not in self.live:
                continue
            if n.op == "exp" and g[n.inputs[0]].op == "log_softmax_last" \
                    and self._single(n.inputs[0]):
                lsm = g[n.inputs[0]]
                self.fused[n.id] = ("softmax", [lsm.inputs[0]])
                self.consumed.add(lsm.id)

