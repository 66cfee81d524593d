"""The worker's path to "ready": the wheel unpacked straight into site-packages (no micropip),
the bytecode the bundle ships used, micropip as the fallback, errors that name the wheel.
Timings are printed, never asserted (bench/bench_ready.py measures them)."""

from __future__ import annotations

import ast
import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Page

# Python run in the worker after "ready": where tensorgrad came from and what was loaded.
WHERE = """{
  "file": tensorgrad.__file__,
  "cached": tensorgrad.api.__cached__,
  "cached_exists": os.path.exists(tensorgrad.api.__cached__),
  "version": importlib.metadata.version("tensorgrad"),
  "micropip": "micropip" in sys.modules,
  "export_loaded": "tensorgrad.export" in sys.modules,
  "stdlib_pyc": "asyncio/base_events.pyc" in zipfile.ZipFile(
      "/lib/python%d%d.zip" % sys.version_info[:2]).namelist(),
}"""
WHERE_IMPORTS = "import importlib.metadata, os, sys, zipfile\nimport tensorgrad, tensorgrad.api"

TINY = """async () => {
  await session.exec(`
import tensorgrad as tg
class RdLine(tg.Module):
    def __init__(self):
        self.fc = tg.Linear(1, 1)
    def forward(self, x):
        return self.fc(x)
def rd_loss(model, x, y):
    return tg.mean(tg.square(model(x) - y))
`);
  const train = await session.compile({ model: "RdLine()", loss: "rd_loss",
    inputs: { x: [4, 1], y: [4, 1] }, optimizer: { kind: "sgd", lr: 0.1 }, seed: 0 });
  const x = new Float32Array([0, 1, 2, 3]);
  const r = await train.step({ x, y: new Float32Array([1, 3, 5, 7]) });
  await train.destroy();
  return r.kind === "completed" ? r.loss : r;
}"""


@pytest.fixture
def fresh(browser: Any, web_url: str) -> Iterator[Page]:
    """A page of its own (its own workers), with the client module loaded as window.tg."""
    page = Page(browser.new_page())
    page.page.goto(web_url + "index.html")
    page.js('async () => { window.tg = await import("/tensorgrad.js"); }')
    yield page
    page.page.close()


def where(page: Page, session: str = "session") -> dict[str, Any]:
    reply = page.js(f"(src) => {session}.exec(src)", f"{WHERE_IMPORTS}\nimport json\n"
                    f"json.dumps({WHERE})")
    return json.loads(ast.literal_eval(reply))


def test_ready_unpacks_the_wheel_into_site_packages(tg: Page, web_url: str) -> None:
    ready = tg.progress[-1]
    assert ready["stage"] == "ready"
    install = ready["install"]
    print(f"\nready in {ready['timings']['totalMs']} ms: {ready['timings']}, install {install}")
    manifest = json.loads(urllib.request.urlopen(f"{web_url}manifest.json").read())
    assert install["path"] == "unpack", install
    assert [w["url"] for w in install["wheels"]] == [web_url + manifest["wheel"]]
    assert all(w["path"] == "unpack" and w["files"] > 10 for w in install["wheels"]), install
    assert tg.js("() => session.install.path") == "unpack"
    assert ready["timings"]["micropipMs"] == 0
    got = where(tg)
    assert got["file"].startswith("/lib/python3.") and "/site-packages/tensorgrad/" in got["file"]
    assert got["version"] == manifest["version"]
    assert got["micropip"] is False, "micropip was loaded, but nothing needed it"
    # The bundle's bytecode (compiled by Pyodide at build time) is what was imported.
    assert got["cached_exists"] and got["cached"].endswith(".pyc"), got
    assert got["stdlib_pyc"], "the served python_stdlib.zip has no .pyc files"


def test_first_compile_and_step_work_after_ready(tg: Page) -> None:
    loss = tg.js(TINY)
    assert isinstance(loss, float) and loss > 0, loss


def test_install_micropip_is_the_fallback_path(fresh: Page) -> None:
    out = fresh.js("""async () => {
      const stages = [];
      const s = await tg.start({ install: "micropip", onProgress: (p) => stages.push(p.stage) });
      const info = { stages, install: s.install, timings: s.timings,
                     version: await s.exec("import tensorgrad; tensorgrad.__version__") };
      window.micropipSession = s;
      return info;
    }""")
    print(f"\nmicropip path: {out['timings']}")
    assert out["stages"] == ["loading-pyodide", "installing", "ready"], out
    assert out["install"]["path"] == "micropip", out
    assert all(w["path"] == "micropip" for w in out["install"]["wheels"]), out
    assert re.fullmatch(r"'\d+\.\d+\.\d+.*'", out["version"]), out
    assert where(fresh, "micropipSession")["micropip"] is True
    fresh.js("() => micropipSession.terminate()")


def test_a_wheel_that_cannot_be_fetched_rejects_start_naming_it(fresh: Page) -> None:
    out = fresh.js("""() => tg.start({ wheelUrl: "/no-such-wheel-0.0.0-py3-none-any.whl" })
                    .then(() => "started", (e) => e.message)""")
    assert re.match(r"fetching http://127\.0\.0\.1:\d+/no-such-wheel-0\.0\.0-py3-none-any\.whl "
                    r"failed: HTTP 404", out), out
