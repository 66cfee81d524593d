// What every demo page shares: URL parameters, the WebGPU check, the loading progress, the
// log, the start/stop/reset controls, the streamed losses (stats and the loss plot) and the
// script-mode run of the demo's main.py in the worker.
//
// The page imports demos/common/demo_common.py into the worker as `demo_common`, fetches its
// main.py and runs it with session.runScript(); main.py reads DEMO_CONFIG (set here first),
// streams {kind: "log", text}, {kind: "setup", kernels, params}, {kind: "loss", step, losses}
// (handled here: #s-step, #s-loss, #s-rate, #s-kernels, #s-params and the #loss canvas) and
// demo-specific messages (the page's onPost) with tensorgrad.web.post(), stops when
// CONTROL["stop"] is set, and defines `async def reset()`.
// When the first run finishes the page sets window.tgDemo = {done: true, ok, figures | error}
// (what `python build.py demo NAME` waits for). Every log line also goes to the console, so
// build.py prints the same lines the page shows.

import * as tensorgrad from "../../tensorgrad.js";
import { lossPlot } from "./plot.js";

const $ = (id) => document.getElementById(id);
const secs = (ms) => `${(ms / 1000).toFixed(1)} s`;

/** URL parameters over defaults: {cfg, autostart, headless}.
 *  ?autostart=1 starts training once ready (default under automation, navigator.webdriver);
 *  every key of `defaults` (steps, seed, ...) can be given as a number; under automation
 *  `headless` overrides the defaults first (short runs for `python build.py demo NAME`). */
export function demoConfig(defaults, headless = {}) {
  const query = new URLSearchParams(location.search);
  const automated = navigator.webdriver === true;
  const cfg = { ...defaults, ...(automated ? headless : {}) };
  for (const [key, value] of query) {
    if (key === "autostart") continue;
    if (!(key in cfg)) {  // a typo must not run the demo with its defaults unnoticed
      throw new Error(`URL parameter ${key}=${value}: not a setting of this demo ` +
                      `(settings: autostart, ${Object.keys(cfg).join(", ")})`);
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
   * name: the demo's folder; defaults/headless: config (see demoConfig);
   * onPost(data): demo messages from main.py; onReset(): clear the page's figures;
   * summary(figures): one log line for the end of a run (default: every figure);
   * lossTitle: the loss plot's title; onReady(): after the worker started.
   */
  constructor({ name, defaults, headless, onPost, onReset, summary, onReady,
                lossTitle = "training loss (log scale)", lossLogY = true }) {
    this.name = name;
    Object.assign(this, demoConfig(defaults, headless));
    this.onPost = onPost;
    this.onReset = onReset;
    this.onReady = onReady;
    this.summary = summary ?? defaultSummary;
    this.lossTitle = lossTitle;
    this.lossLogY = lossLogY;
    this.losses = [];
    this.rate = { t0: 0, s0: 0 };
    this.frame = 0;
    this.session = null;
    this.source = null;
    this.running = null;  // the promise of the run in progress
    this.reported = false;
    this.logEl = $("log");
    this.statusEl = $("status");
    this.buttons = { start: $("start"), stop: $("stop"), reset: $("reset") };
    this.buttons.start.onclick = () => this.run();
    this.buttons.stop.onclick = () => this.stop();
    this.buttons.reset.onclick = () => this.reset();
    this.setButtons();
    const params = Object.entries(this.cfg).map(([k, v]) => `${k}=${v}`).join(" ");
    $("config").textContent = params;
  }

  /** One progress line: on the page, and on the console (so build.py prints it). */
  log(text, level = "log") {
    console[level](text);
    this.logEl.textContent += `${text}\n`;
    this.logEl.scrollTop = this.logEl.scrollHeight;
  }

  status(text) { this.statusEl.textContent = text; }

  /** Set the text of element `id` when the page has it. */
  stat(id, text) {
    const el = $(id);
    if (el) el.textContent = text;
  }

  /** Redraw the loss plot (if the page has #loss) on the next animation frame. */
  drawLoss() {
    this.frame ||= requestAnimationFrame(() => {
      this.frame = 0;
      if ($("loss")) lossPlot($("loss"), this.losses, { title: this.lossTitle, logY: this.lossLogY });
    });
  }

  /** Messages from main.py: log lines, setup and losses here; the rest to the page. */
  message(d) {
    if (d?.kind === "log") {
      this.log(d.text);
      return;
    }
    if (d?.kind === "setup") {
      this.stat("s-kernels", d.kernels);
      this.stat("s-params", Number(d.params).toLocaleString("en-US"));
      this.rate = { t0: performance.now(), s0: this.losses.length };
    } else if (d?.kind === "loss") {
      this.losses.length = d.step - 1;  // a reset restarts at step 1
      for (const v of d.losses) this.losses.push(v);
      const step = this.losses.length;
      this.stat("s-step", step);
      this.stat("s-loss", d.losses.at(-1).toPrecision(4));
      const dt = (performance.now() - this.rate.t0) / 1000;
      if (dt > 0.5) this.stat("s-rate", ((step - this.rate.s0) / dt).toPrecision(3));
      this.drawLoss();
    }
    this.onPost?.(d);
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

  /** Check WebGPU, start the worker (Pyodide + tensorgrad), import demo_common and fetch
   *  main.py; then autostart if asked. */
  async boot() {
    this.log(`${this.name}: ${location.href}`);
    this.drawLoss();
    if (tensorgrad.checkWebGPU) {
      this.status("checking WebGPU…");
      const support = await tensorgrad.checkWebGPU();
      if (!support.ok) {
        this.log(`WebGPU is not available: ${support.message}`, "error");
        this.status(`WebGPU is not available in this browser: ${support.message}`);
        document.body.classList.add("no-webgpu");
        this.report({ ok: false, error: `WebGPU unavailable (${support.reason ?? "?"}): ` +
                                        support.message });
        return;
      }
    }
    this.status("loading Pyodide…");
    const text = (url) => fetch(url).then((r) => {
      if (!r.ok) throw new Error(`GET ${url}: HTTP ${r.status}`);
      return r.text();
    });
    const sourceP = text(new URL("main.py", location.href));
    const common = new URL("../common/demo_common.py", location.href).href;
    try {
      this.session = await tensorgrad.start({ onProgress: (p) => this.progress(p) });
      this.session.onPost = (data) => this.message(data);  // posts of exec() calls
      await this.session.exec("from tensorgrad.web import import_source\n" +
                              `await import_source("demo_common", ${JSON.stringify(common)}, ` +
                              '"demo_common.py")');
      this.source = await sourceP;
    } catch (err) {
      this.fail(err);
      return;
    }
    this.onReady?.();
    this.setButtons();
    if (this.autostart) this.run();
  }

  progress(p) {
    if (p.stage === "loading-pyodide") {
      this.log("loading Pyodide…");
    } else if (p.stage === "installing") {
      this.log(`Pyodide loaded in ${secs(p.pyodideMs)}; installing tensorgrad…`);
      this.status("installing tensorgrad…");
    } else if (p.stage === "ready") {
      const t = p.timings;
      this.log(`ready in ${secs(t.totalMs)} (Pyodide ${secs(t.pyodideMs)}, micropip ` +
               `${secs(t.micropipMs)}, wheel ${secs(t.wheelMs)}, import ${secs(t.importMs)})`);
      this.status(`ready in ${secs(t.totalMs)} — press Start`);
      this.timings = t;
    }
  }

  /** Run main.py until its step budget is spent or Stop; resolves with its figures. */
  run() {
    if (this.running || !this.session) return this.running;
    const config = { ...this.cfg, base_url: new URL("./", location.href).href,
                     data_url: new URL("../../data/", location.href).href };
    this.status("training…");
    this.running = (async () => {
      try {
        await this.session.exec(`DEMO_CONFIG = ${pyJson(config)}`);
        const figures = await this.session.runScript(this.source, {
          onPost: (data) => this.message(data),
        });
        this.log(this.summary(figures));
        this.status(figures.stopped ? `stopped at step ${figures.steps}` :
                    `done: ${figures.steps} steps — Start trains ${this.cfg.steps} more`);
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

  /** Stop, then fresh params and optimizer state (same seed) and cleared figures. */
  async reset() {
    await this.stop();
    try {
      await this.session.exec("if 'reset' in globals(): await reset()");
    } catch (err) {
      this.fail(err);
      return;
    }
    this.losses = [];
    for (const id of ["s-loss", "s-rate"]) this.stat(id, "–");
    this.stat("s-step", "0");
    this.drawLoss();
    this.onReset?.();
    this.log("reset: fresh parameters and optimizer state");
    this.status("reset — press Start");
  }
}

/** "done: N steps, loss L (last 10: M), key value, ..." from a run's figures. */
export function defaultSummary(f) {
  const num = (v) => (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : String(v));
  const skip = new Set(["steps", "run_steps", "stopped", "loss", "loss_avg10", "wall_steps_per_s"]);
  const rest = Object.entries(f).filter(([k, v]) => !skip.has(k) && v !== null && typeof v !== "object")
    .map(([k, v]) => `${k.replaceAll("_", " ")} ${num(v)}`);
  return `done: ${f.steps} steps, loss ${num(f.loss)} (last 10: ${num(f.loss_avg10)}), ${rest.join(", ")}`;
}

