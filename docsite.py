"""tensorgrad's documentation site: the reference pages it generates, and the mkdocs hook.

    python build.py docs     mkdocs build --strict into dist/docs/ (mkdocs.yml names this hook)

The hand-written pages live in docs/ (guides). The reference is generated here on every build,
from the package itself, so it cannot drift: one mkdocstrings entry per public name (the
``__all__`` of ``tensorgrad`` and of the public submodules in :data:`PUBLIC_MODULES`; the public
ops come from the op table's ``PUBLIC``), the op table page (docsite_ops.py: every public op
traced from an example call, every primitive of ``tensorgrad.ops.registry.OPS`` with its doc
line, kernel and gradient rule) and the JS client's page (``web/tensorgrad.js``: its exports
and methods, from their JSDoc comments).
The docs tests (tests/unit/test_docs.py) use the same helpers.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # (mkdocs loads this file as a hook: its sibling below)
from docsite_ops import cell, op_table_markdown, public_ops

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
    entries: list[str] = field(default_factory=list)  # Markdown written here, not by mkdocstrings


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


def _hidden_base(obj: Any) -> bool:
    """Whether `obj` is a class with a base of tensorgrad's own that is not public API (so
    has no entry of its own): `tg.Training` and `tg.Forward` (`tensorgrad.handle.Handle`),
    `tg.optim.Adam` and `AdamW` (their shared update)."""
    if not inspect.isclass(obj):
        return False
    public = {id(getattr(_module(m), n)) for m, names in public_names().items() for n in names}
    return any(b.__module__.startswith("tensorgrad") and id(b) not in public
               for b in obj.__mro__[1:])


def _inherits(path: str) -> dict[str, Any]:
    """`inherited_members` for the entry of a class with a hidden base (:func:`_hidden_base`):
    it shows the members it inherits as its own."""
    module, _, name = path.rpartition(".")
    obj = getattr(_module(module), name, None) if module else None
    return {"inherited_members": True} if _hidden_base(obj) else {}


def render(page: Page) -> str:
    """The page as Markdown with mkdocstrings `:::` entries."""
    out = [f"# {page.title}", "", page.intro.strip(), ""]
    for s in page.sections:
        out += [f"## {s.heading}", ""] + ([s.text.strip(), ""] if s.text else [])
        for path in s.objects:
            out += [_entry(path, {"heading_level": 3, **s.options, **_inherits(path)}), ""]
        out += [f"{entry}\n" for entry in s.entries]
    return "\n".join(out)


def _module_page(path: str, module: str, title: str, intro: str) -> Page:
    """A submodule's page: its docstring, then its `__all__` in order (with inherited
    members where a class has a hidden base)."""
    names = list(_module(module).__all__)
    inherits = any(_hidden_base(getattr(_module(module), n)) for n in names)
    entry = _entry(module, {"members": names, "heading_level": 2, "show_root_heading": True,
                            "show_root_toc_entry": False,
                            **({"inherited_members": True} if inherits else {})})
    return Page(path, title, f"{intro}\n\n{entry}", [])


def _made_entry(name: str, fn: Callable[..., Any]) -> str:
    """The entry of an op function made by a factory (`tg.relu` from `_unary(...)`), which the
    source alone does not show mkdocstrings: its runtime signature and docstring."""
    path = f"{fn.__module__}.{name}"
    doc = inspect.cleandoc(fn.__doc__ or "")
    symbol = '<code class="doc-symbol doc-symbol-heading doc-symbol-function"></code>'
    return (f"### {symbol} `{name}` {{#{path} data-toc-label=\"{name}\"}}\n\n"
            f"```python\n{name}{str(inspect.signature(fn)).replace(chr(39), '')}\n```\n\n"
            f"{doc}\n")


def _ops_page() -> Page:
    sections: dict[str, Section] = {}
    options = {"show_root_full_path": False, "show_root_heading": True}
    for name, fn in public_ops().items():
        section = sections.setdefault(fn.__module__, Section(fn.__module__.rsplit(".", 1)[1]))
        section.entries.append(
            _entry(f"{fn.__module__}.{name}", {"heading_level": 3, **options})
            if fn.__code__.co_name == name else _made_entry(name, fn))
    intro = ("Every public op, as `tg.<name>` (`import tensorgrad as tg`), grouped by the "
             "module that defines it. The primitives they record, with their shape rules and "
             "gradients, are listed in the [op table](op-table.md).\n\n"
             + _entry("tensorgrad.ops", {"members": False, "show_root_heading": True,
                                         "heading_level": 2, "show_root_toc_entry": False}))
    return Page("reference/ops.md", "Ops", intro, list(sections.values()))


def _top_path(name: str) -> str:
    """The path mkdocstrings should document `tg.<name>` by: `tensorgrad.<name>`, unless a
    submodule of that name hides the object from a reading of the source (`tg.trace` is the
    function `tensorgrad.compiler.trace`, `tensorgrad/trace.py` a module): then where the
    object is defined."""
    import importlib.util

    import tensorgrad as tg

    obj = getattr(tg, name)
    shadowed = not inspect.ismodule(obj) and importlib.util.find_spec(f"tensorgrad.{name}")
    return (canonical_path(obj) or f"tensorgrad.{name}") if shadowed else f"tensorgrad.{name}"


def reference_pages() -> list[Page]:
    """Every generated page of the Python reference."""
    import tensorgrad as tg
    from tensorgrad.errors import ERRORS

    top = list(tg.__all__)
    placed = {n for group in TOP_LEVEL.values() for n in group} | set(MODEL_NAMES)
    placed |= set(SUBMODULE_PAGES) | set(ERRORS) | set(public_ops())
    placed |= {n for n in top if n in _module("tensorgrad.nn").__all__}
    sections = [Section(h, "", [_top_path(n) for n in names if n in top])
                for h, names in TOP_LEVEL.items()]
    more = [_top_path(n) for n in top if n not in placed]
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
    "constant": re.compile(r"^export const (\w+)\s*="),
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
        elif (match := _DECL["constant"].match(line)):
            items.append(JsItem("constant", match[1], "", doc))
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
    from tensorgrad.web.protocol import EVENTS, MESSAGES, TYPES

    out = ["# JS page client (`tensorgrad.js`)", "",
           ("Generated from the JSDoc comments of `web/tensorgrad.js` (served at "
           "`/tensorgrad.js` by the bundle). Import it as an ES module; the [browser guide]"
           "(../guides/browser.md) shows it at work."), ""]
    items = js_api()
    for top in (it for it in items if it.kind in ("class", "function", "constant")):
        if top.kind == "class":
            ext = f" extends `{top.extends}`" if top.extends else ""
            out += [f"## class `{top.name}`{ext} {{#js-{top.name}}}", "", top.doc, ""]
            fields = [it for it in items if it.owner == top.name and it.kind == "field"]
            if fields:
                out += ["| field | |", "|---|---|"]
                out += [f"| `{f.name}` | {cell(f.doc)} |" for f in fields]
                out.append("")
            for m in (it for it in items if it.owner == top.name and it.kind == "method"):
                out += [f"### `{top.name}.{m.name}()` {{#js-{top.name}-{m.name}}}", "",
                        "```js", f"{m.name}{m.signature}", "```", "", m.doc, ""]
        elif top.kind == "constant":
            out += [f"## `{top.name}` {{#js-{top.name}}}", "", top.doc, ""]
        else:
            out += [f"## `{top.name}()` {{#js-{top.name}}}", "",
                    "```js", f"{top.name}{top.signature}", "```", "", top.doc, ""]
    out += ["## Protocol", "",
            ("Every request the client sends (`session.request(kind, payload)`) and its reply, "
            "from `tensorgrad/web/protocol.py`, which the worker and both clients check, field "
            "types included (`name: type`; `?`: optional; the types are listed below):"), "",
            "| kind | payload | reply | what it does |", "|---|---|---|---|"]
    for kind, m in MESSAGES.items():
        out.append(f"| `{kind}` | {cell(_protocol_fields(m))} | {cell(_protocol_reply(m))} "
                   f"| {cell(m.doc)} |")
    out += ["", "Messages the worker sends on its own:", ""]
    out += [f"- `{k}` {{{_protocol_fields(m)}}}: {m.doc}" for k, m in EVENTS.items()]
    out += ["", "Field types:", "", "| type | a value of it |", "|---|---|"]
    out += [f"| `{name}` | {cell(t.doc)} |" for name, t in TYPES.items()]
    return "\n".join(out) + "\n"


def _protocol_fields(m: Any) -> str:
    """A message's payload fields as `name: type`, optional ones marked with `?`."""
    return ", ".join([*(f"{f}: {t}" for f, t in m.required.items()),
                      *(f"{f}?: {t}" for f, t in m.optional.items())]) or "none"


def _protocol_reply(m: Any) -> str:
    return m.reply if isinstance(m.reply, str) else "{" + ", ".join(m.reply) + "}"


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
