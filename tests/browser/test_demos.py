"""The demo pages (demos/*/index.html) in headless Chromium: each trains a few steps from its
URL parameters, reports `window.tgDemo = {done, ok, figures}`, logs the same lines to the page
and the console (what `python build.py demo NAME` prints), and draws its plots. A screenshot of
each page is saved under pytest's tmp dir and read back to check the plots are drawn."""

from __future__ import annotations

import base64
import math
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

WAIT_MS = 300_000
LOSS_BLUE = (37, 99, 235)     # COLORS.blue in demos/common/plot.js: the loss curve
FIT_ORANGE = (234, 88, 12)    # COLORS.orange: the MLP's prediction
SIN_GRAY = (156, 163, 175)    # COLORS.gray: sin(x)

# Decode a PNG (base64) in the page and count, inside each rect (document coordinates), the
# pixels that are not background and those near each wanted colour.
PIXELS = """async ({ png, rects, colors }) => {
  const img = new Image();
  img.src = "data:image/png;base64," + png;
  await img.decode();
  const canvas = new OffscreenCanvas(img.width, img.height);
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(img, 0, 0);
  const out = {};
  for (const [name, r] of Object.entries(rects)) {
    const { data } = ctx.getImageData(Math.round(r.x), Math.round(r.y), Math.round(r.width),
                                      Math.round(r.height));
    const near = Object.fromEntries(Object.keys(colors).map((c) => [c, 0]));
    let ink = 0;
    for (let i = 0; i < data.length; i += 4) {
      const [R, G, B] = [data[i], data[i + 1], data[i + 2]];
      if (R < 245 || G < 245 || B < 245) ink++;
      for (const [c, [r0, g0, b0]] of Object.entries(colors)) {
        if (Math.abs(R - r0) + Math.abs(G - g0) + Math.abs(B - b0) < 60) near[c]++;
      }
    }
    out[name] = { pixels: data.length / 4, ink, ...near };
  }
  return out;
}"""

RECTS = """(ids) => Object.fromEntries(ids.map((id) => {
  const r = document.getElementById(id).getBoundingClientRect();
  return [id, { x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height }];
}))"""


class DemoPage:
    """A demo page in its own tab (its own worker), with its console lines kept."""

    def __init__(self, browser: Any, url: str):
        self.page = browser.new_page(viewport={"width": 1100, "height": 900})
        self.console: list[str] = []
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(f"[pageerror] {e}"))
        self.page.goto(url)

    def _console(self, message: Any) -> None:
        if message.type == "log":
            self.console.append(message.text)
        elif message.type == "error":
            self.errors.append(message.text)

    def wait_done(self) -> dict[str, Any]:
        self.page.wait_for_function("window.tgDemo && window.tgDemo.done", timeout=WAIT_MS)
        state = self.page.evaluate("window.tgDemo")
        assert state["ok"], f"{state.get('error')}\n" + "\n".join(self.errors[-20:])
        return state["figures"]

    def log_lines(self) -> list[str]:
        return self.page.evaluate("document.getElementById('log').textContent").splitlines()

    def text(self, element_id: str) -> str:
        return self.page.evaluate(f"document.getElementById({element_id!r}).textContent")

    def screenshot_pixels(self, path: Path, ids: list[str],
                          colors: dict[str, tuple[int, int, int]]) -> dict[str, dict[str, int]]:
        """Save a full-page screenshot to `path`; pixel counts of it inside each element."""
        self.page.evaluate("() => new Promise((r) => requestAnimationFrame(() => r()))")
        png = self.page.screenshot(path=str(path), full_page=True)
        return self.page.evaluate(PIXELS, {"png": base64.b64encode(png).decode(),
                                           "rects": self.page.evaluate(RECTS, ids),
                                           "colors": colors})

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def open_demo(browser: Any, web_url: str) -> Iterator[Any]:
    pages: list[DemoPage] = []

    def open_(name: str, query: str) -> DemoPage:
        pages.append(DemoPage(browser, f"{web_url}demos/{name}/{query}"))
        return pages[-1]

    yield open_
    for p in pages:
        p.close()


def check_log_is_console(demo: DemoPage) -> list[str]:
    """Every line the page shows in its log went to the console too, in the same order."""
    lines = [line for line in demo.log_lines() if line]
    console = [c for c in demo.console if c]
    assert lines == console[:len(lines)] or lines == console, (lines, console)
    assert any(line.startswith("ready in ") for line in lines), lines
    assert any(line.startswith("compiled in ") for line in lines), lines
    assert any(line.startswith("done: ") for line in lines), lines
    return lines


ALL_DEMOS = ("mlp_sin", "addition_transformer", "makemore", "pokeformer", "digit_canvas",
             "mnist_cnn", "flow_matching", "vae", "nerf", "kan", "cartpole", "tic_tac_toe",
             "pyscript_mlp", "pyscript_worker", "transfer")  # the twelve upstream samples,
# the PyScript pages and the transfer-learning page


def test_index_links_to_every_demo_with_a_thumbnail(web_url: str) -> None:
    from .conftest import build

    html = urllib.request.urlopen(f"{web_url}demos/").read().decode()
    assert set(ALL_DEMOS) == set(build.demo_names())
    assert html.count('<svg class="thumb"') == len(ALL_DEMOS)
    for name in build.demo_names():
        assert f'href="{name}/"' in html
        page = urllib.request.urlopen(f"{web_url}demos/{name}/").read().decode()
        # a Demo page (demos/common/demo.js) or a PyScript page feeding the same shell
        assert "new Demo(" in page or ('<script type="py"' in page and "new Shell(" in page)
        main = urllib.request.urlopen(f"{web_url}demos/{name}/main.py").read().decode()
        assert "async def main()" in main
    for name in ("mnist-train-images.u8", "mnist-test-labels.u8", "names.txt", "pokemon.txt"):
        data = urllib.request.urlopen(f"{web_url}data/{name}").read()
        assert len(data) > 1000, name


def test_every_demo_has_a_browser_test() -> None:
    from . import test_pyscript  # the PyScript demo's test lives beside the PyScript tests
    from .conftest import build

    tests = {name for name in [*globals(), *vars(test_pyscript)] if name.startswith("test_")}
    untested = [d for d in build.demo_names() if d not in NEW_DEMOS and not any(
        t.startswith(f"test_{d}_demo") for t in tests)]
    assert not untested, (f"demos without a test_<name>_demo... browser test or a NEW_DEMOS "
                          f"entry: {untested}")


def test_mlp_sin_demo_trains_and_plots(open_demo: Any, tmp_path: Path) -> None:
    demo = open_demo("mlp_sin", "?autostart=1&steps=150&seed=1&every=50")
    figures = demo.wait_done()
    print(f"\nmlp_sin demo: {figures}")
    assert figures["steps"] == 150 and not figures["stopped"], figures
    assert figures["loss_avg10"] < 0.02 and figures["fit_mse"] < 0.02, figures
    assert figures["steps_per_s"] > 0 and figures["kernels"] > 0, figures
    lines = check_log_is_console(demo)
    # evaluations at 25 (the early schedule), at every multiple of 50, and whenever 10 s
    # have passed (a slow page)
    logged = [int(line.split()[1]) for line in lines if line.startswith("step ")]
    assert {25, 50, 100, 150} <= set(logged), lines

    assert demo.page.evaluate("document.getElementById('loss').dataset.points") == "300"
    assert demo.page.evaluate("document.getElementById('fit').dataset.points") == "400"
    shot = tmp_path / "mlp_sin.png"
    px = demo.screenshot_pixels(shot, ["loss", "fit"], {"blue": LOSS_BLUE, "orange": FIT_ORANGE,
                                                        "gray": SIN_GRAY})
    print(f"screenshot {shot}: {px}")
    assert shot.stat().st_size > 10_000
    assert px["loss"]["blue"] > 300, px     # the smoothed loss curve across the plot
    assert px["fit"]["orange"] > 300, px    # the model's prediction
    assert px["fit"]["gray"] > 300, px      # sin(x)
    assert px["loss"]["ink"] > 0.02 * px["loss"]["pixels"], px

    # Start trains more; Stop ends the run early; Reset clears the figures.
    demo.page.click("#start")
    demo.page.wait_for_function("+document.getElementById('s-step').textContent >= 165",
                                timeout=WAIT_MS)
    demo.page.click("#stop")
    demo.page.wait_for_function("!document.getElementById('start').disabled", timeout=WAIT_MS)
    status = demo.text("status")
    assert status.startswith("stopped at step "), status
    assert 165 <= int(status.split()[-1]) < 300, status
    demo.page.click("#reset")
    demo.page.wait_for_function("document.getElementById('status').textContent.startsWith('reset')",
                                timeout=WAIT_MS)
    assert demo.text("s-step") == "0"
    demo.page.evaluate("() => new Promise((r) => requestAnimationFrame(() => r()))")
    assert demo.page.evaluate("document.getElementById('loss').dataset.points") == "0"
    assert not demo.errors, demo.errors


def test_addition_transformer_demo_trains_and_shows_predictions(open_demo: Any,
                                                                tmp_path: Path) -> None:
    demo = open_demo("addition_transformer", "?autostart=1&steps=2&seed=1&every=1&eval=10")
    figures = demo.wait_done()
    print(f"\naddition_transformer demo: {figures}")
    assert figures["steps"] == 2 and figures["kernels"] > 0, figures
    assert 0 < figures["loss"] < 3.0, figures  # ln(12) ≈ 2.48 at the start
    assert 0 <= figures["train_acc"] <= 1 and 0 <= figures["test_acc"] <= 1, figures
    assert figures["eval_pairs"] == 10, figures
    lines = check_log_is_console(demo)
    assert sum(line.startswith("step ") for line in lines) == 2, lines

    rows = demo.page.evaluate("""[...document.querySelectorAll('#table tbody tr')]
        .map((tr) => [...tr.cells].map((td) => td.textContent))""")
    assert len(rows) == 10, rows
    for a, plus, b, pred, true, mark in rows:
        assert plus == "+" and int(true) == int(a) + int(b), rows
        assert mark == ("✓" if int(pred) == int(true) else "✗"), rows
    assert demo.page.evaluate("document.getElementById('loss').dataset.points") == "2"
    assert int(demo.page.evaluate("document.getElementById('acc').dataset.points")) >= 6
    shot = tmp_path / "addition_transformer.png"
    px = demo.screenshot_pixels(shot, ["loss", "acc", "table"], {"blue": LOSS_BLUE})
    print(f"screenshot {shot}: {px}")
    assert shot.stat().st_size > 10_000
    assert px["loss"]["blue"] > 300, px  # the loss curve
    assert px["table"]["ink"] > 1000, px
    assert not demo.errors, demo.errors


# Each new demo: its URL parameters (a short run), the canvases that must show content, and
# a check of its figures. The figures are printed (what `python build.py demo NAME` prints).
NEW_DEMOS = {
    "mnist_cnn": ("steps=30&every=30&eval=2000", ["loss", "acc", "digits"],
                  lambda f: f["steps"] == 30 and 0.5 < f["test_acc"] <= 1 and f["test_digits"] == 2000),
    "digit_canvas": ("steps=200&every=100&eval=2000", ["loss", "acc"],
                     lambda f: f["steps"] == 200 and f["test_acc"] > 0.8),
    "cartpole": ("steps=40&every=10", ["lengths", "pole", "loss"],
                 lambda f: f["rollouts"] == 40 and f["mean_length"] >= 8),
    "tic_tac_toe": ("steps=20&every=10&games=50", ["rates", "loss"],
                    lambda f: f["games"] == 50 and f["steps"] == 20),
    "kan": ("steps=150&every=50", ["loss", "fit", "layer1", "layer2"],
            lambda f: f["steps"] == 150 and f["fit_mse"] < 0.05),
    "nerf": ("steps=60&every=30", ["loss", "render", "target"],
             lambda f: f["steps"] == 60 and f["image_mse"] < 0.05),
    "vae": ("steps=20&every=10", ["loss", "originals", "recons", "samples"],
            lambda f: f["steps"] == 20 and f["loss_avg10"] < 100),  # ~170 untrained
    "flow_matching": ("steps=2&every=2&samples=1", ["loss", "samples"],
                      lambda f: f["steps"] == 2 and f["euler_steps"] == 25),
    "makemore": ("steps=20&every=10&samples=6&val=256", ["loss", "val"],
                 lambda f: f["steps"] == 20 and f["val_loss"] < 3.4 and f["unigram_loss"] > 2),
    "pokeformer": ("steps=20&every=10&samples=6", ["loss", "val"],
                   lambda f: f["steps"] == 20 and f["val_loss"] < 3.4 and f["unigram_loss"] > 2),
}


@pytest.mark.parametrize("name", list(NEW_DEMOS))
def test_demo_trains_in_the_worker_and_draws(name: str, open_demo: Any, tmp_path: Path) -> None:
    query, canvases, check = NEW_DEMOS[name]
    demo = open_demo(name, f"?autostart=1&seed=1&{query}")
    demo.page.wait_for_function("window.tgDemo && window.tgDemo.done", timeout=900_000)
    figures = demo.wait_done()
    print(f"\n{name} demo (browser): {figures}")
    assert check(figures), figures
    assert figures["kernels"] > 0 and figures["params"] > 0, figures
    lines = check_log_is_console(demo)
    assert int(demo.text("s-step")) == figures["steps"]
    assert int(demo.page.evaluate("document.getElementById('loss').dataset.points")) >= \
        figures["steps"]
    shot = tmp_path / f"{name}.png"
    px = demo.screenshot_pixels(shot, canvases, {"blue": LOSS_BLUE})
    print(f"screenshot {shot}: {px}")
    for canvas in canvases:
        assert px[canvas]["ink"] > 0.02 * px[canvas]["pixels"], (canvas, px)
    assert px["loss"]["blue"] > 50, px
    assert not demo.errors, demo.errors
    assert lines[-1].startswith("done: ") or any(line.startswith("done: ") for line in lines)


def test_digit_canvas_draws_predicts_swaps_and_saves(open_demo: Any) -> None:
    demo = open_demo("digit_canvas", "?autostart=1&seed=1&steps=100&every=100&eval=500")
    demo.wait_done()
    box = demo.page.locator("#pad").bounding_box()
    demo.page.mouse.move(box["x"] + 140, box["y"] + 40)
    demo.page.mouse.down()
    for k in range(1, 21):  # a vertical stroke: a "1"
        demo.page.mouse.move(box["x"] + 140, box["y"] + 40 + 10 * k)
    demo.page.mouse.up()
    demo.page.wait_for_function("window.tgDigits.predictions() > 0", timeout=WAIT_MS)
    probs = demo.page.evaluate("window.tgDigits.probs()")
    assert len(probs) == 10 and abs(sum(probs) - 1) < 1e-3, probs
    demo.page.click("#save")
    demo.page.wait_for_function("document.getElementById('saved').textContent.startsWith('saved H=128')",
                                timeout=WAIT_MS)
    demo.page.select_option("#hidden", "64")
    demo.page.wait_for_function("document.getElementById('s-params').textContent === '50,890'",
                                timeout=WAIT_MS)
    demo.page.click("#load")
    demo.page.wait_for_function("document.getElementById('saved').textContent.startsWith('loaded H=128')",
                                timeout=WAIT_MS)
    assert demo.page.evaluate("document.getElementById('hidden').value") == "128"
    assert not demo.errors, demo.errors


def draw(demo: DemoPage, points: list[tuple[float, float]]) -> None:
    """One stroke through `points` (fractions of the drawing pad's width and height)."""
    box = demo.page.locator("#pad").bounding_box()
    at = [(box["x"] + fx * box["width"], box["y"] + fy * box["height"]) for fx, fy in points]
    demo.page.mouse.move(*at[0])
    demo.page.mouse.down()
    for x, y in at[1:]:
        demo.page.mouse.move(x, y, steps=4)
    demo.page.mouse.up()


def line(x0: float, y0: float, x1: float, y1: float) -> list[tuple[float, float]]:
    return [(x0 + (x1 - x0) * k / 10, y0 + (y1 - y0) * k / 10) for k in range(11)]


def ring(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    return [(cx + r * math.cos(2 * math.pi * k / 16), cy + r * math.sin(2 * math.pi * k / 16))
            for k in range(17)]


def test_transfer_demo_trains_a_head_on_drawn_classes_over_a_frozen_extractor(
        open_demo: Any, tmp_path: Path) -> None:
    """The built-in quick start (a new head on the frozen pretrained extractor learns 7, 8,
    9 from 8 examples each) runs in the worker; then three classes are drawn with the mouse
    (vertical strokes, horizontal strokes, rings; 3 each), named, trained on, and a new
    drawing gets a live prediction of its class. The extractor stays bit-identical."""
    demo = open_demo("transfer", "?autostart=1&seed=1&steps=60&every=20")
    figures = demo.wait_done()
    print(f"\ntransfer demo (browser): {figures}")
    assert figures["steps"] == 60 and figures["held_out"] == 629, figures
    assert figures["held_out_acc"] >= 0.88 and figures["train_acc"] == 1, figures
    assert figures["extractor_unchanged"] and figures["features"] == "pretrained", figures
    check_log_is_console(demo)
    assert demo.text("s-frozen") == "unchanged"
    shot = tmp_path / "transfer.png"
    px = demo.screenshot_pixels(shot, ["loss", "acc", "shown", "ex0", "pad"],
                                {"blue": LOSS_BLUE})
    print(f"screenshot {shot}: {px}")
    for canvas in ("loss", "acc", "shown", "ex0", "pad"):
        assert px[canvas]["ink"] > 0.02 * px[canvas]["pixels"], (canvas, px)

    demo.page.click("#forget")
    shapes = {"vertical": [line(0.5, 0.15, 0.5, 0.85), line(0.35, 0.2, 0.4, 0.8),
                           line(0.6, 0.1, 0.55, 0.9)],
              "flat": [line(0.15, 0.5, 0.85, 0.5), line(0.2, 0.3, 0.8, 0.35),
                       line(0.1, 0.7, 0.9, 0.65)],
              "ring": [ring(0.5, 0.5, 0.3), ring(0.45, 0.5, 0.22), ring(0.5, 0.45, 0.35)]}
    for i, (name, strokes) in enumerate(shapes.items()):
        demo.page.fill(f"#name{i}", name)
        for stroke in strokes:
            draw(demo, stroke)
            demo.page.click(f"#add{i}")
    assert demo.page.evaluate("window.tgTransfer.classes()") == [
        {"name": name, "count": 3} for name in shapes]
    demo.page.click("#train")
    demo.page.wait_for_function("""() => { const ev = window.demo.shell.latest();
        return ev && ev.names[0] === "vertical" && ev.step === 60 && !window.demo.running; }""",
                                timeout=WAIT_MS)
    ev = demo.page.evaluate("window.demo.shell.latest()")
    assert ev["acc"] is None and ev["train_acc"] == 1 and ev["unchanged"], ev
    assert ev["shown_truth"] == ["vertical"] * 3 + ["flat"] * 3 + ["ring"] * 3, ev
    assert demo.text("s-acc") == "– (your classes)"
    before = demo.page.evaluate("window.tgTransfer.predictions()")
    draw(demo, line(0.45, 0.1, 0.5, 0.9))
    demo.page.wait_for_function(f"window.tgTransfer.predictions() > {before}", timeout=WAIT_MS)
    demo.page.evaluate("window.tgTransfer.predict()")  # the whole stroke's prediction
    probs = demo.page.evaluate("window.tgTransfer.probs()")
    assert len(probs) == 3 and abs(sum(probs) - 1) < 1e-3, probs
    assert probs.index(max(probs)) == 0, probs
    assert demo.text("s-pred").startswith("vertical ("), demo.text("s-pred")
    demo.page.screenshot(path=str(tmp_path / "transfer-own-classes.png"), full_page=True)
    assert not demo.errors, demo.errors


def test_an_unknown_url_setting_is_an_error_not_ignored(open_demo: Any) -> None:
    """A misspelt setting stops the page with a message naming it and the real settings,
    instead of training with the defaults."""
    demo = open_demo("kan", "?autostart=1&stesp=10")
    for _ in range(100):
        if demo.errors:
            break
        demo.page.wait_for_timeout(100)
    assert any("stesp=10: not a setting of this demo" in e and "steps" in e
               for e in demo.errors), demo.errors
