"""The browser-only code blocks of the docs run in Chromium against the built bundle, and the
docs site itself loads offline.

* ``js`` blocks: the blocks of one page, in order, as one ES module, imported by a page served
  from the bundle's origin (/tests/docs/), so ``import ... from "/tensorgrad.js"`` is the
  bundle's client; the module must finish without throwing.
* ``html`` blocks: each one a page of its own there; it works when it prints (console) a line
  starting with ``done``.
* ``{.python .worker}`` blocks: worker scripts, run with ``session.runScript`` in the suite's
  shared worker; ``main()`` must return.
* the landing page's own example (web/index.html, the "Use the bundle in your own page" code).

Every page may ask only the local server for files (no CDN), and may log no error. Also here:
the docs site (dist/docs/, served at /docs/) opens and searches offline, and the bundle's
landing page links the demos and the docs while no test page ships in dist/web/."""

from __future__ import annotations

import html
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from .conftest import Page, build

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import docsite

WAIT_MS = 240_000

RUNNER = """<!doctype html>
<meta charset="utf-8">
<title>docs example: {name}</title>
<script type="module">
window.docsExample = import("./{name}.mjs").then(
  () => ({{ ok: true }}), (e) => ({{ ok: false, error: String(e?.stack ?? e) }}));
</script>
"""


def blocks_of(lang: str, classes: tuple[str, ...] = ()) -> list[docsite.Block]:
    return [b for p in docsite.guide_files() for b in docsite.code_blocks(p)
            if b.lang == lang and b.classes == classes]


def js_pages() -> dict[str, str]:
    """{name: the JS module} per page with js blocks, and the landing page's example."""
    pages: dict[str, list[str]] = {}
    for b in blocks_of("js"):
        pages.setdefault(b.path.stem, []).append(f"// {b.where}\n{b.code}")
    landing = (ROOT / "web" / "index.html").read_text()
    example = re.search(r'<pre>&lt;script type="module"&gt;\n(.*?)&lt;/script&gt;</pre>',
                        landing, re.DOTALL)
    assert example, "web/index.html lost its example"
    pages["landing"] = [html.unescape(example[1])]
    return {name: "\n".join(code) for name, code in pages.items()}


class Watched:
    """A page with its console, errors and requested URLs recorded."""

    def __init__(self, browser: Any):
        self.page = browser.new_page()
        self.console: list[str] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: (self.errors if m.type == "error" else
                                           self.console).append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"[pageerror] {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("response", lambda r: r.status >= 400 and self.errors.append(
            f"HTTP {r.status}: {r.url}"))

    def foreign_requests(self, base: str) -> list[str]:
        host = urlparse(base).netloc
        return [u for u in self.requests if urlparse(u).scheme in ("http", "https", "ws", "wss")
                and urlparse(u).netloc != host]

    def report(self) -> str:
        return "\n".join(self.errors + self.console[-30:])


@pytest.fixture
def watched(browser: Any) -> Any:
    pages: list[Watched] = []

    def make() -> Watched:
        pages.append(Watched(browser))
        return pages[-1]

    yield make
    for p in pages:
        p.page.close()


@pytest.mark.parametrize("name", sorted(js_pages()))
def test_js_blocks_run(name: str, watched: Any, web_url: str, test_pages: Path) -> None:
    folder = test_pages / "docs"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.mjs").write_text(js_pages()[name])
    (folder / f"{name}.html").write_text(RUNNER.format(name=name))
    w = watched()
    w.page.goto(f"{web_url}tests/docs/{name}.html")
    w.page.wait_for_function("window.docsExample", timeout=WAIT_MS)
    result = w.page.evaluate("window.docsExample")
    assert result["ok"], f"{result['error']}\n{w.report()}"
    assert not w.errors, w.report()
    assert not w.foreign_requests(web_url), w.foreign_requests(web_url)


@pytest.mark.parametrize("block", blocks_of("html"), ids=lambda b: b.where)
def test_html_blocks_run(block: docsite.Block, watched: Any, web_url: str,
                         test_pages: Path) -> None:
    folder = test_pages / "docs"
    folder.mkdir(exist_ok=True)
    name = f"{block.path.stem}-{block.line}.html"
    (folder / name).write_text(block.code)
    w = watched()
    w.page.goto(f"{web_url}tests/docs/{name}")
    deadline = time.time() + WAIT_MS / 1000
    while time.time() < deadline and not any(c.startswith("done") for c in w.console):
        if w.errors:
            break
        w.page.wait_for_timeout(250)
    assert any(c.startswith("done") for c in w.console), w.report()
    print(f"\n{block.where}: {next(c for c in w.console if c.startswith('done'))}")
    assert not w.errors, w.report()
    assert not w.foreign_requests(web_url), w.foreign_requests(web_url)


@pytest.mark.parametrize("block", blocks_of("python", ("worker",)), ids=lambda b: b.where)
def test_worker_blocks_run(block: docsite.Block, tg: Page) -> None:
    reply = tg.call("runScript", {"source": block.code, "filename": block.where})
    assert reply["ok"], f"{reply['error']['name']}: {reply['error']['traceback']}"
    print(f"\n{block.where}: main() returned {reply['result']}")


def test_bundle_has_a_landing_page_and_no_test_pages(web_url: str) -> None:
    pages = [p.relative_to(build.WEB) for p in build.WEB.rglob("*.html")]
    stray = [str(p) for p in pages if p.parts[0] not in ("demos", "pyscript")
             and str(p) != "index.html"]
    assert not stray, f"pages in dist/web/ that are not the landing page or a demo: {stray}"
    landing = urllib.request.urlopen(web_url).read().decode()
    assert "{{" not in landing and 'href="docs/"' in landing and 'href="demos/"' in landing
    for name in build.demo_names():
        assert f'href="demos/{name}/"' in landing, name
    wheel = (build.WEB / "manifest.json").read_text().split('"wheel": "')[1].split('"')[0]
    assert wheel in landing
    # test pages are served from the tests' own folder, beside the bundle
    page = urllib.request.urlopen(f"{web_url}tests/page-python.html").read().decode()
    assert "window.pagePython" in page


def test_docs_site_opens_and_searches_offline(watched: Any, web_url: str,
                                              docs_site: Path) -> None:
    w = watched()
    for path in ("", "guides/browser/", "reference/api/", "reference/op-table/",
                 "reference/js/"):
        w.page.goto(f"{web_url}docs/{path}")
        w.page.wait_for_load_state("networkidle")
        assert w.page.title().endswith("tensorgrad"), (path, w.page.title())
    w.page.keyboard.press("/")                       # Material's search, from its own index
    w.page.keyboard.type("replace_model")
    w.page.wait_for_selector(".md-search-result__item", timeout=30_000)
    assert not w.foreign_requests(web_url), w.foreign_requests(web_url)
    assert not w.errors, w.report()
