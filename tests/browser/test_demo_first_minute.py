"""Every demo page as a new user sees it: opened with its own settings (not the short headless
run), left to train for 30 s after its first step, then looked at in a 1280 px window and on
a 390 px phone screen. Nothing may overflow its card or the window (DOM geometry), every
chart must have at least two points and every card something in it (no "no data yet"), and
no console error or "NaN" may appear. The screenshots are saved (the path is printed).

The pages run in parallel tabs of the one browser, a few at a time (PAGES_AT_ONCE): each has
its own worker, and on a 2-core machine with a software GPU more at once would starve them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .conftest import build

TRAIN_S = 30             # seconds of training before the page is judged
PAGES_AT_ONCE = 4
START_TIMEOUT_S = 420    # from opening a page to its first training step
WIDTHS = {"desktop": (1280, 900), "phone": (390, 844)}

# What is wrong with the page's layout and content: overflowing elements, charts with fewer
# than 2 points, empty canvases and cards, and whether "NaN" shows anywhere.
INSPECT = """() => {
  const vw = document.documentElement.clientWidth, problems = [];
  const name = (e) => e.id ? `#${e.id}` : `${e.tagName.toLowerCase()}.${e.className}`;
  const box = (r) => `${Math.round(r.left)}..${Math.round(r.right)} x ${Math.round(r.top)}..${Math.round(r.bottom)}`;
  const visible = (r) => r.width > 0 && r.height > 0;
  if (document.documentElement.scrollWidth > vw + 1) {
    problems.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${vw} px window`);
  }
  for (const e of document.body.querySelectorAll("*")) {
    const r = e.getBoundingClientRect();
    if (visible(r) && (r.right > vw + 1 || r.left < -1)) problems.push(`${name(e)} ${box(r)} leaves the ${vw} px window`);
  }
  for (const card of document.querySelectorAll(".card")) {
    const c = card.getBoundingClientRect();
    for (const e of card.querySelectorAll("*")) {
      const r = e.getBoundingClientRect();
      if (visible(r) && (r.left < c.left - 1 || r.right > c.right + 1 || r.top < c.top - 1 ||
                         r.bottom > c.bottom + 1)) {
        problems.push(`${name(e)} ${box(r)} overflows its card ${box(c)}`);
      }
    }
    const canvases = card.querySelectorAll("canvas");
    for (const canvas of canvases) {
      if ("longest" in canvas.dataset && +canvas.dataset.longest < 2) {
        problems.push(`chart #${canvas.id} has ${canvas.dataset.longest} points in a line`);
      } else if (!(+canvas.dataset.filled > 0)) {
        problems.push(`canvas #${canvas.id} is empty`);
      }
      if (+canvas.dataset.right > canvas.clientWidth + 1) {
        problems.push(`#${canvas.id} draws to x = ${canvas.dataset.right} in ${canvas.clientWidth} px`);
      }
    }
    if (!canvases.length && !card.innerText.trim()) problems.push(`card ${name(card)} is empty`);
  }
  if (/\\bNaN\\b/.test(document.body.innerText)) problems.push("the page shows NaN");
  return problems;
}"""

FRAME = "() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"
STEP = "() => Number(document.getElementById('s-step')?.textContent) || 0"


@dataclass
class Watch:
    """One demo's tab: its errors, when it opened and when training began."""

    name: str
    page: Any
    opened: float = field(default_factory=time.perf_counter)
    trained_from: float | None = None
    errors: list[str] = field(default_factory=list)

    def seconds(self) -> float:
        return time.perf_counter() - self.opened


def open_demo(context: Any, url: str, name: str) -> Watch:
    page = context.new_page()
    watch = Watch(name, page)
    page.on("console", lambda m: watch.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: watch.errors.append(f"[pageerror] {e}"))
    # a user's settings (headless=0: not the short run automation gets), started at once
    page.goto(f"{url}demos/{name}/?autostart=1&headless=0" if name != "pyscript_mlp"
              else f"{url}demos/{name}/")
    return watch


def judge(watch: Watch, shots: Path) -> list[str]:
    """The page's problems at each width (screenshots saved in `shots`)."""
    problems = [f"console: {e}" for e in watch.errors]
    for label, (width, height) in WIDTHS.items():
        watch.page.bring_to_front()
        watch.page.set_viewport_size({"width": width, "height": height})
        watch.page.evaluate(FRAME)
        watch.page.screenshot(path=str(shots / f"{watch.name}-{width}.png"), full_page=True,
                              timeout=120_000)
        problems += [f"{label} ({width} px): {p}" for p in watch.page.evaluate(INSPECT)]
    return problems


def test_every_demo_shows_progress_and_fits_the_screen_after_30_s(
        browser: Any, web_url: str, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    waiting, running, report = list(build.demo_names()), [], {}
    try:
        while waiting or running:
            while waiting and len(running) < PAGES_AT_ONCE:
                running.append(open_demo(context, web_url, waiting.pop(0)))
            for watch in list(running):
                if watch.trained_from is None and watch.page.evaluate(STEP) >= 1:
                    watch.trained_from = time.perf_counter()
                ready = watch.trained_from is not None and \
                    time.perf_counter() - watch.trained_from >= TRAIN_S
                if ready or watch.errors or watch.seconds() > START_TIMEOUT_S:
                    late = [] if watch.trained_from else [
                        f"no training step {watch.seconds():.0f} s after opening"]
                    report[watch.name] = (late + judge(watch, tmp_path),
                                          watch.page.evaluate(STEP), watch.seconds())
                    watch.page.close()
                    running.remove(watch)
            time.sleep(0.5)
    finally:
        context.close()
    elapsed = time.perf_counter() - t0
    print(f"\nfirst 30 s of every demo: {elapsed:.0f} s for {len(report)} pages, "
          f"{PAGES_AT_ONCE} at once; screenshots in {tmp_path}")
    for name, (problems, step, seconds) in sorted(report.items()):
        print(f"  {name}: step {step} after {seconds:.0f} s; "
              f"{'; '.join(problems) if problems else 'fine'}")
    bad = {name: problems for name, (problems, _, _) in report.items() if problems}
    assert set(report) == set(build.demo_names())
    assert not bad, bad
