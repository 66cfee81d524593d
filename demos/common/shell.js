// The page shell every demo shares: from a small description it builds, after the page's own
// <h1> and lead paragraph, the controls bar (Start/Stop/Reset, the demo's own controls, the
// status and the settings), the stats line, the cards (the training-loss chart, charts of the
// evaluations, canvases and HTML the page draws itself) and the log; it keeps the streamed
// records (losses, evaluations) and redraws what depends on them.
//
//   import { Shell, pct } from "../common/shell.js";
//   const shell = new Shell({
//     stats: [{ id: "acc", label: "held-out accuracy", value: (ev) => pct(ev.acc) }],
//     cards: ["loss",
//             { chart: "acc", title: "held-out accuracy", yLabel: "accuracy", yMin: 0, yMax: 1,
//               series: [{ key: "acc", label: "test", color: "orange" }] },
//             { canvas: "digits", draw: (canvas, ev) => imageGrid(canvas, ev?.digits ?? []) },
//             { id: "notes", html: "<p>…</p>" }],
//   });
//   shell.record({ kind: "eval", step: 25, acc: 0.8, digits });   // stats and cards follow
//
// A record is a message {kind, step, ...}: `stats` and `cards` read the records of their
// `from` kind ("eval" unless named). A record replaces those at its step and after (a Reset
// restarts the steps). Demo (demo.js) feeds the shell from the worker; a PyScript page may
// feed it from Python (window.tgShell).

import { COLORS, linePlot, lossPlot } from "./plot.js";

/** `v` (0..1) as a percentage with `digits` decimals. */
export const pct = (v, digits = 1) => `${(100 * v).toFixed(digits)}%`;

/** An element: `tag` with properties `props` (dataset and style merged) and children. */
export function el(tag, props = {}, ...children) {
  const { dataset, style, ...rest } = props;
  const node = Object.assign(document.createElement(tag), rest);
  Object.assign(node.dataset, dataset ?? {});
  Object.assign(node.style, style ?? {});
  node.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
}

const BUILTIN_STATS = (unit) => [
  { id: "step", label: unit },
  { id: "loss", label: "loss" },
];

export class Shell {
  /**
   * unit: what one training step is called ("step", "rollout"); buttons: which of
   * start/stop/reset the bar has; controls: HTML (or elements) of the demo's own controls;
   * stats: [{id, label, from, value(record) → text}] shown after step and loss (kernels and
   * params after the rate unless false); cards, each with an optional className ("wide":
   * the whole row):
   *   "loss"                                 the training loss (lossTitle, lossLogY)
   *   {chart: id, title, yLabel, series: [{key, label, color, width, dots}], from, xLabel,
   *    yMin, yMax, logY, empty}              a line per series of record[key] (or key(record))
   *                                          over the records' steps
   *   {canvas: id, draw(canvas, record, shell), from}   drawn from the latest record (null
   *                                          before the first)
   *   {id, html}                             HTML the page fills itself
   * files: the sources linked under the lead paragraph (besides "all demos").
   */
  constructor({ unit = "step", buttons = ["start", "stop", "reset"], controls = "",
                stats = [], cards = ["loss"], lossTitle = "training loss (log scale)",
                lossLogY = true, kernels = true, params = true,
                files = ["main.py", "model.py"] } = {}) {
    this.unit = unit;
    this.lossTitle = lossTitle;
    this.lossLogY = lossLogY;
    this.losses = [];
    this.records = {};      // kind → [record] (the latest whole, earlier ones' plain values)
    this.stats = [...BUILTIN_STATS(unit), ...stats,
                  { id: "rate", label: `${unit}s/s`, after: true },
                  ...(kernels ? [{ id: "kernels", label: "kernels", after: true }] : []),
                  ...(params ? [{ id: "params", label: "params", after: true }] : [])];
    this.cards = cards.map((c) => (c === "loss" ? { loss: true, canvas: "loss" } : c));
    this.pending = new Set();
    this.frame = 0;
    this.build(buttons, controls, files);
    addEventListener("resize", () => this.redraw());
    this.redraw();
  }

  build(buttons, controls, files) {
    const links = el("p", { className: "links" }, [...files, "../"].flatMap((f, i) => [
      i ? " · " : "", el("a", { href: f }, f === "../" ? "all demos" : f.replace(/^.*\//, ""))]));
    const bar = el("div", { className: "bar" },
      buttons.map((b) => el("button", { id: b, disabled: true }, b[0].toUpperCase() + b.slice(1))));
    const extra = el("span", { className: "controls" });
    if (typeof controls === "string") extra.innerHTML = controls;
    else extra.append(...[controls].flat());
    bar.append(extra, el("span", { id: "status" }, "starting…"), el("span", { id: "config" }));
    const stats = el("div", { className: "stats" }, this.stats.map((s) => (s.after
      ? el("span", {}, el("b", { id: `s-${s.id}` }, "–"), ` ${s.label}`)
      : el("span", {}, `${s.label} `, el("b", { id: `s-${s.id}` }, s.id === "step" ? "0" : "–")))));
    const figures = el("div", { className: "figures" }, this.cards.map((c) => this.card(c)));
    this.logEl = el("pre", { id: "log" });
    document.body.append(links, bar, stats, figures, this.logEl);
  }

  card(c) {
    if (c.html !== undefined) {
      const node = el("div", { className: `card ${c.className ?? ""}`, id: c.id });
      node.innerHTML = c.html;
      return node;
    }
    const id = c.chart ?? c.canvas;
    return el("div", { className: `card ${c.className ?? ""}` },
      el("canvas", { id, className: c.chart || c.loss ? "chart" : "" }));
  }

  /** The text of stat `id` (s-<id>), when the page has it. */
  stat(id, text) {
    const node = document.getElementById(`s-${id}`);
    if (node) node.textContent = text;
  }

  /** A progress line: on the page and on the console (so build.py prints it). */
  log(text, level = "log") {
    console[level](text);
    this.logEl.textContent += `${text}\n`;
    this.logEl.scrollTop = this.logEl.scrollHeight;
  }

  /** Losses from step `step` on (1-based; an earlier step restarts the curve there). */
  addLosses(step, values) {
    this.losses.length = step - 1;
    for (const v of values) this.losses.push(v);
    this.stat("step", String(this.losses.length));
    this.stat("loss", Number(values.at(-1)).toPrecision(4));
    this.schedule("loss");
  }

  /** A record {kind, step, ...}: kept, its stats shown, the cards that read it redrawn. */
  record(d) {
    const kept = (this.records[d.kind] ?? []).filter((r) => r.step < d.step);
    const last = kept.at(-1);
    if (last) kept[kept.length - 1] = plain(last);
    kept.push(d);
    this.records[d.kind] = kept;
    for (const s of this.stats) {
      if (s.value && (s.from ?? "eval") === d.kind) this.stat(s.id, s.value(d));
    }
    this.schedule(d.kind);
  }

  /** The records of `kind` (default "eval"), oldest first; the latest one. */
  history(kind = "eval") { return this.records[kind] ?? []; }
  latest(kind = "eval") { return this.history(kind).at(-1) ?? null; }

  /** Forget every record and loss (a Reset): stats back to –, cards redrawn empty. */
  clear() {
    this.losses = [];
    this.records = {};
    for (const s of this.stats) {
      if (!["kernels", "params"].includes(s.id)) this.stat(s.id, s.id === "step" ? "0" : "–");
    }
    this.redraw();
  }

  /** Redraw the cards reading `kind` on the next animation frame. */
  schedule(kind) {
    this.pending.add(kind);
    this.frame ||= requestAnimationFrame(() => {
      this.frame = 0;
      const kinds = this.pending;
      this.pending = new Set();
      this.draw((c) => kinds.has(c.loss ? "loss" : (c.from ?? "eval")));
    });
  }

  /** Redraw every card now (or those `which` picks). */
  redraw() { this.draw(() => true); }

  draw(which) {
    for (const c of this.cards) {
      if (c.html !== undefined || !which(c)) continue;
      const canvas = document.getElementById(c.chart ?? c.canvas);
      if (c.loss) {
        lossPlot(canvas, this.losses, { title: this.lossTitle, logY: this.lossLogY,
                                        xLabel: this.unit });
      }
      else if (c.chart) this.drawChart(canvas, c);
      else c.draw?.(canvas, this.latest(c.from), this);
    }
  }

  /** A chart of a record field per step: one line (with dots) per series. */
  drawChart(canvas, c) {
    const records = this.history(c.from);
    const xs = records.map((r) => r.step);
    const series = c.series.flatMap((s) => {
      const ys = records.map((r) => (typeof s.key === "function" ? s.key(r) : r[s.key]));
      const color = COLORS[s.color] ?? s.color ?? COLORS.blue;
      const line = { xs, ys, color, width: s.width ?? 2, label: s.label };
      return s.dots === false ? [line] : [line, { xs, ys, color, dots: true }];
    });
    linePlot(canvas, { title: c.title, xLabel: c.xLabel ?? this.unit, yLabel: c.yLabel,
      xInteger: true, xMin: 0, yMin: c.yMin, yMax: c.yMax, logY: c.logY, yFormat: c.yFormat,
      empty: c.empty ?? "no evaluation yet", series });
  }
}

/** A record's plain values (numbers, strings, booleans): what an older record keeps. */
function plain(record) {
  return Object.fromEntries(Object.entries(record).filter(([, v]) => v === null ||
    ["number", "string", "boolean"].includes(typeof v)));
}
