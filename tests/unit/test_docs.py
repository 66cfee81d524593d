"""The documentation: every public name has a docstring and a place in the generated reference,
the strict build passes, the site is offline, the op table and the JS client's page are
complete, the guides cover what they promise, and their code blocks are runnable (the blocks
themselves run in tests/native/test_docs_examples.py and tests/browser/test_docs_examples.py).
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import build
import docsite
import docsite_ops
import tensorgrad as tg
from tensorgrad.errors import ERRORS
from tensorgrad.ops.registry import OPS, PUBLIC


def _own_doc(obj: Any) -> str:
    """The object's own docstring ("" for a dataclass's generated signature line)."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    doc = (doc or "").strip()
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and \
            doc.startswith(f"{obj.__name__}("):
        return ""
    return doc


def _members(cls: type) -> list[tuple[str, Any]]:
    """A public class's own public methods and properties."""
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            value = value.fget
        if inspect.isfunction(value):
            out.append((name, value))
    return out


def _is_data(obj: Any) -> bool:
    return not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj)
                or callable(obj))


def test_every_public_name_has_a_docstring() -> None:
    import griffe

    package = griffe.load("tensorgrad", search_paths=[str(ROOT)])
    missing = []
    for module, name, obj in docsite.iter_public():
        where = f"{module}.{name}"
        if _is_data(obj):  # a constant or type alias: its docstring is the string below it
            path = f"{module}.{name}".removeprefix("tensorgrad").lstrip(".")
            if not package[path].docstring:
                missing.append(where)
            continue
        if not _own_doc(obj):
            missing.append(where)
        if inspect.isclass(obj) and obj.__module__.startswith("tensorgrad"):
            missing += [f"{where}.{m}" for m, fn in _members(obj) if not (fn.__doc__ or "")
                        .strip()]
    assert not missing, f"public names without a docstring: {sorted(set(missing))}"


def test_every_public_op_is_public_and_has_an_example() -> None:
    assert set(PUBLIC) <= set(tg.__all__)
    assert set(docsite_ops.OP_EXAMPLES) == set(PUBLIC), (
        "docsite_ops.OP_EXAMPLES needs one example call per public op (the op table traces it): "
        f"missing {sorted(set(PUBLIC) - set(docsite_ops.OP_EXAMPLES))}, "
        f"unknown {sorted(set(docsite_ops.OP_EXAMPLES) - set(PUBLIC))}")


def _anchors(site: Path, under: str) -> dict[str, set[str]]:
    """{id: the kinds its heading shows (function, class, module, attribute...)} of every
    heading under `under`."""
    ids: dict[str, set[str]] = {}
    for page in (site / under).rglob("*.html"):
        for match in re.finditer(r'<h\d id="([^"]+)"(.*?)</h\d>', page.read_text(), re.DOTALL):
            ids[match[1]] = set(re.findall(r"doc-symbol-(\w+)", match[2])) - {"heading"}
    return ids


def _kind(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    return "function" if callable(obj) else "attribute"


def test_every_public_name_is_in_the_reference(docs_site: Path) -> None:
    ids = _anchors(docs_site, "reference")
    missing = []
    for module, name, obj in docsite.iter_public():
        names = {f"{module}.{name}", docsite.canonical_path(obj)}
        shown = [i for i in names if i in ids and _kind(obj) in ids[i]]
        if not shown:
            missing.append(f"{module}.{name} ({_kind(obj)}; the reference has "
                           f"{ {i: ids[i] for i in names if i in ids} })")
            continue
        if inspect.isclass(obj) and obj.__module__.startswith("tensorgrad"):
            missing += [f"{module}.{name}.{m}" for m, _ in _members(obj)
                        if not {f"{n}.{m}" for n in names if n} & ids.keys()]
    assert not missing, f"public names the built reference lacks: {missing}"


def test_no_cross_reference_is_left_unresolved(docs_site: Path) -> None:
    """`[text][identifier]` that autorefs could not resolve stays as literal text (some
    identifiers, such as a module hidden by a function of the same name, do not even warn)."""
    left = []
    for page in docs_site.rglob("*.html"):
        text = re.sub(r"<(pre|code)\b.*?</\1>", "", page.read_text(), flags=re.DOTALL)
        left += [f"{page.relative_to(docs_site)}: {m}"
                 for m in re.findall(r"\]\[[\w.]+\]", re.sub(r"<[^>]+>", "", text))]
    assert not left, left


def test_the_docs_build_reaches_no_network(docs_build: Any) -> None:
    """The build ran with every connection off this machine refused (and logged)."""
    assert docs_build.guarded_processes >= 1, "the network guard did not load in the build"
    assert not docs_build.reached, f"the docs build tried to reach {docs_build.reached}"


def test_the_site_fetches_nothing_from_elsewhere(docs_site: Path) -> None:
    """No web fonts, CDN scripts or stylesheets: every asset is a file of the site."""
    foreign = []
    for page in docs_site.rglob("*.html"):
        text = page.read_text()
        for tag in re.findall(r"<(?:script|link|img|iframe|source)\b[^>]*>", text):
            for url in re.findall(r'\b(?:src|href)="([^"]+)"', tag):
                if re.match(r"(https?:)?//", url):
                    foreign.append(f"{page.relative_to(docs_site)}: {tag}")
    for sheet in docs_site.rglob("*.css"):
        for url in re.findall(r"(?:url\(|@import\s+)['\"]?((?:https?:)?//[^'\")]+)",
                              sheet.read_text()):
            foreign.append(f"{sheet.relative_to(docs_site)}: {url}")
    assert not foreign, foreign
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^\s*font: false", config, re.MULTILINE), "mkdocs.yml must turn off web fonts"
    assert not re.search(r"^\s*-\s*(social|privacy|optimize)\b", config, re.MULTILINE)


def test_the_op_table_page_lists_every_primitive_and_public_op(docs_site: Path) -> None:
    page = (docs_site / "reference" / "op-table" / "index.html").read_text()
    ids = set(re.findall(r'\bid="([^"]+)"', page))
    assert set(OPS) <= ids, f"primitives missing from the op table: {sorted(set(OPS) - ids)}"
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    for name in PUBLIC:
        assert f"tg.{name}" in text, name
    # the example rows carry the traced shapes, e.g. matmul's [2, 3] @ [3, 4]
    assert "f32[2, 4]" in text and "conv2d_weight_grad" in text


def _node_exports() -> dict[str, list[str]]:
    """What web/tensorgrad.js exports, as Node sees it: {export: its own public methods}."""
    script = """
const m = await import(process.argv[1]);
const out = {};
for (const [name, value] of Object.entries(m)) {
  out[name] = typeof value === "function" && value.prototype && /^class\\b/.test(String(value))
    ? Object.getOwnPropertyNames(value.prototype)
        .filter((k) => k !== "constructor" && !k.startsWith("_")) : [];
}
console.log(JSON.stringify(out));
"""
    out = subprocess.run(["node", "--input-type=module", "-e", script,
                          docsite.JS_CLIENT.as_uri()], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def test_every_exported_js_method_is_documented(docs_site: Path) -> None:
    exports = _node_exports()
    assert {"start", "Session", "Train", "Forward", "checkWebGPU"} <= set(exports)
    documented = {(it.owner, it.name) for it in docsite.js_api() if it.doc}
    undocumented = [name for name in exports if ("", name) not in documented]
    undocumented += [f"{cls}.{m}" for cls, methods in exports.items() for m in methods
                     if (cls, m) not in documented]
    assert not undocumented, f"exported without a /** JSDoc */ comment: {undocumented}"
    ids = set(re.findall(r'\bid="([^"]+)"',
                         (docs_site / "reference" / "js" / "index.html").read_text()))
    expected = {f"js-{n}" for n in exports} | {f"js-{c}-{m}" for c, ms in exports.items()
                                               for m in ms}
    assert expected <= ids, f"missing from the JS page: {sorted(expected - ids)}"


def test_js_api_reads_jsdoc_and_flags_an_undocumented_method() -> None:
    source = """
/** A thing. */
export class Thing {
  /** Does a. */
  a(x, { y = 1 } = {}) { return x; }
  b() { return 2; }
  _hidden() {}
}
"""
    items = {(it.owner, it.name): it for it in docsite.js_api(source)}
    assert items[("", "Thing")].doc == "A thing."
    assert items[("Thing", "a")].doc == "Does a." and items[("Thing", "a")].signature == \
        "(x, { y = 1 } = {})"
    assert items[("Thing", "b")].doc == ""
    assert ("Thing", "_hidden") not in items


def test_troubleshooting_covers_every_exception() -> None:
    text = (ROOT / "docs" / "guides" / "troubleshooting.md").read_text()
    headings = set(re.findall(r"^## (\w+)", text, re.MULTILINE))
    assert set(ERRORS) <= headings, f"no section for {sorted(set(ERRORS) - headings)}"
    assert "ExportError" in text


# ---- the code blocks -------------------------------------------------------------------------

RUNNABLE = {("python", ()), ("python", ("worker",)), ("js", ()), ("html", ())}
MAX_NO_RUN = 3


def test_every_code_block_runs_or_is_marked() -> None:
    blocks = [b for p in docsite.guide_files() for b in docsite.code_blocks(p)]
    assert len(blocks) > 30
    wrong = [f"{b.where}: {b.lang} {b.classes}" for b in blocks
             if (b.lang, b.classes) not in RUNNABLE and b.classes != ("no-run",)
             and b.lang != "sh"]
    assert not wrong, ("a code block must be python, js, html or sh, or marked "
                       f"{{.python .no-run}}: {wrong}")
    no_run = [b.where for b in blocks if b.classes == ("no-run",)]
    assert len(no_run) <= MAX_NO_RUN, f"too many blocks that do not run: {no_run}"
    for b in blocks:
        if b.classes == ("worker",):
            assert "async def main(" in b.code, f"{b.where}: a worker block defines main()"
        if b.lang == "html":
            assert "done" in b.code, f"{b.where}: an html block prints a 'done' line"


def _commands() -> set[str]:
    parser_help = subprocess.run([sys.executable, str(ROOT / "build.py"), "--help"],
                                 capture_output=True, text=True, check=True).stdout
    return set(re.search(r"\{([\w,]+)\}", parser_help)[1].split(","))


def test_sh_blocks_name_commands_and_files_that_exist() -> None:
    commands = _commands()
    for block in (b for p in docsite.guide_files() for b in docsite.code_blocks(p)
                  if b.lang == "sh"):
        for line in block.code.splitlines():
            words = shlex.split(line.split("  #")[0].strip(), comments=True)
            if not words:
                continue
            if words[:2] == ["python", "build.py"]:
                assert words[2] in commands, f"{block.where}: no build.py command {words[2]}"
            elif words[0] in ("python", "bash"):
                assert (ROOT / words[1]).is_file(), f"{block.where}: no file {words[1]}"
            else:
                assert words[:2] == ["pip", "install"], f"{block.where}: {line}"


def test_notebooks_guide_states_the_lite_sites_config() -> None:
    """The notebooks guide gives jupyter-lite.json's settings in its prose: the ones the
    build writes (litebundle.lite_config)."""
    import litebundle

    text = " ".join((ROOT / "docs" / "guides" / "notebooks.md").read_text().split())
    data = litebundle.lite_config()["jupyter-config-data"]
    settings = data["litePluginSettings"]
    assert list(settings) == [litebundle.KERNEL_PLUGIN] and f"`{litebundle.KERNEL_PLUGIN}`" in text
    assert f'`{json.dumps(data["appName"])}` (`appName`)' in text
    for key, value in settings[litebundle.KERNEL_PLUGIN].items():
        assert f"`{json.dumps(key)}: {json.dumps(value)}`" in text, (key, value)


def test_readme_is_a_short_first_screen() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines"
    assert lines[2].split()[:3] == ["python", "build.py", "serve"]
    assert lines[3].split()[:3] == ["python", "build.py", "test"]
    text = "\n".join(lines)
    for name in build.demo_names():
        assert f"`{name}`" in text, f"the README's demo list lacks {name}"
    for page in ("concepts", "browser", "pyscript", "export", "performance", "checkpoints",
                 "troubleshooting"):
        assert f"docs/guides/{page}.md" in text


def test_benchmark_history_has_a_heading_per_dated_entry() -> None:
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    headings = re.findall(r"^## (.*)$", text, re.MULTILINE)
    dated = [h for h in headings if re.match(r"\d{4}-\d{2}-\d{2}\b", h)]
    assert len(dated) >= 9, headings
    assert text.count("\n|---") >= 5  # the tables moved along with the text


def test_docs_dependencies_are_pinned_in_the_test_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["docs"] and all("==" in r for r in extras["docs"]), extras["docs"]
    assert set(extras["docs"]) <= set(extras["test"])


@pytest.mark.parametrize("page", ["index.md", "guides/concepts.md", "guides/browser.md",
                                  "guides/pyscript.md", "guides/notebooks.md", "guides/export.md",
                                  "guides/performance.md", "guides/checkpoints.md",
                                  "guides/troubleshooting.md"])
def test_every_guide_is_in_the_navigation(page: str) -> None:
    assert (ROOT / "docs" / page).is_file()
    assert f": {page}" in (ROOT / "mkdocs.yml").read_text()
