// What every demo page shares: URL settings, the WebGPU check, the loading progress, the
// page shell (shell.js: controls, stats, cards, log), the streamed losses and evaluations, and
// the script-mode run of the demo's main.py in the worker. A page describes itself:
//
//   import { Demo, pct } from "../common/demo.js";
//   new Demo({
//     name: "mnist_cnn",
//     defaults: { steps: 2000, seed: 1, every: 100, eval: 2000, until: 0 },  // = main.py's
//     headless: { steps: 40, every: 20 },     // a short run under automation (build.py demo)
//     stats: [{ id: "acc", label: "held-out accuracy", value: (ev) => pct(ev.acc, 2) }],
//     cards: ["loss", { chart: "acc", ... }, { canvas: "digits", draw: (canvas, ev) => ... }],
//   }).boot();
//
// and the shell is built from the description (see shell.js for stats and cards; `python`
// names demos/common modules main.py imports besides demo_common, e.g. ["char_lm"]).
//
// The page imports demos/common/demo_common.py (and `python`) into the worker, fetches its
// main.py and runs it with session.runScript(); main.py reads DEMO_CONFIG (set here first),
// streams {kind: "log", text}, {kind: "setup", kernels, params}, {kind: "loss", step, losses},
// {kind: "eval", step, ...} (all handled here) and demo-specific messages (the page's onPost)
// with tensorgrad.web.post(), stops when CONTROL["stop"] is set, and defines `reset()`.
// When the first run finishes the page sets window.tgDemo = {done: true, ok, figures | error}
// (what `python build.py demo NAME` waits for). Every log line also goes to the console, so
// build.py prints the same lines the page shows.

import * as tensorgrad from "../../tensorgrad.js";
import { Shell } from "./shell.js";

export { pct } from "./shell.js";

const secs = (ms) => `${(ms / 1000).toFixed(1)} s`;
const RESERVED = ["autostart", "headless"];

/** URL parameters over defaults: {cfg, autostart, automated}.
 *  ?autostart=1 starts training once ready (default under automation, navigator.webdriver);
 *  every key of `defaults` (steps, seed, ...) can be given as a number; under automation
 *  `headless` overrides the defaults first (short runs for `python build.py demo NAME`)
 *  unless ?headless=0 (a user's settings, e.g. to test what a user sees). */
export function demoConfig(defaults, headless = {}) {
  const query = new URLSearchParams(location.search);
  const automated = navigator.webdriver === true;
  const quick = query.has("headless") ? query.get("headless") !== "0" : automated;
  const cfg = { ...defaults, ...(quick ? headless : {}) };
  for (const [key, value] of query) {
    if (RESERVED.includes(key)) continue;
    if (!(key in cfg)) {  // a typo must not run the demo with its defaults unnoticed
      throw new Error(`URL parameter ${key}=${value}: not a setting of this demo ` +
                      `(settings: ${[...RESERVED, ...Object.keys(cfg)].join(", ")})`);
    }
    const n = Number(value);
    if (typeof cfg[key] === "number" && !Number.isFinite(n)) {
      throw new Error(`URL parameter ${key}=${value}: a number is needed`);
    }
    cfg[key] = typeof cfg[key] === "number" ? n : value;
  }
  const autostart = query.has("autostart") ? query.get("autostart") !== "0" : automated;
  return { cfg, autostart, automated };
}

/** Python source of a string literal for `value` (via JSON, whose escapes Python reads). */
const pyJson = (value) => `__import__("json").loads(${JSON.stringify(JSON.stringify(value))})`;

export class Demo {
  /**
   * name: the demo's folder; defaults/headless: settings (see demoConfig); python: modules of
   * demos/common main.py imports; unit, controls, stats, cards, lossTitle, lossLogY: the
   * shell's (shell.js); onPost(d): messages other than log/setup/loss/eval; onEval(ev): after
   * an evaluation is recorded; onReset(): after Reset; onReady(): once the worker started;
   * summary(figures): the log line at the end of a run (default: every figure).
   */
  constructor({ name, defaults, headless, python = [], onPost, onEval, onReset, onReady,
                summary, ...shell }) {
    this.name = name;
    Object.assign(this, demoConfig(defaults, headless));
    this.python = ["demo_common", ...python];
    this.onPost = onPost;
    this.onEval = onEval;
    this.onReset = onReset;
    this.onReady = onReady;
    this.summary = summary ?? defaultSummary;
    this.shell = new Shell(shell);
    this.rate = { t0: 0, s0: 0 };
    this.session = null;
    this.source = null;
    this.running = null;  // the promise of the run in progress
    this.reported = false;
    this.statusEl = document.getElementById("status");
    this.buttons = Object.fromEntries(["start", "stop", "reset"].map(
      (b) => [b, document.getElementById(b)]));
    this.buttons.start.onclick = () => this.run();
    this.buttons.stop.onclick = () => this.stop();
    this.buttons.reset.onclick = () => this.reset();
    this.setButtons();
    document.getElementById("config").textContent =
      Object.entries(this.cfg).map(([k, v]) => `${k}=${v}`).join(" ");
  }

  log(text, level = "log") { this.shell.log(text, level); }

  status(text) { this.statusEl.textContent = text; }

  /** Messages from main.py: log lines, setup, losses and evaluations here; the rest to
   *  the page's onPost (a record when it has a step, for the shell's stats and cards). */
  message(d) {
    if (d?.kind === "log") {
      this.log(d.text);
    } else if (d?.kind === "setup") {
      this.shell.stat("kernels", String(d.kernels));
      this.shell.stat("params", Number(d.params).toLocaleString("en-US"));
      this.rate = { t0: performance.now(), s0: this.shell.losses.length };
    } else if (d?.kind === "loss") {
      this.shell.addLosses(d.step, d.losses);
      const dt = (performance.now() - this.rate.t0) / 1000;
      if (dt > 0.5) {
        this.shell.stat("rate", ((this.shell.losses.length - this.rate.s0) / dt).toPrecision(3));
      }
    } else {
      if (typeof d?.step === "number") this.shell.record(d);
      if (d?.kind === "eval") this.onEval?.(d);
      else this.onPost?.(d);
    }
  }

  setButtons() {
    const ready = this.session !== null && this.source !== null;
    this.buttons.start.disabled = !ready || this.running !== null;
    this.buttons.stop.disabled = this.running === null;
    this.buttons.reset.disabled = !ready;
  }

  report(state) {
    if (this.reported) return;
    this.reported = true;
    window.tgDemo = { done: true, ...state };
  }

  fail(err) {
    const text = err?.traceback || err?.stack || String(err);
    this.log(`error: ${err?.name ?? "Error"}: ${err?.message ?? err}`, "error");
    if (text && text !== String(err)) this.log(text, "error");
    this.status(`failed: ${err?.message ?? err}`);
    this.report({ ok: false, error: `${err?.name ?? "Error"}: ${err?.message ?? err}` });
  }

  /** Check WebGPU, start the worker (Pyodide + tensorgrad), import demo_common (and the
   *  page's `python` modules) and fetch main.py; then autostart if asked. */
  async boot() {
    this.log(`${this.name}: ${location.href}`);
    if (tensorgrad.checkWebGPU) {
      this.status("checking WebGPU…");
      const support = await tensorgrad.checkWebGPU();
      if (!support.ok) {
        this.log(`WebGPU is not available: ${support.message}`, "error");
        this.status(`WebGPU is not available in this browser: ${support.message}`);
        document.body.classList.add("no-webgpu");
        this.report({ ok: false, error: `WebGPU unavailable (${support.reason ?? "?"}): ` +
                                        support.message });
        return this;
      }
    }
    this.status("loading Pyodide…");
    const text = (url) => fetch(url).then((r) => {
      if (!r.ok) throw new Error(`GET ${url}: HTTP ${r.status}`);
      return r.text();
    });
    const sourceP = text(new URL("main.py", location.href));
    const imports = this.python.map((m) => `await import_source(${JSON.stringify(m)}, ` +
      `${JSON.stringify(new URL(`../common/${m}.py`, location.href).href)}, "${m}.py")`);
    try {
      this.session = await tensorgrad.start({ onProgress: (p) => this.progress(p) });
      this.session.onPost = (data) => this.message(data);  // posts of exec() calls
      await this.session.exec(["from tensorgrad.web import import_source", ...imports]
                              .join("\n"));
      this.source = await sourceP;
    } catch (err) {
      this.fail(err);
      return this;
    }
    this.onReady?.();
    this.setButtons();
    if (this.autostart) this.run();
    return this;
  }

  progress(p) {
    if (p.stage === "loading-pyodide") {
      this.log("loading Pyodide and tensorgrad…");
    } else if (p.stage === "ready") {
      const t = p.timings;
      this.log(`ready in ${secs(t.totalMs)} (Pyodide ${secs(t.pyodideMs)}, micropip ` +
               `${secs(t.micropipMs)}, wheel ${secs(t.wheelMs)}, import ${secs(t.importMs)})`);
      this.status(`ready in ${secs(t.totalMs)} — press Start`);
      this.timings = t;
    }
  }

  /** The settings main.py reads (DEMO_CONFIG): the page's, and where its files are. */
  scriptConfig() {
    return { ...this.cfg, base_url: new URL("./", location.href).href,
             data_url: new URL("../../data/", location.href).href };
  }

  /** Define main.py's functions in the worker without running main() (its source run with
   *  the page's settings), so the page can call them before the first Start. */
  async define() {
    await this.session.exec(`DEMO_CONFIG = ${pyJson(this.scriptConfig())}`);
    await this.session.exec(this.source);
  }

  /** Run main.py until its step budget is spent or Stop; resolves with its figures. */
  run() {
    if (this.running || !this.session) return this.running;
    const config = this.scriptConfig();
    this.status("training…");
    this.running = (async () => {
      try {
        await this.session.exec(`DEMO_CONFIG = ${pyJson(config)}`);
        const figures = await this.session.runScript(this.source, {
          onPost: (data) => this.message(data),
        });
        this.log(this.summary(figures));
        this.status(figures.stopped ? `stopped at ${this.shell.unit} ${figures.steps}` :
                    `done: ${figures.steps} ${this.shell.unit}s — Start trains ${this.cfg.steps} more`);
        this.report({ ok: true, figures: { ...figures, ready_ms: this.timings?.totalMs } });
        return figures;
      } catch (err) {
        this.fail(err);
        return null;
      } finally {
        this.running = null;
        this.setButtons();
      }
    })();
    this.setButtons();
    return this.running;
  }

  /** Ask main.py to stop after its current step; resolves when the run has ended. */
  async stop() {
    if (!this.running) return;
    this.buttons.stop.disabled = true;
    await this.session.exec("globals().setdefault('CONTROL', {})['stop'] = True");
    await this.running;
  }

  /** Stop, run `fn` (async: it may exec in the worker), then start again if it was running;
   *  an error fails the page. */
  async whileStopped(fn) {
    const wasRunning = this.running !== null;
    await this.stop();
    try { await fn(); } catch (err) { this.fail(err); return; }
    if (wasRunning) this.run();
  }

  /** Stop, then fresh params and optimizer state (same seed) and cleared figures. */
  async reset() {
    await this.stop();
    try {
      await this.session.exec("if 'reset' in globals(): await reset()");
    } catch (err) {
      this.fail(err);
      return;
    }
    this.shell.clear();
    this.onReset?.();
    this.log("reset: fresh parameters and optimizer state");
    this.status("reset — press Start");
  }
}

/** "done: N steps, loss L (last 10: M), key value, ..." from a run's figures. */
export function defaultSummary(f) {
  const num = (v) => (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : String(v));
  const skip = new Set(["steps", "run_steps", "stopped", "loss", "loss_avg10", "wall_steps_per_s"]);
  const rest = Object.entries(f).filter(([k, v]) => !skip.has(k) && v != null && typeof v !== "object")
    .map(([k, v]) => `${k.replaceAll("_", " ")} ${num(v)}`);
  return `done: ${f.steps} steps, loss ${num(f.loss)} (last 10: ${num(f.loss_avg10)}), ${rest.join(", ")}`;
}

