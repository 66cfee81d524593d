"""tensorgrad's documentation site: the reference pages it generates, and the mkdocs hook.

    python build.py docs     mkdocs build --strict into dist/docs/ (mkdocs.yml names this hook)

The hand-written pages live in docs/ (guides). The reference is generated here on every build,
from the package itself, so it cannot drift: one mkdocstrings entry per public name (the
``__all__`` of ``tensorgrad`` and of the public submodules in :data:`PUBLIC_MODULES`; the public
ops come from the op table's ``PUBLIC``), the op table page (every primitive of
``tensorgrad.ops.registry.OPS``: its doc line, kernel and gradient rule) and the JS client's
page (``web/tensorgrad.js``: its exports and methods, from their JSDoc comments).
The docs tests (tests/unit/test_docs.py) use the same helpers.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent
DOCS = ROOT / "docs"
JS_CLIENT = ROOT / "web" / "tensorgrad.js"

# The modules whose `__all__` is public API (tensorgrad's own includes the public ops).
PUBLIC_MODULES = ("tensorgrad", "tensorgrad.nn", "tensorgrad.optim", "tensorgrad.lr",
                  "tensorgrad.init", "tensorgrad.export", "tensorgrad.web")

# How the reference pages group tensorgrad's top-level names (a name missing here is listed
# under "More" on the first page, so a new public name always has a place).
TOP_LEVEL = {
    "Compile and train": ("compile", "compile_forward", "Training", "Forward", "Result",
                          "Completed", "Aborted", "Failed", "Captures", "single_flight",
                          "default_device", "check_webgpu", "WebGPUSupport"),
    "Tracing": ("trace", "trace_forward"),
    "Checkpoints": ("save_safetensors", "load_safetensors"),
}
MODEL_NAMES = ("Module", "Tensor")
SUBMODULE_PAGES = {  # top-level module names documented on a page of their own
    "optim": ("reference/optim.md", "tensorgrad.optim"),
    "lr": ("reference/lr.md", "tensorgrad.lr"),
    "init": ("reference/init.md", "tensorgrad.init"),
    "export": ("reference/export.md", "tensorgrad.export"),
    "ops": ("reference/ops.md", "tensorgrad.ops"),
}


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def public_names() -> dict[str, list[str]]:
    """{module: its public names} for every module of :data:`PUBLIC_MODULES`."""
    return {m: list(_module(m).__all__) for m in PUBLIC_MODULES}


def public_ops() -> dict[str, Callable[..., Any]]:
    """The op table's public functions (`tg.relu`, ...), by name."""
    from tensorgrad.ops.registry import PUBLIC

    return dict(sorted(PUBLIC.items()))


def canonical_path(obj: Any) -> str | None:
    """Where `obj` is defined (`tensorgrad.nn.Linear`), for classes, functions and modules."""
    if inspect.ismodule(obj):
        return obj.__name__
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(name, str) and "<" not in name:
        return f"{module}.{name}"
    return None


# ---- reference pages -------------------------------------------------------------------------

@dataclass
class Section:
    """A heading, a paragraph and the objects it documents (dotted paths for mkdocstrings)."""

    heading: str
    text: str = ""
    objects: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Page:
    """One generated reference page."""

    path: str
    title: str
    intro: str
    sections: list[Section]


def _entry(path: str, options: dict[str, Any]) -> str:
    lines = [f"::: {path}"]
    if options:
        lines.append("    options:")
        lines += [f"      {k}: {json.dumps(v)}" for k, v in options.items()]
    return "\n".join(lines)


def render(page: Page) -> str:
    """The page as Markdown with mkdocstrings `:::` entries."""
    out = [f"# {page.title}", "", page.intro.strip(), ""]
    for s in page.sections:
        out += [f"## {s.heading}", ""] + ([s.text.strip(), ""] if s.text else [])
        for path in s.objects:
            out += [_entry(path, {"heading_level": 3, **s.options}), ""]
    return "\n".join(out)


def _module_page(path: str, module: str, title: str, intro: str) -> Page:
    """A submodule's page: its docstring, then its `__all__` in order."""
    entry = _entry(module, {"members": list(_module(module).__all__), "heading_level": 2,
                            "show_root_heading": True, "show_root_toc_entry": False})
    return Page(path, title, f"{intro}\n\n{entry}", [])


def _ops_page() -> Page:
    families: dict[str, list[str]] = {}
    for name, fn in public_ops().items():
        families.setdefault(fn.__module__, []).append(f"{fn.__module__}.{name}")
    sections = [Section(f"{mod.rsplit('.', 1)[1]}", "", paths,
                        {"show_root_full_path": False, "show_root_heading": True})
                for mod, paths in families.items()]
    intro = ("Every public op, as `tg.<name>` (`import tensorgrad as tg`), grouped by the "
             "module that defines it. The primitives they record, with their shape rules and "
             "gradients, are listed in the [op table](op-table.md).\n\n"
             + _entry("tensorgrad.ops", {"members": False, "show_root_heading": True,
                                         "heading_level": 2, "show_root_toc_entry": False}))
    return Page("reference/ops.md", "Ops", intro, sections)


def reference_pages() -> list[Page]:
    """Every generated page of the Python reference."""
    import tensorgrad as tg
    from tensorgrad.errors import ERRORS

    top = list(tg.__all__)
    placed = {n for group in TOP_LEVEL.values() for n in group} | set(MODEL_NAMES)
    placed |= set(SUBMODULE_PAGES) | set(ERRORS) | set(public_ops())
    placed |= {n for n in top if n in _module("tensorgrad.nn").__all__}
    sections = [Section(h, "", [f"tensorgrad.{n}" for n in names if n in top])
                for h, names in TOP_LEVEL.items()]
    more = [f"tensorgrad.{n}" for n in top if n not in placed]
    if more:
        sections.append(Section("More", "", more))
    layers = [f"tensorgrad.nn.{n}" for n in _module("tensorgrad.nn").__all__]
    pages = [
        Page("reference/api.md", "Compile, train, run",
             "The top-level API: `import tensorgrad as tg`.", sections),
        Page("reference/models.md", "Models and layers",
             "Models are `tg.Module` subclasses; the layers below (`tg.Linear`, ...) are "
             "defined in `tensorgrad.nn` and exported at the top level.",
             [Section("Module and Tensor", "", [f"tensorgrad.{n}" for n in MODEL_NAMES]),
              Section("Layers", "", layers)]),
        _ops_page(),
        Page("reference/errors.md", "Errors",
             "Every exception tensorgrad raises on purpose (`tensorgrad/errors.py`). The "
             "[troubleshooting guide](../guides/troubleshooting.md) says what causes each and "
             "how to fix it.",
             [Section("Exceptions", "", [f"tensorgrad.{n}" for n in ERRORS])]),
        _module_page("reference/optim.md", "tensorgrad.optim", "Optimizers (`tg.optim`)",
                     "Optimizer configs and the update ops they append to a training graph."),
        _module_page("reference/lr.md", "tensorgrad.lr", "Learning-rate schedules (`tg.lr`)",
                     "A learning rate is a number or one of these schedules."),
        _module_page("reference/init.md", "tensorgrad.init", "Param init (`tg.init`)",
                     "Init specs for `Module.param` and the seeded generator behind them."),
        _module_page("reference/export.md", "tensorgrad.export",
                     "Export to PyTorch (`tg.export`)",
                     "See the [export guide](../guides/export.md) for a walk-through."),
        _module_page("reference/web.md", "tensorgrad.web", "Browser, Python side "
                     "(`tensorgrad.web`)",
                     "The Python page client (PyScript), script mode and the worker's helpers. "
                     "The JS client is on [its own page](js.md)."),
    ]
    return pages


def documented_objects() -> list[str]:
    """Every dotted path the generated reference pages give to mkdocstrings (module pages
    add their `members`)."""
    out = []
    for page in reference_pages():
        text = render(page)
        for path, options in re.findall(r"^::: (\S+)\n((?:    .*\n?)*)", text, re.MULTILINE):
            out.append(path)
            members = re.search(r"members: (\[.*\])", options)
            if members:
                out += [f"{path}.{m}" for m in json.loads(members[1])]
    return out


# ---- the op table ----------------------------------------------------------------------------

# One example call per public op: the expression (shown as is, and traced) and its tensors
# ({name: shape} f32, or (shape, "i32")). The op table page traces each one to show the shapes
# in and out, the primitives it records and what its backward records.
F = (2, 3)
OP_EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "abs": ("tg.abs(x)", {"x": F}),
    "add": ("tg.add(a, b)", {"a": F, "b": (3,)}),
    "arange": ("tg.arange(5)", {}),
    "argmax": ("tg.argmax(x, axis=1)", {"x": F}),
    "argmin": ("tg.argmin(x, axis=1)", {"x": F}),
    "capture": ('tg.capture("h", x)', {"x": F}),
    "categorical": ("tg.categorical(logits)", {"logits": (2, 5)}),
    "clamp": ("tg.clamp(x, min=-0.5, max=0.5)", {"x": F}),
    "concat": ("tg.concat([a, b], axis=1)", {"a": F, "b": (2, 2)}),
    "conv2d": ("tg.conv2d(x, w, padding=1)", {"x": (1, 2, 5, 5), "w": (3, 2, 3, 3)}),
    "cos": ("tg.cos(x)", {"x": F}),
    "cross_entropy": ("tg.cross_entropy(logits, targets)",
                      {"logits": (4, 5), "targets": ((4,), "i32")}),
    "div": ("tg.div(a, b)", {"a": F, "b": F}),
    "dropout": ("tg.dropout(x, 0.5)", {"x": F}),
    "embedding": ("tg.embedding(table, idx)", {"table": (10, 4), "idx": ((2, 3), "i32")}),
    "erf": ("tg.erf(x)", {"x": F}),
    "exp": ("tg.exp(x)", {"x": F}),
    "gelu": ("tg.gelu(x)", {"x": F}),
    "greater": ("tg.greater(a, b)", {"a": F, "b": F}),
    "layer_norm": ("tg.layer_norm(x, weight, bias)", {"x": (2, 4), "weight": (4,), "bias": (4,)}),
    "leaky_relu": ("tg.leaky_relu(x)", {"x": F}),
    "less": ("tg.less(a, b)", {"a": F, "b": F}),
    "log": ("tg.log(x)", {"x": F}),
    "log_softmax": ("tg.log_softmax(x)", {"x": (2, 5)}),
    "matmul": ("tg.matmul(a, b)", {"a": F, "b": (3, 4)}),
    "max_pool2d": ("tg.max_pool2d(x, 2)", {"x": (1, 1, 4, 4)}),
    "maximum": ("tg.maximum(a, b)", {"a": F, "b": F}),
    "mean": ("tg.mean(x, axis=1)", {"x": F}),
    "merge_heads": ("tg.merge_heads(x)", {"x": (2, 4, 3, 5)}),
    "minimum": ("tg.minimum(a, b)", {"a": F, "b": F}),
    "mul": ("tg.mul(a, b)", {"a": F, "b": F}),
    "narrow": ("tg.narrow(x, 0, 1, 2)", {"x": (4, 3)}),
    "nearest_upsample2d": ("tg.nearest_upsample2d(x, 2)", {"x": (1, 1, 2, 2)}),
    "neg": ("tg.neg(x)", {"x": F}),
    "nll_loss": ("tg.nll_loss(log_probs, targets)",
                 {"log_probs": (4, 5), "targets": ((4,), "i32")}),
    "one_hot": ("tg.one_hot(idx, 4)", {"idx": ((3,), "i32")}),
    "ones": ("tg.ones((2, 3))", {}),
    "permute": ("tg.permute(x, (2, 0, 1))", {"x": (2, 3, 4)}),
    "randn": ("tg.randn((2, 3))", {}),
    "relu": ("tg.relu(x)", {"x": F}),
    "reshape": ("tg.reshape(x, (3, 2))", {"x": F}),
    "rms_norm": ("tg.rms_norm(x, weight)", {"x": (2, 4), "weight": (4,)}),
    "rope": ("tg.rope(q, k)", {"q": (1, 4, 8), "k": (1, 4, 8)}),
    "rsqrt": ("tg.rsqrt(x)", {"x": F}),
    "scaled_dot_product_attention": ("tg.scaled_dot_product_attention(q, k, v, is_causal=True)",
                                     {"q": (1, 2, 4, 8), "k": (1, 2, 4, 8),
                                      "v": (1, 2, 4, 8)}),
    "sigmoid": ("tg.sigmoid(x)", {"x": F}),
    "silu": ("tg.silu(x)", {"x": F}),
    "sin": ("tg.sin(x)", {"x": F}),
    "softmax": ("tg.softmax(x)", {"x": (2, 5)}),
    "softmax_causal": ("tg.softmax_causal(x)", {"x": (4, 4)}),
    "softplus": ("tg.softplus(x)", {"x": F}),
    "split": ("tg.split(x, [2, 4])", {"x": (6, 2)}),
    "split_heads": ("tg.split_heads(x, 2)", {"x": (2, 4, 6)}),
    "sqrt": ("tg.sqrt(x)", {"x": F}),
    "square": ("tg.square(x)", {"x": F}),
    "stack": ("tg.stack([a, b])", {"a": F, "b": F}),
    "stop_gradient": ("tg.stop_gradient(x)", {"x": F}),
    "sub": ("tg.sub(a, b)", {"a": F, "b": F}),
    "sum": ("tg.sum(x, axis=1)", {"x": F}),
    "swap_axes": ("tg.swap_axes(x, 0, 2)", {"x": (2, 3, 4)}),
    "take_along_axis": ("tg.take_along_axis(x, idx, 1)", {"x": (2, 5), "idx": ((2, 3), "i32")}),
    "tanh": ("tg.tanh(x)", {"x": F}),
    "where": ("tg.where(tg.greater(a, 0.0), a, b)", {"a": F, "b": F}),
    "where_causal": ('tg.where_causal(x, float("-inf"))', {"x": (4, 4)}),
    "zeros": ("tg.zeros((2, 3))", {}),
}


def _type(node: Any) -> str:
    return f"{node.dtype}{list(node.shape)}"


@dataclass
class OpExample:
    """One public op's example, traced: its inputs, outputs, forward primitives, the inputs a
    gradient reaches and the primitives the backward records."""

    expr: str
    inputs: dict[str, str]
    outputs: list[str]
    forward: list[str]
    grad_to: list[str]
    backward: list[str]
    instances: dict[str, str]   # primitive -> "in, in -> out" of its first node here


def _backward(graph: Any, seeds: dict[int, Any]) -> set[int]:
    """Append the backward of `graph` from the cotangents `seeds` ({node id: Tensor}), with
    each op's own VJP rule (what autograd.append_grad does from a loss); the ids of the leaves
    a gradient reached."""
    from tensorgrad.ir import LEAF_OPS
    from tensorgrad.ops import add
    from tensorgrad.ops.registry import GRAD_ERROR, NO_GRAD, OPS
    from tensorgrad.tensor import Tensor

    cot = dict(seeds)
    for node in reversed(list(graph.nodes)):
        dy = cot.pop(node.id, None)
        if dy is None or node.op in LEAF_OPS:
            if dy is not None:
                cot[node.id] = dy
            continue
        rule = OPS[node.op].vjp
        if rule in (NO_GRAD, GRAD_ERROR):
            continue
        grads = rule([Tensor(graph, i) for i in node.inputs], Tensor(graph, node.id), dy,
                     node.attrs)
        for i, g in zip(node.inputs, grads):
            if g is not None and graph[i].dtype == "f32":
                cot[i] = g if i not in cot else add(cot[i], g)
    return {i for i in cot if graph[i].op in LEAF_OPS}


def op_example(name: str) -> OpExample:
    """Trace `OP_EXAMPLES[name]` and its backward from a cotangent per f32 output."""
    import tensorgrad as tg
    from tensorgrad.ir import LEAF_OPS, Graph
    from tensorgrad.tensor import Tensor, leaf, tracing

    expr, decls = OP_EXAMPLES[name]
    graph = Graph()
    with tracing(graph):
        env: dict[str, Any] = {"tg": tg}
        for arg, decl in decls.items():
            shape, dtype = (decl if isinstance(decl[-1], str) else (decl, "f32"))
            env[arg] = leaf("param" if dtype == "f32" else "input", arg, shape, dtype)
        start = len(graph.nodes)
        value = eval(expr, env)
        end = len(graph.nodes)
        outs = list(value) if isinstance(value, (list, tuple)) else [value]
        seeds = {o.id: leaf("input", f"d{k}", o.shape, "f32")
                 for k, o in enumerate(outs) if o.dtype == "f32"}
        mark = len(graph.nodes)
        reached_ids = _backward(graph, seeds)
    nodes = graph.nodes
    reached = {nodes[i].attrs["name"] for i in reached_ids}
    instances: dict[str, str] = {}
    for n in nodes[start:end] + nodes[mark:]:
        if n.op not in LEAF_OPS:
            instances.setdefault(n.op, ", ".join(_type(nodes[i]) for i in n.inputs)
                                 + f" → {_type(n)}")
    assert all(isinstance(o, Tensor) for o in outs)
    return OpExample(
        expr, {a: _type(nodes[t.id]) for a, t in env.items() if isinstance(t, Tensor)},
        [_type(nodes[o.id]) for o in outs],
        [n.op for n in nodes[start:end] if n.op not in LEAF_OPS],
        [a for a in decls if a in reached and nodes[env[a].id].op == "param"],
        [n.op for n in nodes[mark:] if n.op not in LEAF_OPS], instances)


def _gradient(op: Any) -> tuple[str, str]:
    """(short label, sentence) for an OpDef's backward rule."""
    from tensorgrad.ops.registry import GRAD_ERROR, NO_GRAD

    if op.vjp == NO_GRAD:
        return "none", "No gradient flows back through it (`NO_GRAD`)."
    if op.vjp == GRAD_ERROR:
        return "error", ("A backward or optimizer op: differentiating through it raises "
                         "(`GRAD_ERROR`).")
    return "yes", "Differentiable: its backward rule, written in forward ops, is below."


def _kernel(op: Any) -> str:
    parts = []
    if op.expr is not None:
        parts.append("elementwise (fusable)")
    if op.view is not None:
        parts.append("a view of its input where the plan allows")
    if op.pack:
        parts.append("placed by the buffer plan (no kernel)")
    if op.stitch is not None:
        if op.stitch.prologue:
            parts.append("stitches elementwise producers of inputs "
                         + ", ".join(str(k) for k in op.stitch.prologue))
        if op.stitch.epilogue:
            parts.append("stitches an elementwise epilogue")
    if op.zeros is not None:
        parts.append("tracks zero triangles")
    return "; ".join(parts) or "its own kernel"


def _vjp_source(op: Any) -> str:
    try:
        return textwrap.dedent(inspect.getsource(op.vjp)).rstrip()
    except (OSError, TypeError):
        return ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _counted(ops: list[str]) -> str:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"[{op}](#{op})" + (f" ×{n}" if n > 1 else "") for op, n in counts.items())


def op_table_markdown() -> str:
    """The op table page: each public op's example traced (shapes in and out, primitives,
    gradient), then every primitive of tensorgrad.ops.registry.OPS with its doc line, an
    instance of its shapes, its kernel kind and its gradient rule."""
    from tensorgrad.ops.registry import OPS

    examples = {name: op_example(name) for name in public_ops() if name in OP_EXAMPLES}
    users: dict[str, list[str]] = {}
    instances: dict[str, str] = {}
    for name, ex in examples.items():
        for p in dict.fromkeys(ex.forward):
            users.setdefault(p, []).append(name)
        for p, text in ex.instances.items():
            instances.setdefault(p, f"{text} (in `tg.{name}`'s example)")
    out = ["# Op table", "",
           ("Generated from the op table (`tensorgrad/ops/registry.py`) when the docs are "
           "built. A *public op* is what you call (`tg.matmul`); it records one or more "
           "*primitives* into the graph. The first table traces one example call of each "
           "public op: the tensors in and out, the primitives it records, the inputs its "
           "gradient reaches and the primitives its backward records (every backward rule is "
           "written in forward ops). The second lists every primitive: its doc line (the shape "
           "rule), its kernel and its gradient rule — *yes* (a backward rule), *none* (no "
           "gradient flows back) or *error* (backward and optimizer ops, never "
           "differentiated)."), "",
           "## Public ops", "",
           "| op | example: in → out | records | gradient: to (backward records) |",
           "|---|---|---|---|"]
    for name, fn in public_ops().items():
        ex = examples.get(name)
        link = f"[`tg.{name}`][{fn.__module__}.{name}]"
        if ex is None:
            out.append(f"| {link} | (no example) | | |")
            continue
        ins = ", ".join(f"{a}: `{t}`" for a, t in ex.inputs.items()) or "—"
        outs = ", ".join(f"`{t}`" for t in ex.outputs)
        grad = "none" if not ex.grad_to else f"to {', '.join(ex.grad_to)}" + (
            f" ({_counted(ex.backward)})" if ex.backward else "")
        out.append(f"| {link} | `{_cell(ex.expr)}`<br>{ins} → {outs} | "
                   f"{_counted(ex.forward) or '—'} | {grad} |")
    out += ["", "## Primitives", "", "| primitive | shapes | gradient |", "|---|---|---|"]
    for name, op in OPS.items():
        out.append(f"| [{name}](#{name}) | {_cell(op.doc)} | {_gradient(op)[0]} |")
    for name, op in OPS.items():
        label, sentence = _gradient(op)
        out += ["", f"### {name} {{#{name}}}", "", op.doc, ""]
        if name in instances:
            out.append(f"- for example: `{instances[name].split(' (')[0]}`"
                       + instances[name][len(instances[name].split(' (')[0]):])
        out += [f"- kernel: {_kernel(op)}", f"- gradient: **{label}**. {sentence}"]
        if users.get(name):
            out.append("- recorded by: " + ", ".join(f"`tg.{u}`" for u in users[name]))
        source = _vjp_source(op) if label == "yes" else ""
        if source:
            out += ["", '??? note "backward rule"', "", "    ```python"]
            out += [f"    {line}" if line else "" for line in source.splitlines()]
            out.append("    ```")
    return "\n".join(out) + "\n"


# ---- the JS client ---------------------------------------------------------------------------

@dataclass
class JsItem:
    """A documented piece of web/tensorgrad.js: an exported class or function, a method or a
    public field of an exported class."""

    kind: str          # "class" | "function" | "method" | "field"
    name: str
    signature: str
    doc: str
    owner: str = ""    # the class of a method or field
    extends: str = ""


_DECL = {
    "class": re.compile(r"^export class (\w+)(?: extends (\w+))?"),
    "function": re.compile(r"^export (?:async )?function (\w+)\s*\("),
    "method": re.compile(r"^  (?:static )?(?:async )?(?:get |set )?(\w+)\s*\("),
    "field": re.compile(r"^    this\.([A-Za-z]\w*) = .*?;\s*//\s*(.*)$"),
}
_NOT_METHODS = {"if", "for", "while", "switch", "catch", "return", "function"}


def _jsdoc(lines: list[str]) -> str:
    text = "\n".join(lines).strip()
    text = re.sub(r"^/\*\*|\*/$", "", text).strip()
    return "\n".join(re.sub(r"^\s*\* ?", "", line) for line in text.splitlines()).strip()


def _balanced(lines: list[str], start: int, column: int) -> str:
    """The text from the '(' at lines[start][column] to its matching ')'."""
    depth, out = 0, []
    for line in lines[start:]:
        for ch in line[column:]:
            out.append(ch)
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return re.sub(r"\s+", " ", "".join(out))
        out.append(" ")
        column = 0
    return "".join(out)


def js_api(source: str | None = None) -> list[JsItem]:
    """The exported classes and functions of web/tensorgrad.js, their methods and public
    fields, each with its JSDoc comment ("" where it has none)."""
    lines = (JS_CLIENT.read_text() if source is None else source).splitlines()
    items: list[JsItem] = []
    pending: list[str] = []
    doc, owner, i = "", "", 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("/**"):
            pending = [line]
            while not lines[i].rstrip().endswith("*/"):
                i += 1
                pending.append(lines[i])
            doc, i = _jsdoc(pending), i + 1
            continue
        if owner and line.startswith("}"):
            owner = ""
        match = _DECL["class"].match(line)
        if match:
            owner = match[1]
            items.append(JsItem("class", owner, "", doc, extends=match[2] or ""))
        elif (match := _DECL["function"].match(line)):
            sig = _balanced(lines, i, line.index("("))
            items.append(JsItem("function", match[1], sig, doc))
        elif owner and (match := _DECL["method"].match(line)) and \
                match[1] not in _NOT_METHODS and not match[1].startswith("_"):
            sig = _balanced(lines, i, line.index("(", match.start(1)))
            if match[1] != "constructor":
                items.append(JsItem("method", match[1], sig, doc, owner))
        elif owner and (match := _DECL["field"].match(line)):
            items.append(JsItem("field", match[1], "", match[2].strip(), owner))
        if stripped and not stripped.startswith("//"):
            doc = ""
        i += 1
    return items


def js_reference_markdown() -> str:
    """The JS client's page: every export, its methods and fields, then the protocol table."""
    from tensorgrad.web.protocol import EVENTS, MESSAGES

    out = ["# JS page client (`tensorgrad.js`)", "",
           ("Generated from the JSDoc comments of `web/tensorgrad.js` (served at "
           "`/tensorgrad.js` by the bundle). Import it as an ES module; the [browser guide]"
           "(../guides/browser.md) shows it at work."), ""]
    items = js_api()
    for top in (it for it in items if it.kind in ("class", "function")):
        if top.kind == "class":
            ext = f" extends `{top.extends}`" if top.extends else ""
            out += [f"## class `{top.name}`{ext} {{#js-{top.name}}}", "", top.doc, ""]
            fields = [it for it in items if it.owner == top.name and it.kind == "field"]
            if fields:
                out += ["| field | |", "|---|---|"]
                out += [f"| `{f.name}` | {_cell(f.doc)} |" for f in fields]
                out.append("")
            for m in (it for it in items if it.owner == top.name and it.kind == "method"):
                out += [f"### `{top.name}.{m.name}()` {{#js-{top.name}-{m.name}}}", "",
                        "```js", f"{m.name}{m.signature}", "```", "", m.doc, ""]
        else:
            out += [f"## `{top.name}()` {{#js-{top.name}}}", "",
                    "```js", f"{top.name}{top.signature}", "```", "", top.doc, ""]
    out += ["## Protocol", "",
            ("Every request the client sends (`session.request(kind, payload)`) and its reply, "
            "from `tensorgrad/web/protocol.py`, which the worker and both clients check:"), "",
            "| kind | payload (`?`: optional) | reply | what it does |", "|---|---|---|---|"]
    for kind, m in MESSAGES.items():
        fields = ", ".join([*m.required, *(f"{f}?" for f in m.optional)])
        reply = m.reply if isinstance(m.reply, str) else "{" + ", ".join(m.reply) + "}"
        out.append(f"| `{kind}` | {_cell(fields)} | {_cell(reply)} | {_cell(m.doc)} |")
    out += ["", "Messages the worker sends on its own: "
            + "; ".join(f"`{k}` ({', '.join(v)})" for k, v in EVENTS.items()) + "."]
    return "\n".join(out) + "\n"


# ---- code blocks of the guides (for the docs tests) ------------------------------------------

@dataclass
class Block:
    """A fenced code block of a Markdown file: its language, classes (`{.python .no-run}`),
    code and where it starts."""

    path: Path
    line: int
    lang: str
    classes: tuple[str, ...]
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[^\n]*)$")


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (nested in lists or admonitions too)."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = len(match["indent"]), match["fence"], match["info"].strip()
        if info.startswith("{"):
            classes = tuple(c[1:] for c in info.strip("{} ").split() if c.startswith("."))
            lang, classes = (classes[0] if classes else ""), classes[1:]
        else:
            lang, classes = (info.split() or [""])[0], ()
        body, start = [], i + 1
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i][indent:])
            i += 1
        blocks.append(Block(path, start, lang, classes, "\n".join(body) + "\n"))
        i += 1
    return blocks


def guide_files() -> list[Path]:
    """The hand-written pages whose code blocks the tests run, and the README."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


# ---- the mkdocs hook -------------------------------------------------------------------------

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>~?([^<]+)</code>")


def generated_pages() -> dict[str, str]:
    """{docs-relative path: Markdown} of every generated page."""
    pages = {p.path: render(p) for p in reference_pages()}
    pages["reference/op-table.md"] = op_table_markdown()
    pages["reference/js.md"] = js_reference_markdown()
    return pages


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the generated reference pages to the site."""
    from mkdocs.structure.files import File

    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    return files


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: Sphinx roles left in docstrings (:class:`X`) read as code."""
    return _ROLE.sub(lambda m: f"<code>{m[1].rsplit('.', 1)[-1] if '~' in m[0] else m[1]}"
                     "</code>", html)


def iter_public() -> Iterator[tuple[str, str, Any]]:
    """(module, name, object) for every public name."""
    for module, names in public_names().items():
        mod = _module(module)
        for name in names:
            yield module, name, getattr(mod, name)
