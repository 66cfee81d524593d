"""Export a tensorgrad model to PyTorch: a plain ``nn.Module`` source file plus its weights.

    ex = tg.export.torch(MLP(), inputs={"x": (None, 1)}, path="mlp_torch.py")
    ex = await tg.export.torch(train, inputs={"x": (None, 1)}, path="mlp_torch.py")

The first form exports a Module with its seeded init (``seed``) or the given ``params``; the
second downloads a training or forward handle's current weights (so it is awaited). Both
write ``path`` (the source) and ``path`` with the suffix ``.safetensors`` (the weights,
loadable with ``safetensors.torch.load_file``) and return a :class:`TorchExport`; with
``path=None`` nothing is written and the export holds the source text and the weight bytes
(this is what runs in the browser, where neither torch nor numpy is needed).

What is written:

* one ``nn.Module`` class per tensorgrad Module class of the tree (a class whose instances
  differ in structure or forward code gets variants ``Name_2``, ...), its params as
  ``nn.Parameter`` under the same dotted names (lists become ``nn.ModuleList``, dicts
  ``nn.ModuleDict``), constructor arguments taken from the instance's int attributes where
  they give the param shapes (``Linear(in_features=1, out_features=64)``), and a
  ``reset_parameters`` that follows the tensorgrad init specs (same distributions, not the
  same random stream);
* each module's ``forward`` written from the traced IR, one line per node or per inlined
  expression, with the user's source line as a comment. A call of a submodule becomes
  ``self.child(...)`` when its traced body only reads its tensor arguments and its own
  params; otherwise it is inlined into the caller.

Shapes. The IR is traced at fixed shapes. A dim declared ``None`` in ``inputs`` (one per
input, the same value for all, as for ``train.attach``) is traced at three probe sizes; every
shape and op argument that changes with it must be ``a * N + c`` (integers), and is written
as an expression of that size read from the input (``B = x.shape[0]``), so the exported
forward accepts any size there. Every other dim stays what was traced.

Semantics. Every forward-reachable op of the op table (:func:`forward_ops`) has a
translation; backward and optimizer ops raise :class:`ExportError`. Differences, all within
float tolerance or of measure zero: ``erf`` is exact in torch (tensorgrad uses a 1.5e-7
approximation); ``abs`` and ``maximum``/``minimum`` give the torch gradient at exact ties;
``dropout``, ``randn`` and ``categorical`` draw from torch's generator (same distributions;
dropout follows ``module.train()`` / ``eval()``).
"""

from __future__ import annotations

import inspect
import keyword
import linecache
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ShapeError
from ..ir import Graph, Node
from ..module import Module
from ..ops.registry import GRAD_ERROR, OPS
from ..tensor import PRNG_SEED_INPUT, Tensor, current_trace

__all__ = ["ExportError", "TorchExport", "export_torch", "forward_ops", "translatable_ops"]

PROBES = (3, 5, 7)        # sizes a None dim is traced at (two to fit a * N + c, one to check)
INLINE_MAX = 72           # longest sub-expression inlined into its single user
LINE_MAX = 96             # longest expression kept on one line


class ExportError(ValueError):
    """Something the exporter cannot write: names the op (``op``) and what is unsupported."""

    def __init__(self, message: str, op: str | None = None):
        self.op = op
        super().__init__(f"export.torch: {message}")


# =============================================================================================
# Public entry point
# =============================================================================================

@dataclass
class TorchExport:
    """An exported model: the PyTorch source, the safetensors weights and what they hold."""

    source: str
    weights: bytes
    class_name: str
    inputs: dict[str, tuple[tuple[int | str, ...], str]]   # name -> (shape, dtype); str = N
    output_shape: tuple[int | str, ...]
    output_dtype: str
    param_names: list[str]
    size_name: str | None = None       # the name of the None dim in the source (e.g. "B")
    path: Path | None = None
    weights_path: Path | None = None

    def save(self, path: str | Path, weights_path: str | Path | None = None) -> TorchExport:
        """Write the source to `path` and the weights beside it (suffix ``.safetensors``)."""
        self.path = Path(path)
        self.weights_path = (Path(weights_path) if weights_path is not None
                             else self.path.with_suffix(".safetensors"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.source)
        self.weights_path.write_bytes(self.weights)
        return self

    def load(self) -> Any:
        """The exported class instantiated with the weights loaded (needs torch)."""
        import importlib.util
        import sys
        import tempfile

        from safetensors.torch import load as load_bytes

        path = self.path
        if path is None:
            path = Path(tempfile.mkdtemp(prefix="tg_export_")) / "exported_model.py"
            path.write_text(self.source)
        name = f"tg_export_{path.stem}_{abs(hash(self.source)) % 10**8}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        model = getattr(module, self.class_name)()
        model.load_state_dict(load_bytes(self.weights))
        return model


def _is_handle(obj: Any) -> bool:
    return not isinstance(obj, Module) and callable(getattr(obj, "download_params", None))


def export_torch(model_or_handle: Any, *, inputs: Mapping[str, Any] | None = None,
                 forward: Callable[..., Tensor] | None = None, path: str | Path | None = None,
                 weights_path: str | Path | None = None, params: Mapping[str, Any] | None = None,
                 seed: int = 0, class_name: str | None = None, model: Module | None = None,
                 probes: Sequence[int] = PROBES) -> Any:
    """Export to PyTorch (see the module docstring).

    model_or_handle: a ``tg.Module`` (returns a :class:`TorchExport`), or a training/forward
    handle (``tg.compile`` / ``compile_forward`` / ``attach``; returns an awaitable: its
    weights are downloaded). inputs: ``{name: shape | (shape, dtype)}`` with at most one None
    dim per input (a forward handle's own declaration by default). forward: ``fn(model,
    **inputs) -> Tensor`` (default: ``model(**inputs)``; a forward handle's own function).
    path: write the source there and the weights beside it. params: ``{name: array}`` for a
    Module (default: its init from `seed`). class_name: the top class (default: the model's
    class name). model: the Module of a handle (default: the handle's)."""
    if _is_handle(model_or_handle):
        return _export_handle(model_or_handle, inputs=inputs, forward=forward, path=path,
                              weights_path=weights_path, class_name=class_name, model=model,
                              probes=probes)
    if not isinstance(model_or_handle, Module):
        raise ExportError(f"expected a tg.Module or a training/forward handle, got "
                          f"{type(model_or_handle).__name__}")
    if inputs is None:
        raise ExportError("inputs are required for a Module: {name: shape | (shape, dtype)}, "
                          "e.g. {'x': (None, 1)} (None: any size there)")
    root = model_or_handle
    values = dict(params) if params is not None else root.init_params(seed)
    return _export(root, forward, inputs, values, path, weights_path, class_name, probes)


async def _export_handle(handle: Any, *, inputs: Any, forward: Any, path: Any,
                         weights_path: Any, class_name: Any, model: Any, probes: Any
                         ) -> TorchExport:
    model = model if model is not None else getattr(handle, "_model", None)
    if not isinstance(model, Module):
        raise ExportError(f"cannot find the tg.Module of this {type(handle).__name__} handle; "
                          "pass model=... (the Module it was compiled from)")
    if forward is None:
        forward = getattr(handle, "_forward", None)
    if inputs is None:
        inputs = getattr(handle, "_input_decls", None) if forward is not None else None
    if inputs is None:
        raise ExportError("inputs are required to export a training handle (its loss inputs "
                          "are not the forward's): {name: shape | (shape, dtype)}")
    values = await handle.download_params()
    return _export(model, forward, inputs, values, path, weights_path, class_name, probes)


def forward_ops() -> list[str]:
    """Op kinds that can appear in a traced forward (everything but backward/optimizer ops)."""
    import tensorgrad.ops  # noqa: F401  (fills the op table)

    return sorted(name for name, op in OPS.items() if op.vjp != GRAD_ERROR)


def translatable_ops() -> list[str]:
    """Op kinds the exporter writes as torch code."""
    return sorted(_TRANSLATE)


# =============================================================================================
# Tracing: the raw graph, module calls, and the None dim as a * N + c
# =============================================================================================

@dataclass
class _Call:
    """One call of a Module's forward recorded while tracing."""

    index: int
    module: Module
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    result: Any
    start: int
    end: int


class _CallRecorder:
    """Wraps `forward` of every Module class in a tree for one trace; records each call."""

    def __init__(self, classes: Sequence[type]):
        self.classes = list(classes)
        self.calls: list[_Call] = []
        self._saved: list[tuple[type, bool, Any]] = []
        self._active: set[int] = set()

    def __enter__(self) -> _CallRecorder:  # noqa: PYI034
        for cls in self.classes:
            own = "forward" in cls.__dict__
            orig = cls.__dict__["forward"] if own else cls.forward
            self._saved.append((cls, own, orig))
            cls.forward = self._wrap(orig)
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, own, orig in reversed(self._saved):
            if own:
                cls.forward = orig
            else:
                delattr(cls, "forward")
        self._saved.clear()

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if id(module) in recorder._active:
                return fn(module, *args, **kwargs)
            graph = current_trace("forward").graph
            start = len(graph.nodes)
            recorder._active.add(id(module))
            try:
                result = fn(module, *args, **kwargs)
            finally:
                recorder._active.discard(id(module))
            recorder.calls.append(_Call(len(recorder.calls), module, fn, args, kwargs, result,
                                        start, len(graph.nodes)))
            return result

        forward.__wrapped__ = fn  # type: ignore[attr-defined]
        return forward


@dataclass
class _Traced:
    graph: Graph
    out: int
    clone: Module
    calls: list[_Call]


def _module_classes(root: Module) -> list[type]:
    seen: dict[type, None] = {}
    for info in _walk_modules(root):
        for cls in type(info).__mro__:
            if cls is Module:
                break
            if issubclass(cls, Module):
                seen.setdefault(cls)
    return list(seen)


def _walk_modules(root: Module) -> list[Module]:
    out: list[Module] = []
    seen: set[int] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, Module):
            if id(obj) in seen:
                return
            seen.add(id(obj))
            out.append(obj)
            children: Any = vars(obj).values()
        elif isinstance(obj, (list, tuple)):
            children = obj
        elif isinstance(obj, dict):
            children = obj.values()
        else:
            return
        for v in children:
            walk(v)

    walk(root)
    return out


def _trace(model: Module, forward: Callable[..., Tensor], shapes: Mapping[str, Any],
           record: bool) -> _Traced:
    from ..compiler import trace_forward

    holder: dict[str, Any] = {}
    classes = _module_classes(model) if record else []

    def traced(m: Module, **inputs: Tensor) -> Tensor:
        holder["clone"] = m
        if record:
            with _CallRecorder(classes) as rec:
                out = forward(m, **inputs)
            holder["calls"] = rec.calls
        else:
            out = forward(m, **inputs)
        holder["out"] = out
        return out

    trace_forward(model, traced, shapes)
    out = holder["out"]
    return _Traced(out.graph, out.id, holder["clone"], holder.get("calls", []))


@dataclass(frozen=True)
class Sym:
    """A size that follows the None dim: a * N + c."""

    a: int
    c: int

    def render(self, name: str) -> str:
        core = name if self.a == 1 else f"{self.a} * {name}"
        if self.c > 0:
            return f"{core} + {self.c}"
        if self.c < 0:
            return f"{core} - {-self.c}"
        return core


@dataclass(frozen=True)
class SymFloat:
    """A float op argument that follows the None dim: 1 / (a * N + c) (``recip``) or a*N+c."""

    a: float
    c: float
    recip: bool


def _fit(values: Sequence[Any], probes: Sequence[int], where: str) -> Any:
    """The value (int, float, nested tuple) traced at each probe as constants and Syms."""
    first = values[0]
    if all(v == first and type(v) is type(first) for v in values):
        return first
    if all(isinstance(v, bool) for v in values) or any(v is None for v in values):
        raise ExportError(f"{where} changes with the None dim ({values} at sizes {list(probes)})")
    if all(isinstance(v, int) for v in values):
        (p0, p1, p2), (v0, v1, v2) = probes[:3], values[:3]
        if (v1 - v0) % (p1 - p0) == 0:
            a = (v1 - v0) // (p1 - p0)
            c = v0 - a * p0
            if a * p2 + c == v2:
                return Sym(a, c) if a else c
        raise ExportError(f"{where} is {list(values)} at None-dim sizes {list(probes)}: not "
                          "a * N + c with integers, which export can write (declare that dim "
                          "fixed instead)")
    if all(isinstance(v, (int, float)) for v in values):
        (p0, p1, p2), (v0, v1, v2) = probes[:3], [float(v) for v in values[:3]]
        for recip in (True, False):
            if recip and 0.0 in (v0, v1, v2):
                continue
            y0, y1, y2 = (1 / v0, 1 / v1, 1 / v2) if recip else (v0, v1, v2)
            a = (y1 - y0) / (p1 - p0)
            c = y0 - a * p0
            if math.isclose(a * p2 + c, y2, rel_tol=1e-6, abs_tol=1e-12):
                ra, rc = round(a), round(c)
                if math.isclose(a, ra, abs_tol=1e-6) and math.isclose(c, rc, abs_tol=1e-6):
                    a, c = ra, rc
                return SymFloat(a, c, recip)
        raise ExportError(f"{where} is {list(values)} at None-dim sizes {list(probes)}: "
                          "not expressible in the size")
    if all(isinstance(v, (tuple, list)) for v in values) and len({len(v) for v in values}) == 1:
        return tuple(_fit([v[k] for v in values], probes, f"{where}[{k}]")
                     for k in range(len(first)))
    raise ExportError(f"{where} changes with the None dim ({values} at sizes {list(probes)})")


def _symbolic(traces: Sequence[_Traced], probes: Sequence[int]
              ) -> tuple[list[tuple], list[dict[str, Any]]]:
    """Per node of the first trace: its shape and attrs with Syms where they follow N."""
    g0 = traces[0].graph
    for t in traces[1:]:
        if len(t.graph.nodes) != len(g0.nodes) or any(
                a.op != b.op or a.inputs != b.inputs for a, b in zip(g0.nodes, t.graph.nodes)):
            raise ExportError("the traced graph changes with the size of the None dim (the "
                              "forward branches on it); declare the dim fixed")
    shapes, attrs = [], []
    for k, node in enumerate(g0.nodes):
        others = [t.graph[k] for t in traces]
        where = f"node %{k} ({node.op})"
        shapes.append(_fit([n.shape for n in others], probes, f"the shape of {where}"))
        at = {}
        for key in node.attrs:
            at[key] = _fit([n.attrs[key] for n in others], probes, f"attr {key!r} of {where}")
        attrs.append(at)
    return shapes, attrs


# =============================================================================================
# The module tree
# =============================================================================================

@dataclass
class _Param:
    name: str          # full dotted name
    node: Node         # the param leaf


@dataclass
class _Container:
    kind: str                           # "list" | "dict"
    items: list[tuple[str, Any]]        # (key, _Info | _Param | _Container)


@dataclass
class _Info:
    """One Module instance of the (traced clone's) tree."""

    obj: Module
    path: str
    chain: tuple[tuple[str, str], ...]      # access steps from the root: ("attr"|"index"|"key", k)
    params: list[tuple[str, _Param]] = field(default_factory=list)     # own, by attribute
    children: list[tuple[str, Any]] = field(default_factory=list)      # attr -> _Info | _Container
    config: dict[str, Any] = field(default_factory=dict)
    group: Any = None


def _config_value(v: Any) -> bool:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return True
    return isinstance(v, tuple) and all(isinstance(x, (int, float, bool, str)) for x in v)


def _build_tree(clone: Module, graph: Graph) -> tuple[_Info, dict[int, _Info]]:
    by_id: dict[int, _Info] = {}
    seen_params: set[int] = set()

    def param_of(v: Any) -> _Param | None:
        if isinstance(v, Tensor) and v.graph is graph and graph[v.id].op == "param":
            return _Param(graph[v.id].attrs["name"], graph[v.id])
        return None

    def holds(v: Any) -> bool:
        if isinstance(v, Module) or param_of(v) is not None:
            return True
        if isinstance(v, (list, tuple)):
            return any(holds(x) for x in v)
        if isinstance(v, dict):
            return any(holds(x) for x in v.values())
        return False

    def item(v: Any, path: str, chain: tuple) -> Any:
        p = param_of(v)
        if p is not None:
            if p.node.id in seen_params:
                return None
            seen_params.add(p.node.id)
            return p
        if isinstance(v, Module):
            if id(v) in by_id:
                return None  # reached twice (tied): kept under its first name
            return module(v, path, chain)
        if isinstance(v, (list, tuple, dict)):
            pairs = list(v.items()) if isinstance(v, dict) else list(enumerate(v))
            items = []
            for k, x in pairs:
                if not holds(x):
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
                sub = item(x, f"{path}.{key}", (*chain, step))
                if sub is not None:
                    items.append((key, sub))
            kinds = {type(s) for _, s in items}
            if len(kinds) > 1:
                raise ExportError(f"'{path}' mixes modules and params in one container")
            return _Container("dict" if isinstance(v, dict) else "list", items)
        return None

    def module(obj: Module, path: str, chain: tuple) -> _Info:
        info = _Info(obj, path, chain)
        by_id[id(obj)] = info
        for key, v in vars(obj).items():
            sub_path = f"{path}.{key}" if path else key
            if holds(v):
                if not key.isidentifier() or keyword.iskeyword(key) or key in _RESERVED_ATTRS:
                    raise ExportError(f"attribute '{sub_path}' cannot be a torch module "
                                      "attribute name")
                sub = item(v, sub_path, (*chain, ("attr", key)))
                if isinstance(sub, _Param):
                    info.params.append((key, sub))
                elif sub is not None:
                    info.children.append((key, sub))
            elif _config_value(v) and key.isidentifier() and not keyword.iskeyword(key) \
                    and not key.startswith("_") and key not in _RESERVED_ATTRS:
                info.config[key] = v
        return info

    return module(clone, "", ()), by_id


_RESERVED_ATTRS = {"training", "forward", "reset_parameters", "parameters", "state_dict",
                   "modules", "children", "train", "eval", "to", "cuda", "cpu", "float"}


def _access(chain: Sequence[tuple[str, str]]) -> str:
    text = "self"
    for kind, key in chain:
        text += f".{key}" if kind == "attr" else (f"[{key}]" if kind == "index" else
                                                   f"[{key!r}]")
    return text


def _relative(owner: _Info, chain: tuple) -> str | None:
    """`self...` from `owner` to the object at `chain`, or None when it is not below it."""
    n = len(owner.chain)
    if chain[:n] != owner.chain:
        return None
    return _access(chain[n:])


def _param_chains(root: _Info) -> dict[int, tuple]:
    out: dict[int, tuple] = {}

    def visit(obj: Any, chain: tuple) -> None:
        if isinstance(obj, _Param):
            out[obj.node.id] = chain
        elif isinstance(obj, _Info):
            for key, p in obj.params:
                out[p.node.id] = (*obj.chain, ("attr", key))
            for key, c in obj.children:
                visit(c, (*obj.chain, ("attr", key)))
        elif isinstance(obj, _Container):
            for key, c in obj.items:
                step = ("key", key) if obj.kind == "dict" else ("index", key)
                visit(c, (*chain, step))

    visit(root, root.chain)
    return out


# =============================================================================================
# Expressions and op translations
# =============================================================================================

ATOM, UNARY, MUL, ADD, CMP = 100, 90, 80, 70, 50


@dataclass
class Expr:
    text: str
    prec: int = ATOM
    scalar: Any = None      # a Python number when this is a 0-d constant written as a literal


def _lit(v: Any) -> str:
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, float):
        if math.isinf(v):
            return 'float("inf")' if v > 0 else '-float("inf")'
        if math.isnan(v):
            return 'float("nan")'
        return repr(v)
    return repr(v)


def _lit_expr(v: Any) -> Expr:
    text = _lit(v)
    return Expr(text, UNARY if text.startswith("-") else ATOM, scalar=v)


def _wrap(e: Expr, prec: int, right: bool = False) -> str:
    if e.prec < prec or (right and e.prec == prec and prec < ATOM):
        return f"({e.text})"
    return e.text


def _bin(a: Expr, op: str, b: Expr, prec: int) -> Expr:
    return Expr(f"{_wrap(a, prec)} {op} {_wrap(b, prec, right=True)}", prec)


def _method(x: Expr, call: str) -> Expr:
    return Expr(f"{_wrap(x, ATOM)}.{call}")


def _fn(name: str, *args: str) -> Expr:
    return Expr(f"{name}({', '.join(args)})")


TORCH_DTYPES = {"f32": "torch.float32", "i32": "torch.int64", "bool": "torch.bool"}

HELPERS = {
    "one_hot": '''
def one_hot(idx, depth, dtype=torch.float32):
    """[..., 1] integer indices -> [..., depth]: 1 at the index, 0 elsewhere (an index outside
    0..depth-1 gives a zero row, as in tensorgrad)."""
    return (idx == torch.arange(depth, device=idx.device)).to(dtype)
''',
    "embedding": '''
def embedding(table, idx):
    """Rows of table [V, D] picked by integer idx [...] -> [..., D]; an index outside 0..V-1
    gives a zero row (and no gradient), as in tensorgrad."""
    vocab = table.shape[0]
    valid = ((idx >= 0) & (idx < vocab)).unsqueeze(-1).to(table.dtype)
    return F.embedding(idx.clamp(0, vocab - 1), table) * valid
''',
    "softmax_causal": '''
def softmax_causal(scores):
    """Softmax of row q over columns 0..q of [..., T, T] scores; later columns are 0."""
    t = scores.shape[-1]
    future = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)
''',
    "where_causal": '''
def where_causal(x, fill):
    """x [..., T, T] with the entries above the diagonal (column > row) set to fill."""
    t = x.shape[-1]
    future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    return x.masked_fill(future, fill)
''',
    "normalize_last": '''
def normalize_last(x, eps, center):
    """(x - mean) / sqrt(var + eps) over the last axis (biased variance), or, without
    centering, x / sqrt(mean(x²) + eps)."""
    if center:
        return F.layer_norm(x, x.shape[-1:], eps=eps)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
''',
    "sum_to_shape": '''
def sum_to_shape(x, shape):
    """Sum x down to `shape`, undoing a broadcast (leading axes, then size-1 axes)."""
    lead = x.dim() - len(shape)
    if lead:
        x = x.sum(dim=tuple(range(lead)))
    ones = tuple(k for k, n in enumerate(shape) if n == 1 and x.shape[k] != 1)
    return x.sum(dim=ones, keepdim=True) if ones else x
''',
    "categorical": '''
def categorical(logits):
    """One sample per row of the last axis, probabilities softmax(logits) (Gumbel-max)."""
    u = torch.rand_like(logits).clamp_min(1e-10)
    return (logits - torch.log(-torch.log(u))).argmax(-1)
''',
    "max_pool2d_padded": '''
def max_pool2d_padded(x, kernel, stride, padding):
    """Max pooling whose padding may exceed half the kernel (padded cells never win)."""
    ph, pw = padding
    x = F.pad(x, (pw, pw, ph, ph), value=float("-inf"))
    return F.max_pool2d(x, kernel, stride)
''',
}


class _Ctx:
    """What a translation may ask of the function being written."""

    def __init__(self, size_name: str | None, device_ref: str):
        self.size_name = size_name
        self.device_ref = device_ref
        self.helpers: set[str] = set()
        self.uses_size = False
        self.uses_math = False

    def dim(self, d: Any) -> str:
        if isinstance(d, Sym):
            assert self.size_name is not None
            self.uses_size = True
            return d.render(self.size_name)
        return str(d)

    def dims(self, shape: Sequence[Any]) -> str:
        return ", ".join(self.dim(d) for d in shape)

    def tuple_(self, shape: Sequence[Any]) -> str:
        inner = self.dims(shape)
        return f"({inner},)" if len(shape) == 1 else f"({inner})"

    def number(self, v: Any) -> Expr:
        if isinstance(v, SymFloat):
            assert self.size_name is not None
            self.uses_size = True
            inner = Sym(int(v.a), int(v.c)).render(self.size_name) if (
                float(v.a).is_integer() and float(v.c).is_integer()) else \
                f"{v.a!r} * {self.size_name} + {v.c!r}"
            return Expr(f"1.0 / ({inner})" if v.recip else inner, MUL if v.recip else ADD)
        return _lit_expr(v)

    def device(self) -> str:
        return f"{self.device_ref}.device"

    def helper(self, name: str) -> str:
        self.helpers.add(name)
        return name

    def tensor(self, e: Expr, dtype: str) -> Expr:
        """A scalar literal as a 0-d tensor (for consumers that need a tensor)."""
        if e.scalar is None:
            return e
        return _fn("torch.tensor", e.text, f"dtype={TORCH_DTYPES[dtype]}",
                   f"device={self.device()}")


Translate = Callable[[Node, dict[str, Any], Sequence[Any], list[Expr], _Ctx], Expr]
_TRANSLATE: dict[str, Translate] = {}


def _op(*names: str) -> Callable[[Translate], Translate]:
    def deco(fn: Translate) -> Translate:
        for n in names:
            _TRANSLATE[n] = fn
        return fn
    return deco


_BINARY = {"add": ("+", ADD), "sub": ("-", ADD), "mul": ("*", MUL), "div": ("/", MUL),
           "less": ("<", CMP), "greater": (">", CMP)}


@_op(*_BINARY)
def _t_binary(node, at, shape, a, cx):
    op, prec = _BINARY[node.op]
    x, y = a
    if x.scalar is not None and y.scalar is not None:
        x = cx.tensor(x, "f32" if isinstance(x.scalar, float) else "i32")
    return _bin(x, op, y, prec)


@_op("minimum", "maximum")
def _t_minmax(node, at, shape, a, cx):
    x, y = a
    bound = "min" if node.op == "maximum" else "max"
    if y.scalar is not None and x.scalar is None:
        return _fn("torch.clamp", x.text, f"{bound}={y.text}")
    if x.scalar is not None and y.scalar is None:
        return _fn("torch.clamp", y.text, f"{bound}={x.text}")
    return _fn(f"torch.{node.op}", cx.tensor(x, node.dtype).text, cx.tensor(y, node.dtype).text)


@_op("add_scalar")
def _t_add_scalar(node, at, shape, a, cx):
    s = cx.number(at["scalar"])
    if s.scalar is not None and s.scalar < 0:
        return _bin(a[0], "-", _lit_expr(-s.scalar), ADD)
    return _bin(a[0], "+", s, ADD)


@_op("mul_scalar")
def _t_mul_scalar(node, at, shape, a, cx):
    s = cx.number(at["scalar"])
    if s.scalar == -1:
        return Expr(f"-{_wrap(a[0], UNARY)}", UNARY)
    return _bin(a[0], "*", s, MUL)


@_op("where")
def _t_where(node, at, shape, a, cx):
    c, x, y = a
    c = cx.tensor(c, "bool")
    if x.scalar is not None and y.scalar is not None:
        x = cx.tensor(x, node.dtype)
    return _fn("torch.where", c.text, x.text, y.text)


_UNARY = {"sqrt": "torch.sqrt", "rsqrt": "torch.rsqrt", "log": "torch.log", "exp": "torch.exp",
          "abs": "torch.abs", "tanh": "torch.tanh", "sigmoid": "torch.sigmoid",
          "erf": "torch.erf", "sin": "torch.sin", "cos": "torch.cos", "relu": "torch.relu"}


@_op(*_UNARY)
def _t_unary(node, at, shape, a, cx):
    return _fn(_UNARY[node.op], cx.tensor(a[0], "f32").text)


@_op("neg")
def _t_neg(node, at, shape, a, cx):
    return Expr(f"-{_wrap(a[0], UNARY)}", UNARY)


@_op("stop_gradient")
def _t_stop(node, at, shape, a, cx):
    return _method(cx.tensor(a[0], node.dtype), "detach()")


@_op("full")
def _t_full(node, at, shape, a, cx):
    value = float(at["value"]) if node.dtype == "f32" else (
        bool(at["value"]) if node.dtype == "bool" else int(at["value"]))
    if not shape:
        return _lit_expr(value)
    return _fn("torch.full", cx.tuple_(shape), _lit(value), f"dtype={TORCH_DTYPES[node.dtype]}",
               f"device={cx.device()}")


@_op("reshape")
def _t_reshape(node, at, shape, a, cx):
    target = list(at["shape"])
    syms = [k for k, d in enumerate(target) if isinstance(d, Sym)]
    if len(syms) == 1:
        target[syms[0]] = -1
    elif not syms:
        big = [k for k, d in enumerate(target) if d != 1]
        if len(big) == 1:
            target[big[0]] = -1   # the same size whatever the input's size
    return _method(a[0], f"reshape({cx.dims(target)})")


@_op("permute")
def _t_permute(node, at, shape, a, cx):
    perm = list(at["perm"])
    moved = [k for k, p in enumerate(perm) if p != k]
    n = len(perm)
    if len(moved) == 2 and perm[moved[0]] == moved[1]:
        i, j = moved
        if (i, j) == (n - 2, n - 1):
            i, j = -2, -1
        return _method(a[0], f"transpose({i}, {j})")
    return _method(a[0], f"permute({', '.join(map(str, perm))})")


@_op("slice_range")
def _t_slice(node, at, shape, a, cx):
    axis, rank = at["axis"], len(shape)
    span = f"{cx.dim(at['start']) if at['start'] != 0 else ''}:{cx.dim(at['end'])}"
    if axis == rank - 1 and rank > 1:
        index = f"..., {span}"
    else:
        index = ", ".join([":"] * axis + [span])
    return Expr(f"{_wrap(a[0], ATOM)}[{index}]")


@_op("concat")
def _t_concat(node, at, shape, a, cx):
    items = ", ".join(cx.tensor(e, node.dtype).text for e in a)
    axis = at["axis"]
    if axis == len(shape) - 1 and len(shape) > 1:
        axis = -1
    return _fn("torch.cat", f"[{items}]", f"dim={axis}")


@_op("broadcast_to")
def _t_broadcast(node, at, shape, a, cx):
    return _method(cx.tensor(a[0], node.dtype), f"expand({cx.dims(at['shape'])})")


@_op("sum_to_shape")
def _t_sum_to(node, at, shape, a, cx):
    return _fn(cx.helper("sum_to_shape"), a[0].text, cx.tuple_(at["shape"]))


@_op("one_hot")
def _t_one_hot(node, at, shape, a, cx):
    args = [a[0].text, cx.dim(at["depth"])]  # indices [..., 1], as the primitive takes them
    if node.dtype != "f32":
        args.append(TORCH_DTYPES[node.dtype])
    return _fn(cx.helper("one_hot"), *args)


@_op("gather_rows")
def _t_gather_rows(node, at, shape, a, cx):
    return _fn(cx.helper("embedding"), a[0].text, a[1].text)


@_op("arange")
def _t_arange(node, at, shape, a, cx):
    args = [cx.dim(at["n"])]
    if node.dtype == "f32":
        args.append("dtype=torch.float32")
    return _fn("torch.arange", *args, f"device={cx.device()}")


@_op("matmul", "matmul_batched")
def _t_matmul(node, at, shape, a, cx):
    x, y = a
    if at.get("transpose_a"):
        x = _method(x, "transpose(-2, -1)")
    if at.get("transpose_b"):
        y = _method(y, "transpose(-2, -1)")
    return _bin(x, "@", y, MUL)


@_op("sum_last")
def _t_sum_last(node, at, shape, a, cx):
    return _method(a[0], "sum(-1)")


@_op("mean_last")
def _t_mean_last(node, at, shape, a, cx):
    return _method(a[0], "mean(-1, keepdim=True)")


@_op("argmax_last")
def _t_argmax(node, at, shape, a, cx):
    return _method(a[0], "argmax(-1)")


@_op("log_softmax_last")
def _t_log_softmax(node, at, shape, a, cx):
    return _method(a[0], "log_softmax(-1)")


@_op("softmax_causal_last")
def _t_softmax_causal(node, at, shape, a, cx):
    return _fn(cx.helper("softmax_causal"), a[0].text)


@_op("normalize_last")
def _t_normalize_last(node, at, shape, a, cx):
    return _fn(cx.helper("normalize_last"), a[0].text, _lit(float(at["eps"])),
               repr(bool(at["center"])))


@_op("where_causal")
def _t_where_causal(node, at, shape, a, cx):
    return _fn(cx.helper("where_causal"), a[0].text, _lit(float(at["fill"])))


def _pair_arg(name: str, v: Any, default: Any) -> list[str]:
    v = tuple(v)
    if v == default:
        return []
    return [f"{name}={v[0] if v[0] == v[1] else v}"]


@_op("conv2d")
def _t_conv2d(node, at, shape, a, cx):
    args = [a[0].text, a[1].text, *_pair_arg("stride", at["stride"], (1, 1)),
            *_pair_arg("padding", at["padding"], (0, 0))]
    if at["groups"] != 1:
        args.append(f"groups={at['groups']}")
    return _fn("F.conv2d", *args)


@_op("max_pool2d")
def _t_max_pool(node, at, shape, a, cx):
    kernel, stride, pad = tuple(at["kernel"]), tuple(at["stride"]), tuple(at["padding"])
    one = (lambda v: str(v[0]) if v[0] == v[1] else str(v))
    if pad[0] * 2 > kernel[0] or pad[1] * 2 > kernel[1]:
        return _fn(cx.helper("max_pool2d_padded"), a[0].text, one(kernel), one(stride),
                   str(pad))
    args = [a[0].text, one(kernel)]
    if stride != kernel:
        args.append(f"stride={one(stride)}")
    if pad != (0, 0):
        args.append(f"padding={one(pad)}")
    return _fn("F.max_pool2d", *args)


@_op("dropout")
def _t_dropout(node, at, shape, a, cx):
    return _fn("F.dropout", a[0].text, f"p={_lit(float(at['p']))}", "training=self.training")


@_op("randn")
def _t_randn(node, at, shape, a, cx):
    return _fn("torch.randn", cx.tuple_(at["shape"]), f"device={cx.device()}")


@_op("categorical_last")
def _t_categorical(node, at, shape, a, cx):
    return _fn(cx.helper("categorical"), a[0].text)


# Fused patterns (several IR nodes, one torch call): kind -> translation.
def _t_softmax(inputs: list[Expr], cx: _Ctx) -> Expr:
    return _method(inputs[0], "softmax(-1)")


_FUSED = {"softmax": _t_softmax}


def _unsupported(node: Node) -> ExportError:
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


def translate_node(node: Node, args: list[Expr], ctx: _Ctx, shape: Sequence[Any] | None = None,
                   attrs: Mapping[str, Any] | None = None) -> Expr:
    """The torch expression of one node from its operands' expressions (or ExportError)."""
    fn = _TRANSLATE.get(node.op)
    if fn is None:
        raise _unsupported(node)
    return fn(node, dict(node.attrs if attrs is None else attrs),
              node.shape if shape is None else shape, args, ctx)


# =============================================================================================
# Analysis of the traced graph: liveness, module calls, fused patterns
# =============================================================================================

@dataclass
class _CallInfo:
    call: _Call
    info: _Info
    outs: list[int]
    tensor_args: list[tuple[str, int]]      # (param name, node id)
    valid: bool = True
    why: str = ""


class _Analysis:
    def __init__(self, tr: _Traced, shapes: list, attrs: list, size_name: str | None,
                 forward_fn: Callable[..., Any], input_names: list[str]):
        self.tr, self.graph = tr, tr.graph
        self.shapes, self.attrs = shapes, attrs
        self.size_name = size_name
        self.forward_fn = forward_fn
        self.input_names = input_names
        self.root, self.infos = _build_tree(tr.clone, tr.graph)
        self.param_chain = _param_chains(self.root)
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
    def _call_info(self, c: _Call) -> _CallInfo:
        info = self.infos.get(id(c.module))
        ci = _CallInfo(c, info, [], [])  # type: ignore[arg-type]

        def invalid(why: str) -> _CallInfo:
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
            elif _holds_tensor(v):
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
                    if g[i].op == "param" and _relative(ci.info, self.param_chain[i]) is not None:
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

    def contains(self, outer: _CallInfo, inner: _CallInfo) -> bool:
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


def _holds_tensor(v: Any) -> bool:
    if isinstance(v, Tensor):
        return True
    if isinstance(v, (list, tuple)):
        return any(_holds_tensor(x) for x in v)
    if isinstance(v, dict):
        return any(_holds_tensor(x) for x in v.values())
    return False


# =============================================================================================
# Writing one function body
# =============================================================================================

_OP_NAMES = {"matmul": "h", "matmul_batched": "h", "conv2d": "conv", "max_pool2d": "pool",
             "log_softmax_last": "logp", "softmax_causal_last": "attn", "reshape": "h",
             "one_hot": "hot", "argmax_last": "idx", "dropout": "h", "randn": "noise",
             "categorical_last": "sample", "concat": "h", "arange": "pos", "full": "c",
             "less": "mask", "greater": "mask", "gather_rows": "emb"}
_NAME_RESERVED = {"self", "torch", "nn", "F", "math", "super", "range", "len", "float", "int",
                  "tuple", "list", "dict", "print", "max", "min", "sum", "abs", "input"}
_LHS = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=[^=]")


@dataclass
class _Item:
    pos: int
    node: int | None = None
    call: _CallInfo | None = None


class _Body:
    """Lines of one forward: the nodes of a region, with extracted calls as `self.x(...)`."""

    def __init__(self, an: _Analysis, owner: _Info, region: tuple[int, int] | None,
                 outs: list[int], arg_names: dict[int, str], children: list[_CallInfo],
                 sources: list[tuple[str, int, int]]):
        self.an, self.owner, self.region = an, owner, region
        self.outs, self.arg_names, self.children = outs, arg_names, children
        self.sources = sources
        self.taken: set[str] = set(_NAME_RESERVED) | set(arg_names.values())
        if an.size_name:
            self.taken.add(an.size_name)

    def _child_of(self, n: int) -> _CallInfo | None:
        for ci in self.children:
            if ci.call.start <= n < ci.call.end:
                return ci
        return None

    def _inputs(self, n: int) -> list[int]:
        fused = self.an.fused.get(n)
        return list(fused[1]) if fused else list(self.an.graph[n].inputs)

    def _device_ref(self) -> str:
        if self.arg_names:
            return next(iter(self.arg_names.values()))
        for key, _ in self.owner.params:
            return f"self.{key}"
        return "self"

    def lines(self, ctx: _Ctx) -> list[str]:
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
            if i in self.arg_names:
                continue
            node = g[i]
            if node.op == "param":
                params_used.add(i)
                continue
            if i == an.seed_id:
                continue
            if node.op == "input":
                raise ExportError(f"input '{node.attrs['name']}' is read inside a module call "
                                  "it was not passed to")
            child = self._child_of(i)
            if child is not None:
                key = ("call", child.call.index)
                if key not in items:
                    items[key] = _Item(child.call.start, call=child)
                    stack.extend(t for _, t in child.tensor_args)
                continue
            items[i] = _Item(i, node=i)
            stack.extend(self._inputs(i))
        order = sorted(items.values(), key=lambda it: it.pos)

        # uses of each value: node id -> count
        uses: dict[int, int] = {}
        for it in order:
            deps = self._inputs(it.node) if it.node is not None else \
                [t for _, t in it.call.tensor_args]  # type: ignore[union-attr]
            for d in deps:
                uses[d] = uses.get(d, 0) + 1
        for o in self.outs:
            uses[o] = uses.get(o, 0) + 1

        exprs: dict[int, Expr] = {}
        for i in params_used:
            ref = _relative(self.owner, an.param_chain[i])
            if ref is None:
                raise ExportError(f"param '{g[i].attrs['name']}' is not below "
                                  f"'{self.owner.path or 'the root'}'")
            exprs[i] = Expr(ref)
        for i, name in self.arg_names.items():
            exprs[i] = Expr(name)
        if an.seed_id is not None:
            exprs[an.seed_id] = Expr("None")

        out: list[str] = []
        state = {"comment": None}
        pending: dict[int, tuple[str, str | None]] = {}   # inlined value -> (name, comment)
        ctx.device_ref = self._device_ref()
        last_of_line: dict[str | None, int] = {}
        for it in order:
            if it.node is not None:
                last_of_line[self._site(g[it.node])[0]] = it.node

        def emit(name: str, text: str, comment: str | None = None) -> None:
            if comment and comment != state["comment"]:
                out.append(f"# {comment}")
                state["comment"] = comment
            out.append(f"{name} = {text}")

        def spill(ids: Sequence[int], build: Callable[[], Expr], width: int) -> Expr:
            """build(); while too long, give the longest inlined operand its own line."""
            expr = build()
            while len(expr.text) > width:
                cands = [i for i in dict.fromkeys(ids) if i in pending]
                if not cands:
                    break
                i = max(cands, key=lambda j: len(exprs[j].text))
                base, comment = pending.pop(i)
                name = self._name(base)
                emit(name, exprs[i].text, comment)
                exprs[i] = Expr(name)
                expr = build()
            return expr

        for it in order:
            if it.call is not None:
                ci = it.call
                ref = _relative(self.owner, ci.info.chain)
                assert ref is not None
                ids = [t for _, t in ci.tensor_args]

                def build_call(ref: str = ref, ids: list[int] = ids) -> Expr:
                    return Expr(f"{ref}({', '.join(exprs[t].text for t in ids)})")

                expr = spill(ids, build_call, LINE_MAX)
                chain = ci.info.chain
                base = chain[-1][1] if chain else "h"
                if not base.isidentifier():  # a list index: blocks.0 -> blocks0
                    base = f"{chain[-2][1]}{base}" if len(chain) > 1 else "h"
                if len(ci.outs) == 1:
                    o = ci.outs[0]
                    exprs[o] = expr
                    if uses.get(o, 0) == 1 and len(expr.text) <= INLINE_MAX:
                        pending[o] = (base, None)
                        continue
                    name = self._name(base)
                    emit(name, expr.text)
                    exprs[o] = Expr(name)
                else:
                    names = []
                    for k, o in enumerate(ci.outs):
                        names.append(self._name(f"{base}_{k}") if o in uses else "_")
                        exprs[o] = Expr(names[-1])
                    out.append(f"{', '.join(names)} = {expr.text}")
                continue
            n = it.node
            assert n is not None
            node = g[n]
            fused = an.fused.get(n)
            ids = self._inputs(n)

            def build_node(n: int = n, node: Node = node, fused: Any = fused,
                           ids: list[int] = ids) -> Expr:
                args = [exprs[i] for i in ids]
                if fused:
                    return _FUSED[fused[0]](args, ctx)
                return translate_node(node, args, ctx, an.shapes[n], an.attrs[n])

            expr = spill(ids, build_node, LINE_MAX)
            comment, lhs = self._site(node)
            if lhs and last_of_line.get(comment) != n:
                lhs = None  # the line's name belongs to its last value
            base = lhs or _OP_NAMES.get(node.op, "h")
            exprs[n] = expr
            if expr.scalar is not None:
                continue
            if uses.get(n, 0) == 1 and len(expr.text) <= INLINE_MAX:
                pending[n] = (base, comment)
                continue
            name = self._name(base)
            emit(name, expr.text, comment)
            exprs[n] = Expr(name)

        def build_return() -> Expr:
            return Expr(", ".join(exprs[o].text for o in self.outs))

        ret = spill(self.outs, build_return, LINE_MAX - 7)
        out.append(f"return {ret.text}")
        return out

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


def _source_range(fn: Any) -> list[tuple[str, int, int]]:
    fn = getattr(fn, "__wrapped__", fn)
    try:
        lines, start = inspect.getsourcelines(fn)
        fname = inspect.getsourcefile(fn) or inspect.getfile(fn)
    except (OSError, TypeError):
        return []
    return [(fname, start, start + len(lines) - 1)]


# =============================================================================================
# Classes: grouping instances, __init__, reset_parameters, forward
# =============================================================================================

@dataclass
class _Group:
    cls: type
    name: str = ""
    members: list[_Info] = field(default_factory=list)
    skeleton: Any = None
    forward: list[str] | None = None        # body lines (None: no forward of its own)
    signature: list[str] | None = None
    slots: list[Any] = field(default_factory=list)       # per slot: list of candidate attrs
    literal: list[Any] = field(default_factory=list)     # per slot: the value or _MIXED
    chosen: list[str | None] = field(default_factory=list)


_MIXED = object()


def _candidates(config: Mapping[str, Any], value: Any) -> list[str]:
    out = []
    for k, v in config.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, int) and v == value and isinstance(value, int) \
                and not isinstance(value, bool):
            out.append(k)
        elif isinstance(v, tuple):
            out += [f"{k}[{j}]" for j, x in enumerate(v)
                    if isinstance(x, int) and not isinstance(x, bool) and x == value
                    and isinstance(value, int) and not isinstance(value, bool)]
    return out


def _init_skeleton(spec: Any) -> tuple:
    import dataclasses

    values = ((f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec))
    return (type(spec).__name__,
            *((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in values))


class _Writer:
    def __init__(self, an: _Analysis, specs: Mapping[str, Any], class_name: str | None,
                 input_decls: Mapping[str, Any]):
        self.an = an
        self.specs = specs
        self.class_name = class_name
        self.decls = input_decls
        self.ctx_helpers: set[str] = set()
        self.uses_math = False

    # -- extraction decisions (a fixpoint: instances only ever go from extracted to inlined) --
    def decide(self) -> dict[int, list[str]]:
        an = self.an
        an.check_calls()
        candidates = [ci for ci in an.calls if ci.valid]
        inlined: set[int] = {id(ci.info.obj) for ci in an.calls
                             if not ci.valid and ci.info is not None}
        while True:
            active = [ci for ci in candidates if id(ci.info.obj) not in inlined]
            codes: dict[int, list[str]] = {}
            changed = False
            for ci in sorted(active, key=lambda c: (c.call.end - c.call.start, c.call.index)):
                kids = self._top_children(ci, active)
                key = id(ci.info.obj)
                if any(_relative(ci.info, kid.info.chain) is None for kid in kids):
                    inlined.add(key)  # it calls a module that is not its own child
                    changed = True
                    break
                lines = self._call_lines(ci, kids)
                if key in codes and codes[key] != lines:
                    inlined.add(key)
                    changed = True
                    break
                codes[key] = lines
            if not changed:
                self.active = active
                return codes

    def _top_children(self, parent: _CallInfo | None, active: list[_CallInfo]
                      ) -> list[_CallInfo]:
        an = self.an
        inside = [ci for ci in active if parent is None or an.contains(parent, ci)]
        tops = [ci for ci in inside
                if not any(an.contains(o, ci) for o in inside if o is not ci)]
        return tops

    def _call_lines(self, ci: _CallInfo, kids: list[_CallInfo]) -> list[str]:
        an = self.an
        names: dict[int, str] = {}
        for pname, t in ci.tensor_args:
            names.setdefault(t, pname)
        body = _Body(an, ci.info, (ci.call.start, ci.call.end), ci.outs, names, kids,
                     _source_range(ci.call.fn))
        ctx = _Ctx(an.size_name, "self")
        lines = body.lines(ctx)
        if ctx.uses_size:
            lines = [self._size_line(ci, names)] + lines
        self.ctx_helpers |= ctx.helpers
        sig = ", ".join(["self", *[p for p, _ in ci.tensor_args]])
        return [f"def forward({sig}):", *["    " + ln for ln in lines]]

    def _size_line(self, ci: _CallInfo, names: Mapping[int, str]) -> str:
        an = self.an
        for t, name in names.items():
            for k, d in enumerate(an.shapes[t]):
                if isinstance(d, Sym):
                    return f"{an.size_name} = {_size_from(name, k, d)}"
        raise ExportError(f"{type(ci.info.obj).__name__}.forward uses the None dim but none "
                          "of its tensor arguments has it")

    # -- the root forward ------------------------------------------------------------------
    def root_forward(self) -> list[str]:
        an = self.an
        names = {an.input_ids[n]: n for n in an.input_names if n in an.input_ids}
        kids = self._top_children(None, self.active)
        body = _Body(an, an.root, None, [an.tr.out], names, kids,
                     _source_range(an.forward_fn)
                     + _source_range(type(an.root.obj).forward))
        ctx = _Ctx(an.size_name, "self")
        lines = body.lines(ctx)
        if ctx.uses_size:
            for name in an.input_names:
                shape = self.decls[name][0]
                if None in shape:
                    k = shape.index(None)
                    lines = [f"{an.size_name} = {name}.shape[{k}]"] + lines
                    break
        self.ctx_helpers |= ctx.helpers
        doc = self._forward_doc()
        sig = ", ".join(["self", *an.input_names])
        return [f"def forward({sig}):", f'    """{doc}"""', *["    " + ln for ln in lines]]

    def _forward_doc(self) -> str:
        an = self.an
        parts = []
        for name in an.input_names:
            shape, dtype = self.decls[name]
            dims = ", ".join(an.size_name if d is None else str(d) for d in shape)
            kind = "float32" if dtype == "f32" else "integer"
            parts.append(f"{name}: {kind} [{dims}]")
        out = an.graph[an.tr.out]
        dims = ", ".join(d.render(an.size_name) if isinstance(d, Sym) else str(d)
                         for d in an.shapes[an.tr.out])
        kind = {"f32": "float32", "i32": "int64", "bool": "bool"}[out.dtype]
        text = f"{'; '.join(parts)} -> {kind} [{dims}]"
        if an.size_name:
            text += f" (any {an.size_name})"
        return text

    # -- grouping and class text -------------------------------------------------------------
    def classes(self, codes: dict[int, list[str]]) -> tuple[list[str], str]:
        an = self.an
        order: list[_Info] = []

        def post(info: _Info) -> None:
            for _, c in info.children:
                for sub in _modules_in(c):
                    post(sub)
            order.append(info)

        post(an.root)
        groups: list[_Group] = []
        used_names: dict[str, int] = {}
        for info in order:
            is_root = info is an.root
            code = None if is_root else codes.get(id(info.obj))
            skeleton, values = self._skeleton(info)
            placed = None
            if not is_root:
                for grp in groups:
                    if grp.cls is type(info.obj) and grp.skeleton == skeleton \
                            and grp.members[0] is not an.root \
                            and (grp.forward is None or code is None or grp.forward == code) \
                            and self._fits(grp, info, values):
                        placed = grp
                        break
            if placed is None:
                placed = _Group(type(info.obj), skeleton=skeleton)
                placed.slots = [None] * len(values)
                placed.literal = [_MIXED] * len(values)
                base = self.class_name if is_root and self.class_name else type(info.obj).__name__
                k = used_names.get(base, 0) + 1
                used_names[base] = k
                placed.name = base if k == 1 else f"{base}_{k}"
                groups.append(placed)
            self._join(placed, info, values)
            if code is not None:
                placed.forward = code
            info.group = placed
        for grp in groups:
            self._choose(grp)
        root_group = an.root.group
        texts = []
        for grp in groups:
            texts.append(self._class_text(grp, grp is root_group))
        return texts, root_group.name

    def _skeleton(self, info: _Info) -> tuple[tuple, list[Any]]:
        """(structure, slot values): param dims, kaiming fan-ins and child constructor
        arguments are slots; everything else must be equal within a class."""
        values: list[Any] = []
        parts: list[Any] = []
        for key, p in info.params:
            spec = self.specs[p.name]
            parts.append(("param", key, spec.dtype, len(spec.shape), _init_skeleton(spec.init)))
            values.extend(spec.shape)
            if spec.init.kind == "kaiming":
                values.append(spec.fan_in)
        for key, c in info.children:
            parts.append(("child", key, self._child_skeleton(c, values)))
        return tuple(parts), values

    def _child_skeleton(self, c: Any, values: list[Any]) -> Any:
        if isinstance(c, _Info):
            # the child's class and its constructor arguments (filled in later: slots)
            values.append(("ctor", c))
            return ("module", type(c.obj).__qualname__)
        if isinstance(c, _Param):
            spec = self.specs[c.name]
            values.extend(spec.shape)
            return ("param", spec.dtype, len(spec.shape), _init_skeleton(spec.init))
        return (c.kind, tuple((k, self._child_skeleton(x, values)) for k, x in c.items))

    def _slot_sig(self, info: _Info) -> tuple:
        """What decides a child's constructor arguments: its slot values, recursively."""
        _, values = self._skeleton(info)
        return tuple((id(v[1].group), self._slot_sig(v[1]))
                     if isinstance(v, tuple) and v and v[0] == "ctor" else v for v in values)

    def _fits(self, grp: _Group, info: _Info, values: list[Any]) -> bool:
        for k, v in enumerate(values):
            if isinstance(v, tuple) and v and v[0] == "ctor":
                ref = grp.literal[k]
                if ref is _MIXED:
                    continue
                if ref.group is not v[1].group or self._slot_sig(v[1]) != self._slot_sig(ref):
                    return False
                continue
            cands = set(_candidates(info.config, v))
            if grp.slots[k] is not None and set(grp.slots[k]) & cands:
                continue
            if grp.literal[k] is not _MIXED and grp.literal[k] == v:
                continue
            return False
        return True

    def _join(self, grp: _Group, info: _Info, values: list[Any]) -> None:
        first = not grp.members
        grp.members.append(info)
        for k, v in enumerate(values):
            if isinstance(v, tuple) and v and v[0] == "ctor":
                if first:
                    grp.literal[k] = v[1]
                continue
            cands = _candidates(info.config, v)
            if first:
                grp.slots[k] = cands
                grp.literal[k] = v
            else:
                prev = grp.slots[k] or []
                grp.slots[k] = [c for c in prev if c in cands]
                if grp.literal[k] is not _MIXED and grp.literal[k] != v:
                    grp.literal[k] = _MIXED

    def _choose(self, grp: _Group) -> None:
        """Per slot: the config attribute that gives it (distinct within a param), or None
        for a literal."""
        grp.chosen = [None] * len(grp.slots)
        if grp is self.an.root.group:
            return  # the root class has no constructor arguments
        owners = self._slot_owners(grp.members[0])
        taken: dict[int, set[str]] = {}
        for k, cands in enumerate(grp.slots):
            if isinstance(grp.literal[k], _Info) or not cands:
                continue
            used = taken.setdefault(owners[k], set())
            free = [c for c in cands if c not in used]
            grp.chosen[k] = (free or cands)[0]
            used.add(grp.chosen[k])

    def _slot_owners(self, info: _Info) -> list[int]:
        """For each slot, a number naming the param (or child) it belongs to."""
        owners: list[int] = []
        for k, (_, p) in enumerate(info.params):
            spec = self.specs[p.name]
            owners += [k] * (len(spec.shape) + (spec.init.kind == "kaiming"))
        values: list[Any] = []
        for k, (_, c) in enumerate(info.children):
            before = len(values)
            self._child_skeleton(c, values)
            owners += [1000 + k] * (len(values) - before)
        return owners

    def _ctor_attrs(self, grp: _Group) -> list[str]:
        attrs: list[str] = []
        for c in grp.chosen:
            if c is not None:
                base = c.split("[")[0]
                if base not in attrs:
                    attrs.append(base)
        order = list(grp.members[0].config)
        return sorted(attrs, key=order.index)

    def _ctor_args(self, info: _Info) -> str:
        grp = info.group
        return ", ".join(f"{a}={info.config[a]!r}" for a in self._ctor_attrs(grp))

    def _ctor(self, info: _Info) -> str:
        return f"{info.group.name}({self._ctor_args(info)})"

    def _class_text(self, grp: _Group, is_root: bool) -> str:
        rep = grp.members[0]
        attrs = self._ctor_attrs(grp)
        slot_iter = iter(range(len(grp.slots)))

        def slot_text(value: Any) -> str:
            k = next(slot_iter)
            c = grp.chosen[k]
            return c if c is not None else repr(value)

        doc_src = f"{type(rep.obj).__module__}.{type(rep.obj).__qualname__}"
        lines = [f"class {grp.name}(nn.Module):"]
        doc = f"Port of {doc_src}"
        if len(grp.members) > 1:
            doc += f" ({len(grp.members)} instances)"
        lines.append(f'    """{doc}."""')
        lines.append("")
        sig = ", ".join(["self", *attrs])
        lines.append(f"    def __init__({sig}):")
        lines.append("        super().__init__()")
        for a in attrs:
            lines.append(f"        self.{a} = {a}")
        inits: list[str] = []
        for key, p in rep.params:
            spec = self.specs[p.name]
            dims = [slot_text(d) for d in spec.shape]
            fan = slot_text(spec.fan_in) if spec.init.kind == "kaiming" else None
            lines.append(f"        self.{key} = {self._param_ctor(spec, dims)}")
            inits.append(self._init_line(f"self.{key}", spec, fan))
        for key, c in rep.children:
            lines.append(f"        self.{key} = {self._child_ctor(c, slot_text, inits, key)}")
        if not rep.params and not rep.children and not attrs:
            lines.append("        pass")
        if inits:
            lines.append("        self.reset_parameters()")
            lines.append("")
            lines.append("    def reset_parameters(self):")
            lines.append('        """The tensorgrad init specs (same distributions, not the '
                         'same random numbers)."""')
            lines += [f"        {ln}" for ln in inits]
        fwd = self.root_forward() if is_root else grp.forward
        if fwd:
            lines.append("")
            lines += ["    " + ln for ln in fwd]
        return "\n".join(lines)

    def _child_ctor(self, c: Any, slot_text: Callable[[Any], str], inits: list[str],
                    path: str) -> str:
        if isinstance(c, _Info):
            next_k = slot_text  # consume the ctor slot
            next_k(None)
            return self._ctor(c)
        if isinstance(c, _Param):
            spec = self.specs[c.name]
            return self._param_ctor(spec, [slot_text(d) for d in spec.shape])
        if c.kind == "list":
            kinds = {type(x) for _, x in c.items}
            if kinds == {_Param}:
                parts = []
                for k, x in c.items:
                    spec = self.specs[x.name]
                    parts.append(self._param_ctor(spec, [slot_text(d) for d in spec.shape]))
                    inits.append(self._init_line(f"self.{path}[{k}]", spec, None))
                return f"nn.ParameterList([{', '.join(parts)}])"
            parts = [self._child_ctor(x, slot_text, inits, f"{path}[{k}]") for k, x in c.items]
            if parts and len(set(parts)) == 1 and len(parts) > 1:
                return f"nn.ModuleList([{parts[0]} for _ in range({len(parts)})])"
            return f"nn.ModuleList([{', '.join(parts)}])"
        kinds = {type(x) for _, x in c.items}
        entries = []
        for k, x in c.items:
            if isinstance(x, _Param):
                spec = self.specs[x.name]
                dims = [slot_text(d) for d in spec.shape]
                entries.append(f"{k!r}: {self._param_ctor(spec, dims)}")
                inits.append(self._init_line(f"self.{path}[{k!r}]", spec, None))
            else:
                entries.append(f"{k!r}: {self._child_ctor(x, slot_text, inits, f'{path}[{k!r}]')}")
        kind = "nn.ParameterDict" if kinds == {_Param} else "nn.ModuleDict"
        return f"{kind}({{{', '.join(entries)}}})"

    def _param_ctor(self, spec: Any, dims: list[str]) -> str:
        shape = ", ".join(dims) if dims else "()"
        if spec.dtype == "f32":
            return f"nn.Parameter(torch.empty({shape}))"
        return f"nn.Parameter(torch.empty({shape}, dtype=torch.int32), requires_grad=False)"

    def _init_line(self, ref: str, spec: Any, fan: str | None) -> str:
        init = spec.init
        if init.kind == "zeros":
            return f"nn.init.zeros_({ref})"
        if init.kind == "ones":
            return f"nn.init.ones_({ref})"
        if init.kind == "randn":
            return f"nn.init.normal_({ref}, std={init.scale!r})"
        if init.kind == "kaiming":
            self.uses_math = True
            return f"nn.init.normal_({ref}, std={init.gain!r} / math.sqrt({fan}))"
        if init.kind == "literal":
            values = list(init.values)
            dims = ", ".join(str(d) for d in spec.shape) or "()"
            return (f"with torch.no_grad(): {ref}.copy_(torch.tensor({values!r}).reshape"
                    f"({dims}))")
        return f"pass  # {ref}: init {init.kind!r} (the exported weights hold the values)"


def _modules_in(c: Any) -> list[_Info]:
    if isinstance(c, _Info):
        return [c]
    if isinstance(c, _Container):
        out: list[_Info] = []
        for _, x in c.items:
            out += _modules_in(x)
        return out
    return []


def _size_from(name: str, axis: int, d: Sym) -> str:
    text = f"{name}.shape[{axis}]"
    if d.c:
        text = f"({text} - {d.c})" if d.c > 0 else f"({text} + {-d.c})"
    if d.a != 1:
        text = f"{text} // {d.a}"
    return text


# =============================================================================================
# The whole export
# =============================================================================================

def _default_forward(model: Module, **inputs: Tensor) -> Tensor:
    return model(**inputs)


def _export(root: Module, forward: Callable[..., Tensor] | None, inputs: Mapping[str, Any],
            values: Mapping[str, Any], path: Any, weights_path: Any, class_name: str | None,
            probes: Sequence[int]) -> TorchExport:
    import tensorgrad.ops  # noqa: F401

    from ..trace import normalize_inputs

    fwd = forward or _default_forward
    decls = {k: (d.shape, d.dtype) for k, d in
             normalize_inputs(inputs, wildcards=True, op="export.torch").items()}
    wild = [(name, shape.index(None)) for name, (shape, _) in decls.items() if None in shape]
    probes = tuple(probes)
    if wild and (len(probes) < 3 or len(set(probes)) < 3):
        raise ExportError(f"probes must be three different sizes, got {list(probes)}")

    def shapes_at(n: int) -> dict[str, Any]:
        return {k: (tuple(n if d is None else d for d in s), dt) for k, (s, dt) in
                decls.items()}

    try:
        first = _trace(root, fwd, shapes_at(probes[0]), record=True)
        traces = [first]
        if wild:
            traces += [_trace(root, fwd, shapes_at(p), record=False) for p in probes[1:3]]
    except ShapeError as exc:
        if wild:
            raise ExportError(f"tracing the forward with the None dim at size(s) "
                              f"{list(probes)} failed (pass probes=(a, b, c) the model "
                              f"accepts): {exc}") from exc
        raise
    shapes, attrs = _symbolic(traces, probes) if wild else (
        [n.shape for n in first.graph.nodes], [dict(n.attrs) for n in first.graph.nodes])
    size_name = None
    if wild:
        size_name = "B" if wild[0][1] == 0 else "N"
        taken = set(decls)
        while size_name in taken:
            size_name += "_"
    names = list(decls)
    an = _Analysis(first, shapes, attrs, size_name, fwd, names)
    for n in first.graph.nodes:
        if n.id in an.live and n.op not in ("param", "input") and n.op not in _TRANSLATE:
            raise _unsupported(n)
    specs = dict(root.named_params())
    writer = _Writer(an, specs, class_name, decls)
    codes = writer.decide()
    class_texts, root_name = writer.classes(codes)
    helpers = [HELPERS[h].strip("\n") for h in sorted(writer.ctx_helpers)]
    head = _header(root, root_name, an, writer, decls, path)
    imports = ["import math", ""] if writer.uses_math else []
    imports += ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
    parts = [head, "\n".join(imports)]
    if helpers:
        parts.append("\n\n\n".join(helpers))
    parts += class_texts
    source = "\n\n\n".join(parts) + "\n"
    weights = _weights(specs, values, root_name)
    out_shape = tuple(d.render(size_name) if isinstance(d, Sym) else d
                      for d in an.shapes[first.out])
    ex = TorchExport(
        source=source, weights=weights, class_name=root_name,
        inputs={k: (tuple(size_name if d is None else d for d in s), dt)  # type: ignore
                for k, (s, dt) in decls.items()},
        output_shape=out_shape, output_dtype=first.graph[first.out].dtype,
        param_names=list(specs), size_name=size_name)
    if path is not None:
        ex.save(path, weights_path)
    return ex


def _header(root: Module, root_name: str, an: _Analysis, writer: _Writer,
            decls: Mapping[str, Any], path: Any) -> str:
    from ..version import __version__

    stem = Path(path).stem if path is not None else "exported_model"
    title = (f'"""PyTorch port of {type(root).__name__}, written by tensorgrad {__version__} '
             "(tg.export.torch).")
    lines = [title, "",
             "    from safetensors.torch import load_file",
             f"    from {stem} import {root_name}", "",
             f"    model = {root_name}()",
             f'    model.load_state_dict(load_file("{stem}.safetensors"))',
             f"    out = model({', '.join(an.input_names)})", "",
             f"forward: {writer._forward_doc()}."]
    if an.size_name:
        lines.append(f"{an.size_name} is the dim declared None at export; every other size is "
                     "the traced one.")
    lines += ["Param names and layouts are tensorgrad's (Linear.W is [in, out]: y = x @ W + b,",
              'the transpose of torch.nn.Linear.weight)."""']
    return "\n".join(lines)


def _weights(specs: Mapping[str, Any], values: Mapping[str, Any], class_name: str) -> bytes:
    from ..hostdata import to_bytes
    from ..safetensors import save_safetensors
    from ..version import __version__

    missing = [n for n in specs if n not in values]
    if missing:
        raise ExportError(f"no values for param(s) {missing}")
    tensors = {}
    for name, spec in specs.items():
        if spec.dtype != "f32":
            raise ExportError(f"param '{name}' is {spec.dtype}: the weights file holds f32 "
                              "params only", op="param")
        raw = to_bytes(f"param '{name}'", values[name], spec.shape, spec.dtype, param=True)
        tensors[name] = memoryview(bytes(raw)).cast("f", list(spec.shape))
    return save_safetensors(tensors, metadata={"format": "pt", "exporter": "tensorgrad",
                                               "tensorgrad": __version__,
                                               "class": class_name})
