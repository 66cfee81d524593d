"""PyScript pages in headless Chromium, all offline: PyScript (npm @pyscript/core) and
Pyodide are served from dist/web/, and every request must go to the local server.

* demos/pyscript_mlp/: the model, training loop and plots are Python on the page; it trains
  in tensorgrad's worker to a mean loss < 0.01, draws the plots (screenshot pixels checked),
  keeps the page responsive (a 20 ms heartbeat timer measured during training), and exports
  the trained model to PyTorch, which loads here and reproduces the page's predictions.
* demos/pyscript_worker/: a PyScript worker (`<script type="py" worker>`) trains in-process on
  its own WebGPU to a mean loss < 0.01 while the page's 20 ms timer keeps ticking; the page
  draws the worker's results; its config is the documented one (the wheel by "files", then
  "emfs:").
(The PyScript guide's page, docs/guides/pyscript.md, runs in tests/browser/test_docs_examples.py
with every other html block of the docs.)
"""

from __future__ import annotations

import base64
import json
import re
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest

from tests.browser.test_demos import FIT_ORANGE, LOSS_BLUE, PIXELS, RECTS, SIN_GRAY

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import docsite

WAIT_MS = 300_000

HEARTBEAT = """
window.__beats = [];
setInterval(() => window.__beats.push(performance.now()), 20);
"""

BLOB_BASE64 = """async (id) => {
  const buf = new Uint8Array(await (await fetch(document.getElementById(id).href)).arrayBuffer());
  let s = "";
  for (let i = 0; i < buf.length; i += 0x8000) {
    s += String.fromCharCode(...buf.subarray(i, i + 0x8000));
  }
  return btoa(s);
}"""


class Watched:
    """A page with its console, errors and every requested URL recorded."""

    def __init__(self, browser: Any):
        self.page = browser.new_page(viewport={"width": 1100, "height": 900})
        self.console: list[str] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(f"[pageerror] {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.add_init_script(HEARTBEAT)

    def _console(self, m: Any) -> None:
        (self.errors if m.type == "error" else self.console).append(m.text)

    def foreign_requests(self, base: str) -> list[str]:
        host = urlparse(base).netloc
        return [u for u in self.requests
                if urlparse(u).scheme in ("http", "https", "ws", "wss")
                and urlparse(u).netloc != host]


@pytest.fixture
def watched(browser: Any) -> Any:
    pages: list[Watched] = []

    def make() -> Watched:
        pages.append(Watched(browser))
        return pages[-1]

    yield make
    for p in pages:
        p.page.close()


def test_pyscript_is_served_offline(web_url: str) -> None:
    import urllib.request

    import build

    manifest = json.loads(urllib.request.urlopen(f"{web_url}manifest.json").read())
    assert manifest["pyscript"] == build.PYSCRIPT_VERSION
    package = json.loads((ROOT / "package.json").read_text())["dependencies"]
    assert package["@pyscript/core"] == build.PYSCRIPT_VERSION  # pinned exactly
    lock = json.loads((ROOT / "package-lock.json").read_text())["packages"]
    assert lock["node_modules/@pyscript/core"]["version"] == build.PYSCRIPT_VERSION
    core = urllib.request.urlopen(f"{web_url}pyscript/core.js").read().decode()
    chunk = re.search(r'from"\./(core-[\w-]+\.js)"', core)
    assert "PyWorker" in core and chunk, core
    assert len(urllib.request.urlopen(f"{web_url}pyscript/{chunk[1]}").read()) > 100_000
    # the demo's config names this build's wheel and the served Pyodide
    config = json.loads((ROOT / "demos" / "pyscript_mlp" / "pyscript.json").read_text())
    assert config["interpreter"] == "../../pyodide/pyodide.mjs"
    assert config["packages"] == [f"../../{manifest['wheel']}"]
    assert "pyscript_mlp" in manifest["demos"]
    index = urllib.request.urlopen(f"{web_url}demos/").read().decode()
    assert 'href="pyscript_mlp/"' in index


def check_sin_plots(page: Any, png: Path) -> None:
    """The page's #loss and #fit cards, screenshotted to `png`, hold the loss curve (blue)
    and sin(x) (gray) with the model's fit (orange)."""
    shot = page.screenshot(path=str(png), full_page=True)
    px = page.evaluate(PIXELS, {"png": base64.b64encode(shot).decode(),
                                "rects": page.evaluate(RECTS, ["loss", "fit"]),
                                "colors": {"blue": LOSS_BLUE, "orange": FIT_ORANGE,
                                           "gray": SIN_GRAY}})
    print(f"screenshot pixels: {px}")
    assert px["loss"]["blue"] > 300, px
    assert px["fit"]["orange"] > 300 and px["fit"]["gray"] > 300, px


def test_pyscript_mlp_demo_trains_plots_stays_responsive_and_exports(
        watched: Any, web_url: str, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    w = watched()
    t0 = time.perf_counter()
    w.page.goto(f"{web_url}demos/pyscript_mlp/")
    w.page.wait_for_function("window.tgDemo && window.tgDemo.done", timeout=WAIT_MS)
    wall_s = time.perf_counter() - t0
    state = w.page.evaluate("window.tgDemo")
    assert state["ok"], f"{state.get('error')}\n" + "\n".join(w.errors + w.console[-30:])
    fig = state["figures"]
    print(f"\npyscript_mlp: {fig} (page wall {wall_s:.1f} s)")
    assert fig["steps_to_target"] is not None and fig["loss_avg10"] < 0.01, fig
    assert fig["steps"] == fig["steps_to_target"] and not fig["stopped"], fig
    assert fig["fit_mse"] < 0.02 and fig["kernels"] > 0, fig
    lines = w.page.evaluate("document.getElementById('log').textContent").splitlines()
    assert lines[0].startswith("PyScript ready in "), lines
    assert any(line.startswith("compiled in ") for line in lines), lines
    assert any(line.startswith("done: ") for line in lines), lines

    # responsiveness: the page's own timers kept firing while the worker trained
    gaps = w.page.evaluate("""() => {
      const { start, end } = window.tgTraining;
      const b = window.__beats.filter((t) => t >= start && t <= end);
      const gaps = b.slice(1).map((t, i) => t - b[i]);
      gaps.sort((x, y) => x - y);
      return { beats: b.length, max: gaps.at(-1), p99: gaps[Math.floor(gaps.length * 0.99)],
               span: end - start };
    }""")
    print(f"heartbeat during training (20 ms timer): {gaps}")
    # On an idle 2-core machine: p99 ~23-26 ms, max ~22-33 ms; at load average 9 on the 2
    # cores (other test runs) p99 ~60-100 ms and max up to 292 ms were seen, so the bounds leave
    # room for that while a page blocked by Python (a synchronous step loop) fails them.
    assert gaps["beats"] > 0.5 * gaps["span"] / 20, gaps   # mostly on time
    assert gaps["p99"] < 250, gaps
    assert gaps["max"] < 1000, gaps                         # never frozen for a second

    # the plots
    w.page.evaluate("() => new Promise((r) => requestAnimationFrame(() => r()))")
    check_sin_plots(w.page, tmp_path / "pyscript_mlp.png")
    assert int(w.page.evaluate("document.getElementById('loss').dataset.points")) >= \
        fig["steps"]

    # Export to PyTorch from the page, then load the downloads here with torch
    w.page.click("#export")
    w.page.wait_for_function("window.tgExport !== undefined", timeout=WAIT_MS)
    src = base64.b64decode(w.page.evaluate(BLOB_BASE64, "dl-py")).decode()
    weights = base64.b64decode(w.page.evaluate(BLOB_BASE64, "dl-weights"))
    (tmp_path / "mlp_torch.py").write_text(src)
    (tmp_path / "mlp_torch.safetensors").write_bytes(weights)
    assert 'load_file("mlp_torch.safetensors")' in src and "class MLP(nn.Module)" in src
    namespace: dict[str, Any] = {}
    exec(compile(src, str(tmp_path / "mlp_torch.py"), "exec"), namespace)  # noqa: S102
    model = namespace["MLP"]()
    model.load_state_dict(load_file(str(tmp_path / "mlp_torch.safetensors")))
    fit = w.page.evaluate("window.tgFit")
    xs = torch.tensor(fit["xs"], dtype=torch.float32).reshape(-1, 1)
    got = model(xs).detach().numpy().reshape(-1)
    err = float(np.max(np.abs(got - np.array(fit["pred"], np.float32))))
    print(f"exported model vs the page's GPU predictions: max abs {err:.2e}")
    assert err < 1e-5, err

    assert not w.foreign_requests(web_url), w.foreign_requests(web_url)
    assert not w.errors, w.errors


def heartbeat_gaps(page: Any) -> dict[str, Any]:
    """The 20 ms heartbeat (HEARTBEAT) between window.tgTraining's start and end."""
    return page.evaluate("""() => {
      const { start, end } = window.tgTraining;
      const b = window.__beats.filter((t) => t >= start && t <= end);
      const gaps = b.slice(1).map((t, i) => t - b[i]);
      gaps.sort((x, y) => x - y);
      return { beats: b.length, max: gaps.at(-1), p99: gaps[Math.floor(gaps.length * 0.99)],
               span: end - start };
    }""")


def test_pyscript_worker_demo_trains_in_process_while_the_page_ticks(
        watched: Any, web_url: str, tmp_path: Path) -> None:
    import build

    wheel = json.loads((build.WEB / "manifest.json").read_text())["wheel"]
    config = json.loads((ROOT / "demos" / "pyscript_worker" / "pyscript.json").read_text())
    assert config == {"interpreter": "../../pyodide/pyodide.mjs",
                      "files": {f"../../{wheel}": f"./{wheel}"},
                      "packages": [f"emfs:./{wheel}"]}, config
    # the guide's worker page (its html block, run by test_docs_examples) has this very config
    guide = ROOT / "docs" / "guides" / "notebooks.md"
    section = guide.read_text().split("\n## PyScript, in a worker", 1)[1].split("\n## ", 1)[0]
    pages = [b.code for b in docsite.code_blocks(guide) if b.lang == "html" and b.code in section]
    documented = pages and re.search(r"<script type=\"py\" worker config='(.*?)'>", pages[0],
                                     re.DOTALL)
    assert documented and json.loads(documented[1]) == config, "the guide's config differs"
    w = watched()
    t0 = time.perf_counter()
    w.page.goto(f"{web_url}demos/pyscript_worker/")
    w.page.wait_for_function("window.tgDemo && window.tgDemo.done", timeout=WAIT_MS)
    state = w.page.evaluate("window.tgDemo")
    assert state["ok"], f"{state.get('error')}\n" + "\n".join(w.errors + w.console[-30:])
    fig = state["figures"]
    print(f"\npyscript_worker: {fig} (page wall {time.perf_counter() - t0:.1f} s)")
    assert fig["mode"] == "worker" and fig["device"] == "google swiftshader (browser)", fig
    assert fig["steps_to_target"] is not None and fig["loss_avg10"] < 0.01, fig
    assert fig["fit_mse"] < 0.02, fig
    log = w.page.evaluate("document.getElementById('log').textContent")
    assert re.search(r"WebGPU ready: google swiftshader \(in-process, on this Web Worker", log)
    # the page's own timer kept firing while the worker trained (counted, and its gaps)
    gaps = heartbeat_gaps(w.page)
    print(f"heartbeat during training (20 ms timer): {gaps}; the page's own timer ticked "
          f"{fig['ticks']} times meanwhile")
    assert fig["ticks"] > 0.5 * gaps["span"] / 20, (fig, gaps)
    assert gaps["beats"] > 0.5 * gaps["span"] / 20 and gaps["p99"] < 250, gaps
    assert gaps["max"] < 1000, gaps
    # the plots, drawn on the page from the worker's numbers
    check_sin_plots(w.page, tmp_path / "pyscript_worker.png")
    assert int(w.page.evaluate("document.getElementById('loss').dataset.longest")) == \
        fig["steps"]
    assert not w.foreign_requests(web_url), w.foreign_requests(web_url)
    assert not w.errors, w.errors
