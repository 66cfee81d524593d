"""Fixtures for the browser suite: dist/web built and served once, one headless Chromium, one
page whose tensorgrad worker (Pyodide + the wheel) is started once and shared by every test."""

from __future__ import annotations

import ast
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import build  # the repository's build.py (imported after the sys.path line)

PAGES = Path(__file__).resolve().parent / "pages"

START_SESSION = """async () => {
  window.tg = await import("/tensorgrad.js");
  window.progress = [];
  window.session = await window.tg.start({ onProgress: (p) => window.progress.push(p) });
  return window.progress;
}"""


@pytest.fixture(scope="package")
def test_pages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder served at /tests/ beside the bundle: the test pages of tests/browser/pages/
    (test pages are never part of dist/web/), and pages a test writes there."""
    folder = tmp_path_factory.mktemp("pages")
    shutil.copytree(PAGES, folder, dirs_exist_ok=True)
    return folder


@pytest.fixture(scope="package")
def web_url(test_pages: Path) -> Iterator[str]:
    """dist/web/ built from this tree and served on a free 127.0.0.1 port, with the test pages
    at /tests/ and the docs site (dist/docs/, once built) at /docs/."""
    try:
        build.install_browser_deps()
    except SystemExit as exc:
        pytest.fail(f"browser dependencies missing: {exc}")
    build.build_web()
    server = build.serve_web(0, quiet=True, mounts={"/tests/": test_pages, "/docs/": build.DOCS})
    yield build.server_url(server)
    server.shutdown()


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Headless Chromium (the system's, with WebGPU on SwiftShader where there is no GPU)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(build.CHROMIUM),
                                      args=build.CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Page:
    """A page with a started tensorgrad session (`window.session`); console lines are kept."""

    def __init__(self, page: Any):
        self.page = page
        self.console: list[str] = []
        page.on("console", lambda m: self.console.append(f"[{m.type}] {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"[pageerror] {e}"))

    def js(self, script: str, arg: Any = None) -> Any:
        """Evaluate `script` (a JS function expression) in the page, awaiting promises."""
        return self.page.evaluate(script, arg)

    def call(self, kind: str, payload: Any) -> dict[str, Any]:
        """`session.request(kind, payload)` → {ok, result} or {ok: false, error}."""
        return self.js("""async ([kind, payload]) => {
          try { return { ok: true, result: await session.request(kind, payload) }; }
          catch (e) { return { ok: false, error: { name: e.name, message: e.message,
                                                    traceback: e.traceback } }; }
        }""", [kind, payload])

    def exec(self, source: str) -> Any:
        """Run Python in the worker; its last expression's repr, or AssertionError with the
        Python traceback when it raised."""
        reply = self.call("exec", {"source": source})
        if not reply["ok"]:
            raise AssertionError(f"{reply['error']['name']} in the worker:\n"
                                 f"{reply['error']['traceback']}")
        return reply["result"]

    def exec_json(self, source: str) -> Any:
        """Like exec, for an expression whose value JSON-encodes (read back with json)."""
        return json.loads(ast.literal_eval(self.exec(f"import json\njson.dumps({source})")))


@pytest.fixture(scope="package")
def tg_page(browser: Any, web_url: str) -> Iterator[Page]:
    page = Page(browser.new_page())
    page.page.goto(web_url + "index.html")
    page.progress = page.js(START_SESSION)
    yield page
    page.page.close()


@pytest.fixture
def tg(tg_page: Page) -> Page:
    """The shared page, checked to still have a live session."""
    assert tg_page.js("() => session.dead === null"), "the shared worker died:\n" + "\n".join(
        tg_page.console[-20:])
    return tg_page
