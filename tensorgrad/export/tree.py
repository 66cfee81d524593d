"""The module tree of the traced model: each Module instance, its params and children (lists
become ``nn.ModuleList``, dicts ``nn.ModuleDict``) and its int/float/str attributes (the
candidates for constructor arguments), with the access path from the root."""

from __future__ import annotations

import keyword
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir import Graph, Node
from ..module import Module
from ..tensor import Tensor
from .errors import ExportError

# Names an exported attribute cannot take: nn.Module's own.
RESERVED_ATTRS = {"training", "forward", "reset_parameters", "parameters", "state_dict",
                  "modules", "children", "train", "eval", "to", "cuda", "cpu", "float"}


@dataclass
class Param:
    name: str          # full dotted name
    node: Node         # the param leaf


@dataclass
class Container:
    kind: str                           # "list" | "dict"
    items: list[tuple[str, Any]]        # (key, Info | Param | Container)


@dataclass
class Info:
    """One Module instance of the (traced clone's) tree."""

    obj: Module
    path: str
    chain: tuple[tuple[str, str], ...]      # access steps from the root: ("attr"|"index"|"key", k)
    params: list[tuple[str, Param]] = field(default_factory=list)      # own, by attribute
    children: list[tuple[str, Any]] = field(default_factory=list)      # attr -> Info | Container
    config: dict[str, Any] = field(default_factory=dict)
    group: Any = None


def _config_value(v: Any) -> bool:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return True
    return isinstance(v, tuple) and all(isinstance(x, (int, float, bool, str)) for x in v)


def holds_any(v: Any, leaf: Callable[[Any], bool]) -> bool:
    """Whether `v`, or something in its lists, tuples and dict values, is a `leaf`."""
    if leaf(v):
        return True
    if isinstance(v, (list, tuple)):
        return any(holds_any(x, leaf) for x in v)
    if isinstance(v, dict):
        return any(holds_any(x, leaf) for x in v.values())
    return False


def _attr_name(key: str) -> bool:
    """Whether `key` can be an attribute of the exported nn.Module."""
    return key.isidentifier() and not keyword.iskeyword(key) and key not in RESERVED_ATTRS


class _TreeBuilder:
    """Walks a Module's attributes; each Module and param is kept under its first name."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.by_id: dict[int, Info] = {}
        self.seen_params: set[int] = set()

    def param_of(self, v: Any) -> Param | None:
        g = self.graph
        if isinstance(v, Tensor) and v.graph is g and g[v.id].op == "param":
            return Param(g[v.id].attrs["name"], g[v.id])
        return None

    def holds(self, v: Any) -> bool:
        return holds_any(v, lambda x: isinstance(x, Module) or self.param_of(x) is not None)

    def item(self, v: Any, path: str, chain: tuple[Any, ...]) -> Any:
        p = self.param_of(v)
        if p is not None:
            if p.node.id in self.seen_params:
                return None
            self.seen_params.add(p.node.id)
            return p
        if isinstance(v, Module):
            if id(v) in self.by_id:
                return None  # reached twice (tied): kept under its first name
            return self.module(v, path, chain)
        if isinstance(v, (list, tuple, dict)):
            return self.container(v, path, chain)
        return None

    def container(self, v: Any, path: str, chain: tuple[Any, ...]) -> Container:
        pairs = list(v.items()) if isinstance(v, dict) else list(enumerate(v))
        items = []
        for k, x in pairs:
            if not self.holds(x):
                if x is None or not isinstance(v, dict):
                    raise ExportError(f"'{path}' mixes modules/params with other values "
                                      f"({type(x).__name__} at {k!r}); torch's "
                                      "ModuleList/ModuleDict cannot hold them")
                continue
            key = str(k)
            if "." in key or not key:
                raise ExportError(f"dict key {key!r} of '{path}' cannot be a torch "
                                  "module name")
            step = ("key", key) if isinstance(v, dict) else ("index", key)
            sub = self.item(x, f"{path}.{key}", (*chain, step))
            if sub is not None:
                items.append((key, sub))
        if len({type(s) for _, s in items}) > 1:
            raise ExportError(f"'{path}' mixes modules and params in one container")
        return Container("dict" if isinstance(v, dict) else "list", items)

    def module(self, obj: Module, path: str, chain: tuple[Any, ...]) -> Info:
        info = Info(obj, path, chain)
        self.by_id[id(obj)] = info
        for key, v in vars(obj).items():
            sub_path = f"{path}.{key}" if path else key
            if self.holds(v):
                if not _attr_name(key):
                    raise ExportError(f"attribute '{sub_path}' cannot be a torch module "
                                      "attribute name")
                sub = self.item(v, sub_path, (*chain, ("attr", key)))
                if isinstance(sub, Param):
                    info.params.append((key, sub))
                elif sub is not None:
                    info.children.append((key, sub))
            elif _config_value(v) and _attr_name(key) and not key.startswith("_"):
                info.config[key] = v
        return info


def build_tree(clone: Module, graph: Graph) -> tuple[Info, dict[int, Info]]:
    """The tree below `clone` (the traced model) and its Infos by id of their Module."""
    builder = _TreeBuilder(graph)
    return builder.module(clone, "", ()), builder.by_id


def _access(chain: Sequence[tuple[str, str]]) -> str:
    text = "self"
    for kind, key in chain:
        text += f".{key}" if kind == "attr" else (f"[{key}]" if kind == "index" else
                                                   f"[{key!r}]")
    return text


def relative(owner: Info, chain: tuple[Any, ...]) -> str | None:
    """`self...` from `owner` to the object at `chain`, or None when it is not below it."""
    n = len(owner.chain)
    if chain[:n] != owner.chain:
        return None
    return _access(chain[n:])


def param_chains(root: Info) -> dict[int, tuple[Any, ...]]:
    """The access chain of every param leaf of the tree, by node id."""
    out: dict[int, tuple[Any, ...]] = {}

    def visit(obj: Any, chain: tuple[Any, ...]) -> None:
        if isinstance(obj, Param):
            out[obj.node.id] = chain
        elif isinstance(obj, Info):
            for key, p in obj.params:
                out[p.node.id] = (*obj.chain, ("attr", key))
            for key, c in obj.children:
                visit(c, (*obj.chain, ("attr", key)))
        elif isinstance(obj, Container):
            for key, c in obj.items:
                step = ("key", key) if obj.kind == "dict" else ("index", key)
                visit(c, (*chain, step))

    visit(root, root.chain)
    return out


def modules_in(c: Any) -> list[Info]:
    """The Infos in a child slot (an Info, or those inside a Container, in order)."""
    if isinstance(c, Info):
        return [c]
    if isinstance(c, Container):
        out: list[Info] = []
        for _, x in c.items:
            out += modules_in(x)
        return out
    return []
