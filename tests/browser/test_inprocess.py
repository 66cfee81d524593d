"""In-process mode: tensorgrad inside the Pyodide a user already runs, with no second worker.

* In a PyScript worker (``<script type="py" worker>``, configured as docs/guides/notebooks.md
  says), every part of the API runs on the worker's own ``navigator.gpu``
  (tests/browser/inprocess_api.py) and gives the native backend's results.
* On the page's main thread (PyScript's ``<script type="py">``) ``tg.check_webgpu()`` says no,
  naming the mode and the adapter, and ``tg.compile`` raises MainThreadError saying to use
  ``tensorgrad.web.start()`` or a worker.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 300


def worker_config(wheel: str) -> str:
    """The documented PyScript worker config (docs/guides/notebooks.md): the wheel is fetched
    by PyScript's `files` (resolved against the page) and installed from Pyodide's file
    system, since a worker's micropip cannot fetch a relative URL."""
    return json.dumps({"interpreter": "/pyodide/pyodide.mjs",
                       "files": {f"/{wheel}": f"./{wheel}"},
                       "packages": [f"emfs:./{wheel}"]})


def page_with(script_tag: str) -> str:
    return ('<!doctype html>\n<meta charset="utf-8">\n'
            '<script type="module" src="/pyscript/core.js"></script>\n' + script_tag + "\n")


def wait_for_line(page: Any, lines: list[str], prefixes: tuple[str, ...]) -> str:
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        found = [line for line in lines if line.startswith(prefixes)]
        if found:
            return found[0]
        page.wait_for_timeout(250)
    raise AssertionError("no result line in the console:\n" + "\n".join(lines[-30:]))


def open_page(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page()
    lines: list[str] = []
    page.on("console", lambda m: lines.append(m.text))
    page.on("pageerror", lambda e: lines.append(f"[pageerror] {e}"))
    page.goto(url)
    return page, lines


def manifest_wheel() -> str:
    import build

    return json.loads((build.WEB / "manifest.json").read_text())["wheel"]


def test_every_api_call_in_a_pyscript_worker_matches_native(browser: Any, web_url: str) -> None:
    import build

    from . import inprocess_api

    wheel = manifest_wheel()
    shutil.copy2(ROOT / "tests" / "browser" / "inprocess_api.py", build.WEB / "inprocess_api.py")
    (build.WEB / "inprocess-worker.html").write_text(page_with(
        f"<script type=\"py\" worker src=\"./inprocess_api.py\" config='{worker_config(wheel)}'>"
        "</script>"))
    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's loop
        native = pool.submit(asyncio.run, inprocess_api.main()).result()
    t0 = time.perf_counter()
    page, lines = open_page(browser, f"{web_url}inprocess-worker.html")
    try:
        line = wait_for_line(page, lines, ("INPROCESS-RESULT ", "INPROCESS-ERROR "))
    finally:
        page.close()
    assert line.startswith("INPROCESS-RESULT "), json.loads(line.split(" ", 1)[1])
    got = json.loads(line.split(" ", 1)[1])
    print(f"\nin-process (PyScript worker) in {time.perf_counter() - t0:.1f} s: "
          f"{got['support']['message']}; device {got['device']}")
    support = got["support"]
    assert support["ok"] and support["mode"] == "worker", support
    assert support["adapter"] == "google swiftshader" and got["device"].endswith("(browser)")
    assert support["jspi"] is True and "JSPI: yes" in support["message"], support
    assert native["support"]["mode"] == "native"

    def close(a: list[float], b: list[float], what: str) -> None:
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert abs(x - y) <= 1e-5 * max(1.0, abs(x)), f"{what}[{i}]: browser {x}, native {y}"

    assert got["kernels"] == native["kernels"]
    close(got["losses"], native["losses"], "losses")
    assert got["losses"][-1] < got["losses"][0] / 2
    for key in ("attached", "standalone"):
        close(got[key], native[key], key)
    for key in ("params", "grads"):
        assert got[key].keys() == native[key].keys()
        for name in got[key]:
            close(got[key][name], native[key][name], f"{key}[{name}]")
    close(got["standalone"], got["attached"], "checkpoint into a standalone forward")
    assert got["standalone_changed"] and got["lr0_unchanged"]
    for key in ("reset_loss", "replaced_loss"):
        close([got[key]], [native[key]], key)
    close([got["reset_loss"]], [got["losses"][0]], "reset to the initial params")
    def source(text: str) -> str:  # the docstring names the module the class came from
        return re.sub(r"Port of [\w.]+\.MLP", "Port of MLP", text)

    assert source(got["export_source"]) == source(native["export_source"])
    assert re.search(r"class MLP\(nn\.Module\)", got["export_source"])


MAIN_THREAD = """
import json
import tensorgrad as tg

support = await tg.check_webgpu()
report = {"ok": support.ok, "reason": support.reason, "mode": support.mode,
          "adapter": support.adapter, "message": support.message}

class Line(tg.Module):
    def __init__(self):
        self.fc = tg.Linear(1, 1)
    def forward(self, x):
        return self.fc(x)

try:
    await tg.compile(model=Line(), loss=lambda m, x: tg.mean(m(x)), inputs={"x": (4, 1)},
                     optimizer=tg.optim.SGD(lr=0.1))
except tg.MainThreadError as err:
    report["error"] = str(err)
print("MAINTHREAD-RESULT " + json.dumps(report))
"""


def test_main_thread_in_process_use_fails_clearly(browser: Any, web_url: str) -> None:
    import build

    wheel = manifest_wheel()
    config = json.dumps({"interpreter": "/pyodide/pyodide.mjs", "packages": [f"/{wheel}"]})
    (build.WEB / "inprocess-main.html").write_text(page_with(
        f"<script type=\"py\" config='{config}'>{MAIN_THREAD}</script>"))
    page, lines = open_page(browser, f"{web_url}inprocess-main.html")
    try:
        line = wait_for_line(page, lines, ("MAINTHREAD-RESULT ", "[pageerror]"))
    finally:
        page.close()
    assert line.startswith("MAINTHREAD-RESULT "), "\n".join(lines[-30:])
    got = json.loads(line.split(" ", 1)[1])
    print(f"\nmain thread: {got}")
    assert not got["ok"] and got["reason"] == "main-thread" and got["mode"] == "main-thread"
    assert got["adapter"] == "google swiftshader", got
    assert re.search(r"WebGPU is here \(google swiftshader\), but this Pyodide runs on the web "
                     r"page's main thread", got["message"]), got
    error = got.get("error")
    assert error, "tg.compile on the main thread did not raise MainThreadError"
    assert re.search(r"main thread.*tensorgrad\.web\.start\(\).*Web Worker.*"
                     r'<script type="py" worker>.*JupyterLite', error, re.DOTALL), error

