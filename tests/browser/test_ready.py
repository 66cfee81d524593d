"""The worker's path to "ready": the bundle's Pyodide snapshot restored (tensorgrad already
imported), the wheel unpacked straight into site-packages (no micropip), the bytecode the bundle
ships used when Python starts without the snapshot, micropip as the fallback, errors that name
the wheel. Timings are printed, never asserted (bench/bench_ready.py measures them)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Page, build

# Python run in the worker after "ready": where tensorgrad came from and what was loaded.
WHERE = """{
  "file": tensorgrad.__file__,
  "source": os.path.exists(tensorgrad.__file__),
  "random": random.random(),
  "cached": tensorgrad.api.__cached__,
  "cached_exists": os.path.exists(tensorgrad.api.__cached__),
  "version": importlib.metadata.version("tensorgrad-webgpu"),
  "micropip": "micropip" in sys.modules,
  "export_loaded": "tensorgrad.export" in sys.modules,
  "stdlib_pyc": "asyncio/base_events.pyc" in zipfile.ZipFile(
      "/lib/python%d%d.zip" % sys.version_info[:2]).namelist(),
}"""
WHERE_IMPORTS = ("import importlib.metadata, os, random, sys, zipfile\n"
                 "import tensorgrad, tensorgrad.api")

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


def check_unpacked(ready: dict[str, Any], got: dict[str, Any], web_url: str) -> None:
    """The wheel went into site-packages without micropip, its files are there, the bytecode
    the bundle ships is what was imported."""
    install = ready["install"]
    manifest = json.loads(urllib.request.urlopen(f"{web_url}manifest.json").read())
    assert install["path"] == "unpack", install
    assert [w["url"] for w in install["wheels"]] == [web_url + manifest["wheel"]]
    assert all(w["path"] == "unpack" and w["files"] > 10 for w in install["wheels"]), install
    assert ready["timings"]["micropipMs"] == 0
    assert got["file"].startswith("/lib/python3.") and "/site-packages/tensorgrad/" in got["file"]
    assert got["source"], got  # (tracebacks and lazily imported modules read the files)
    assert got["version"] == manifest["version"]
    assert got["micropip"] is False, "micropip was loaded, but nothing needed it"
    assert got["cached_exists"] and got["cached"].endswith(".pyc"), got
    assert got["stdlib_pyc"], "the served python_stdlib.zip has no .pyc files"


def test_ready_restores_the_snapshot_and_unpacks_the_wheel(tg: Page, web_url: str) -> None:
    ready = tg.progress[-1]
    assert ready["stage"] == "ready"
    install = ready["install"]
    print(f"\nready in {ready['timings']['totalMs']} ms: {ready['timings']}, install {install}")
    manifest = json.loads(urllib.request.urlopen(f"{web_url}manifest.json").read())
    assert "snapshot" in manifest, "build.py made no snapshot (Chromium is here)"
    assert install["snapshot"] == {"used": True, "file": manifest["snapshot"]["file"]}, install
    assert tg.js("() => session.install.snapshot.used") is True
    check_unpacked(ready, where(tg), web_url)
    # What the restore puts back: Pyodide's record of site-packages, a language, one "" on
    # sys.path.
    assert tg.exec_json("__import__('pyodide_js').loadedPackages.to_py()") == {
        "tensorgrad-webgpu": "Unknown"}  # the distribution's name (the wheel's metadata)
    assert tg.exec_json("__import__('sys').path.count('')") == 1
    assert tg.exec_json("__import__('os').environ['LANG'].endswith('.UTF-8')") is True


def test_first_compile_and_step_work_after_ready(tg: Page) -> None:
    loss = tg.js(TINY)
    assert isinstance(loss, float) and loss > 0, loss


def test_without_the_snapshot_python_starts_and_the_wheel_is_unpacked(fresh: Page,
                                                                      web_url: str) -> None:
    out = fresh.js("""async () => {
      const progress = [];
      const s = await tg.start({ snapshot: false, onProgress: (p) => progress.push(p) });
      window.freshSession = s;
      await s.exec(`import tensorgrad`);
      return { ready: progress.at(-1), stages: progress.map((p) => p.stage) };
    }""")
    ready = out["ready"]
    print(f"\nwithout the snapshot: {ready['timings']}")
    assert out["stages"] == ["loading-pyodide", "installing", "ready"], out
    assert ready["install"]["snapshot"] == {"used": False, "reason": "?snapshot=off"}, ready
    check_unpacked(ready, where(fresh, "freshSession"), web_url)
    # Two starts, two random streams (a restored snapshot reseeds; Python seeds itself).
    restored = fresh.js("""async () => {
      const s = await tg.start();
      const r = await s.exec("import random; random.random()");
      s.terminate();
      return [s.install.snapshot.used, r];
    }""")
    assert restored[0] is True
    assert float(restored[1]) != where(fresh, "freshSession")["random"]
    fresh.js("() => freshSession.terminate()")


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
    assert out["install"]["snapshot"] == {"used": False, "reason": "?install=micropip"}, out
    assert all(w["path"] == "micropip" for w in out["install"]["wheels"]), out
    assert re.fullmatch(r"'\d+\.\d+\.\d+.*'", out["version"]), out
    assert where(fresh, "micropipSession")["micropip"] is True
    fresh.js("() => micropipSession.terminate()")


def test_a_wheel_that_cannot_be_fetched_rejects_start_naming_it(fresh: Page) -> None:
    out = fresh.js("""() => tg.start({ wheelUrl: "/no-such-wheel-0.0.0-py3-none-any.whl" })
                    .then(() => "started", (e) => e.message)""")
    assert re.match(r"fetching http://127\.0\.0\.1:\d+/no-such-wheel-0\.0\.0-py3-none-any\.whl "
                    r"failed: HTTP 404", out), out


@pytest.fixture
def tampered(web_url: str) -> Iterator[Any]:
    """`make(name, change)`: a copy of worker.mjs and manifest.json in dist/web/<name>/ (the
    rest of the bundle one folder up), `change(manifest)` applied; its worker URL."""
    made = []

    def make(name: str, change: Any) -> str:
        folder = build.WEB / name
        folder.mkdir()
        made.append(folder)
        manifest = json.loads((build.WEB / "manifest.json").read_text())
        manifest["indexURL"] = "../" + manifest["indexURL"]
        manifest["wheel"] = "../" + manifest["wheel"]
        manifest["snapshot"]["file"] = "../" + manifest["snapshot"]["file"]
        change(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
        shutil.copy2(build.WEB / "worker.mjs", folder / "worker.mjs")
        return f"/{name}/worker.mjs"

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


START_AND_EXEC = """async (workerUrl) => {
  const s = await tg.start({ workerUrl });
  const value = await s.exec("import tensorgrad, random; tensorgrad.__name__");
  s.terminate();
  return { snapshot: s.install.snapshot, value };
}"""


def test_a_snapshot_from_a_browser_with_another_trampoline_is_not_restored(
        fresh: Page, tampered: Any) -> None:
    def change(manifest: dict[str, Any]) -> None:
        manifest["snapshot"]["features"]["trampoline"] += 1
    out = fresh.js(START_AND_EXEC, tampered("test-ready-trampoline", change))
    assert out["value"] == "'tensorgrad'", out
    assert out["snapshot"]["used"] is False, out
    assert re.fullmatch(r"its trampoline \d+ is not this browser's \d+",
                        out["snapshot"]["reason"]), out


def test_a_snapshot_that_cannot_be_fetched_falls_back_to_starting_python(
        fresh: Page, tampered: Any) -> None:
    def change(manifest: dict[str, Any]) -> None:
        manifest["snapshot"]["file"] = "../no-such-snapshot.bin.gz"
    out = fresh.js(START_AND_EXEC, tampered("test-ready-missing", change))
    assert out["value"] == "'tensorgrad'", out
    assert out["snapshot"]["used"] is False, out
    assert out["snapshot"]["reason"].startswith(
        "restoring it failed: fetching the snapshot ../no-such-snapshot.bin.gz failed: HTTP 404"
    ), out
