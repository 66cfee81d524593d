"""The JupyterLite site (`python build.py lite`, dist/web/lite/) in headless Chromium, offline.

Each notebook (notebooks/*.py, converted to .ipynb by litebundle.py) is opened in JupyterLite's
Notebook app and run with Run > Run All Cells in the Pyodide kernel, where tensorgrad runs
in-process on the kernel worker's WebGPU: every cell must finish without an error, the loss
must fall below the notebook's target on the browser's adapter (SwiftShader here), long work
must show one display updated in place, and no request may leave 127.0.0.1. The built site's
config and package indexes must name no absolute URL (the kernel would fetch it).
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = "google swiftshader (browser)"

CELLS = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map((c) => ({
  prompt: c.querySelector('.jp-InputPrompt')?.textContent ?? '',
  text: c.querySelector('.jp-OutputArea')?.innerText ?? '',
  outputs: c.querySelectorAll('.jp-OutputArea-output').length,
  errors: [...c.querySelectorAll('.jp-OutputArea-output[data-mime-type*="stderr"], ' +
            '.jp-OutputArea-output[data-mime-type*="error"]')].map((e) => e.innerText),
}))"""


@pytest.fixture(scope="package")
def lite_url(web_url: str) -> Iterator[str]:
    """dist/web/lite/ built from this tree (over the served dist/web/)."""
    import build

    build.build_lite()
    yield web_url + "lite/"


@dataclass
class NotebookRun:
    """A notebook run to the end: the last state of each code cell, every distinct output
    text a cell showed while it ran, the wall time and every URL the page requested."""

    cells: list[dict[str, Any]]
    seen: list[list[str]] = field(default_factory=list)
    seconds: float = 0.0
    requests: list[str] = field(default_factory=list)
    page: Any = None

    def output(self, pattern: str) -> re.Match[str]:
        for cell in self.cells:
            found = re.search(pattern, cell["text"])
            if found:
                return found
        raise AssertionError(f"no output matches {pattern!r}:\n" +
                             "\n---\n".join(c["text"] for c in self.cells))


def _done(prompt: str) -> bool:
    return bool(re.fullmatch(r"\s*\[\d+\]:\s*", prompt))


def run_all_cells(page: Any, name: str, attempts: int = 5) -> None:
    """Run > Run All Cells, until a cell has started (a click on a menu that is still being
    built does nothing: seen once in three runs of the whole file)."""
    started = ("[...document.querySelectorAll('.jp-InputPrompt')]"
               ".some((p) => /\\[(\\*|\\d+)\\]/.test(p.textContent))")
    for _ in range(attempts):
        page.keyboard.press("Escape")
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        try:
            page.wait_for_function(started, timeout=15_000)
        except Exception as err:  # noqa: BLE001 (Playwright's TimeoutError: click again)
            print(f"{name}: Run All Cells started nothing ({type(err).__name__}); again")
        else:
            return
    raise AssertionError(f"{name}: Run All Cells started no cell in {attempts} tries")


def run_notebook(browser: Any, lite_url: str, name: str, timeout_s: float = 600) -> NotebookRun:
    """Open notebooks/NAME in JupyterLite, Run All Cells, wait for every cell to finish. Each
    notebook gets a browser context of its own (JupyterLite keeps sessions, contents and a
    service worker per origin: a run must not see an earlier one's)."""
    page = browser.new_context(viewport={"width": 1200, "height": 1400}).new_page()
    run = NotebookRun(cells=[], page=page)
    page.on("request", lambda r: run.requests.append(r.url))
    t0 = time.perf_counter()
    page.goto(f"{lite_url}notebooks/index.html?path={name}.ipynb")
    page.wait_for_function("document.querySelector('.jp-Notebook .jp-CodeCell')",
                           timeout=120_000)
    run_all_cells(page, name)
    while True:
        cells = page.evaluate(CELLS)
        run.seen += [[] for _ in range(len(cells) - len(run.seen))]
        for i, cell in enumerate(cells):
            if cell["text"] and (not run.seen[i] or run.seen[i][-1] != cell["text"]):
                run.seen[i].append(cell["text"])
        errors = [e for c in cells for e in c["errors"] if re.search(r"Error|Traceback", e)]
        assert not errors, f"{name}: a cell failed:\n" + "\n".join(errors)
        if cells and all(_done(c["prompt"]) for c in cells):
            break
        assert time.perf_counter() - t0 < timeout_s, f"{name}: not done in {timeout_s} s: " + \
            json.dumps([[c["prompt"], c["text"][-200:]] for c in cells], indent=1)
        page.wait_for_timeout(250)
    run.cells, run.seconds = cells, time.perf_counter() - t0
    host = urlparse(lite_url).netloc
    foreign = [u for u in run.requests if urlparse(u).scheme in ("http", "https", "ws", "wss")
               and urlparse(u).netloc != host]
    assert not foreign, f"{name} fetched from outside the bundle: {foreign}"
    return run


@pytest.fixture
def notebook(browser: Any, lite_url: str) -> Iterator[Any]:
    pages: list[Any] = []

    def run(name: str) -> NotebookRun:
        result = run_notebook(browser, lite_url, name)
        pages.append(result.page)
        print(f"\n{name}: every cell ran in {result.seconds:.1f} s")
        return result

    yield run
    for page in pages:
        page.context.close()


def in_process_check(run: NotebookRun) -> None:
    run.output(r"WebGPU ready: google swiftshader \(in-process, on this Web Worker's "
               r"navigator\.gpu; JSPI: yes")


def test_lite_site_is_offline_and_pinned(lite_url: str) -> None:
    import tomllib

    import build
    import litebundle

    lite = build.WEB / "lite"
    # what the app and the kernel read to find things: its config, the package indexes, the
    # contents index, the notebooks and the served Pyodide lock (JSON schemas' "$schema" ids
    # under build/schemas are names, never fetched)
    indexes = [p for p in lite.rglob("all.json") if {"pypi", "api"} & set(p.parts)]
    configs = [*lite.rglob("jupyter-lite.json"), *indexes, *(lite / "files").glob("*.ipynb"),
               build.WEB / "pyodide" / "pyodide-lock.json"]
    assert len(configs) > 8, configs
    texts = {path: path.read_text() for path in configs}
    # jupyter-lite.ipynb: the config is its metadata (its cells are prose with a docs link)
    ipynb = lite / "jupyter-lite.ipynb"
    texts[ipynb] = json.dumps(json.loads(ipynb.read_text())["metadata"]["jupyter-lite"])
    for path, text in texts.items():
        urls = re.findall(r"\b(?:https?|wss?)://[^\s\"'<>)]+", text)
        assert not urls, f"{path.relative_to(build.WEB)} names absolute URLs: {urls[:5]}"
    settings = json.loads((lite / "jupyter-lite.json").read_text())["jupyter-config-data"]
    kernel = settings["litePluginSettings"][litebundle.KERNEL_PLUGIN]
    assert kernel["pyodideUrl"] == "./../pyodide/pyodide.mjs" and kernel["disablePyPIFallback"]
    index = json.loads((lite / "pypi" / "all.json").read_text())
    assert litebundle.DISTRIBUTION in index and "comm" in index, sorted(index)
    lock = json.loads((build.WEB / "pyodide" / "pyodide-lock.json").read_text())["packages"]
    for name, version in litebundle.KERNEL_LOCK_WHEELS.items():
        entry = next(e for k, e in lock.items() if litebundle._norm(k) == name)
        assert entry["version"] == version and (build.WEB / "pyodide" / entry["file_name"]).exists()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    extra = extras["lite"]
    assert set(extra) <= set(extras["test"]), "the test extra lacks the lite pins"
    assert all(re.fullmatch(r"[\w-]+==[\d.]+", r) for r in extra), extra  # exact pins
    assert f"jupyterlite-pyodide-kernel=={litebundle.LITE_VERSION}" in extra
    assert f"jupyterlite-core=={litebundle.LITE_VERSION}" in extra
    for name in litebundle.NOTEBOOKS:
        cells = json.loads((lite / "files" / f"{name}.ipynb").read_text())["cells"]
        assert cells[0]["cell_type"] == "markdown"
        assert any(c["source"] == f"%pip install {litebundle.DISTRIBUTION}" for c in cells), name


def test_first_model_notebook(notebook: Any) -> None:
    run = notebook("first_model")
    in_process_check(run)
    final = run.output(r"final loss (\d+\.\d+) after (\d+) steps on (.+)\n")
    assert float(final[1]) < 0.01 and final[3] == ADAPTER, final[0]
    assert run.output(r"compiled: \d+ kernels, 4353 params on (.+)\n")[1] == ADAPTER
    run.output(r"saved mlp\.safetensors")


def test_addition_transformer_notebook(notebook: Any) -> None:
    source = (ROOT / "notebooks" / "addition_transformer.py").read_text()
    steps, target = re.search(r"STEPS, TARGET, SEED = (\d+), ([\d.]+), \d+", source).groups()
    run = notebook("addition_transformer")
    in_process_check(run)
    final = run.output(r"loss (\d+\.\d+) -> (\d+\.\d+) \(mean of the last 5\) after (\d+) steps "
                       r"on (.+)\n")
    print(final[0])
    assert float(final[2]) < float(target) < float(final[1]), final[0]
    assert final[3] == steps and final[4] == ADAPTER, final[0]
    # the loss chart: one display updated in place while it trained, not a line per step
    i = next(i for i, c in enumerate(run.cells) if "mean of the last 5" in c["text"])
    shown = [re.search(r"step (\d+): loss", t) for t in run.seen[i]]
    steps_shown = sorted({int(m[1]) for m in shown if m})
    assert len(steps_shown) >= 3 and steps_shown[-1] == int(steps), steps_shown
    assert run.cells[i]["outputs"] == 2, run.cells[i]  # the chart and the summary line
    assert run.page.locator(".jp-OutputArea-output svg polyline").count() == 1
    accuracy = run.output(r"held-out accuracy: (\d+)/200 after \d+ steps")
    assert 0 <= int(accuracy[1]) <= 200
    assert run.page.locator(".jp-OutputArea-output table tr").count() == 9  # header + 8 sums


def test_export_pytorch_notebook(notebook: Any, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    run = notebook("export_pytorch")
    in_process_check(run)
    final = run.output(r"final loss (\d+\.\d+) after (\d+) steps on (.+)\n")
    assert float(final[1]) < 0.01 and final[3] == ADAPTER, final[0]
    links = run.page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        '.jp-OutputArea-output a[download]')].map((a) => [a.download, a.href]))""")
    assert sorted(links) == ["mlp_torch.py", "mlp_torch.safetensors"], links
    for name, href in links.items():
        (tmp_path / name).write_bytes(base64.b64decode(href.split(",", 1)[1]))
    source = (tmp_path / "mlp_torch.py").read_text()
    assert "class MLP(nn.Module)" in source and 'load_file("mlp_torch.safetensors")' in source
    namespace: dict[str, Any] = {}
    exec(compile(source, str(tmp_path / "mlp_torch.py"), "exec"), namespace)  # noqa: S102
    model = namespace["MLP"]()
    model.load_state_dict(load_file(str(tmp_path / "mlp_torch.safetensors")))
    predictions = json.loads(run.output(r"predictions (\[.*\])")[1])
    xs = torch.tensor([-1.5, -0.5, 0.0, 0.5, 1.5]).reshape(-1, 1)
    got = model(xs).detach().reshape(-1).tolist()
    assert max(abs(a - b) for a, b in zip(got, predictions)) < 1e-5, (got, predictions)


def test_marimo_page_trains_offline(browser: Any, lite_url: str) -> None:
    """notebooks/marimo_mlp.py exported with `marimo export html-wasm` (dist/web/marimo/):
    marimo's WebAssembly runtime, its Pyodide and every package come from the bundle, and the
    MLP trains in-process in marimo's worker to a loss below 0.01."""
    import build
    import litebundle

    base = lite_url.removesuffix("lite/") + "marimo/"
    lock = json.loads((build.WEB / "marimo" / "pyodide" / "pyodide-lock.json").read_text())
    assert "https://" not in json.dumps(lock) and "marimo-base" in lock["packages"]
    page = (build.WEB / "marimo" / "index.html").read_text()
    assert 'data-pyodide-index-url="./pyodide/"' in page and litebundle.MARIMO_PYODIDE
    tab = browser.new_page()
    requests: list[str] = []
    tab.on("request", lambda r: requests.append(r.url))
    t0 = time.perf_counter()
    try:
        tab.goto(base)
        tab.wait_for_function("/final loss|Traceback|Error/.test(document.body.innerText)",
                              timeout=600_000)
        text = tab.evaluate("document.body.innerText")
    finally:
        tab.close()
    print(f"\nmarimo page: {time.perf_counter() - t0:.1f} s")
    final = re.search(r"final loss (\d+\.\d+) after (\d+) steps on (.+)", text)
    assert final, text[-2000:]
    print(final[0])
    assert float(final[1]) < 0.01 and final[3].strip() == ADAPTER, final[0]
    assert re.search(r"WebGPU ready: google swiftshader \(in-process", text), text[-2000:]
    host = urlparse(base).netloc
    foreign = [u for u in requests if urlparse(u).scheme in ("http", "https", "ws", "wss")
               and urlparse(u).netloc != host]
    assert not foreign, foreign
