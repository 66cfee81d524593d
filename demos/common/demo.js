// What every demo page shares: URL parameters, the loading progress, the log, the
// start/stop/reset controls and the script-mode run of the demo's main.py in the worker.
//
// The page fetches its main.py and runs it with session.runScript(); main.py reads
// DEMO_CONFIG (set here first), streams {kind: "log", text} and demo-specific messages with
// tensorgrad.web.post(), stops when CONTROL["stop"] is set, and defines `async def reset()`.
// When the first run finishes the page sets window.tgDemo = {done: true, ok, figures | error}
// (what `python build.py demo NAME` waits for). Every log line also goes to the console, so
// build.py prints the same lines the page shows.

import { start } from "../../tensorgrad.js";

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
    if (!(key in cfg)) continue;
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
   * summary(figures): one log line for the end of a run.
   */
  constructor({ name, defaults, headless, onPost, onReset, summary }) {
    this.name = name;
    Object.assign(this, demoConfig(defaults, headless));
    this.onPost = onPost;
    this.onReset = onReset;
    this.summary = summary ?? ((f) => JSON.stringify(f));
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

  /** Start the worker (Pyodide + tensorgrad) and fetch main.py; then autostart if asked. */
  async boot() {
    this.log(`${this.name}: ${location.href}`);
    this.status("loading Pyodide…");
    const sourceP = fetch(new URL("main.py", location.href)).then((r) => {
      if (!r.ok) throw new Error(`GET main.py: HTTP ${r.status}`);
      return r.text();
    });
    try {
      this.session = await start({ onProgress: (p) => this.progress(p) });
      this.source = await sourceP;
    } catch (err) {
      this.fail(err);
      return;
    }
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
    const config = { ...this.cfg, model_url: new URL("model.py", location.href).href };
    this.status("training…");
    this.running = (async () => {
      try {
        await this.session.exec(`DEMO_CONFIG = ${pyJson(config)}`);
        const figures = await this.session.runScript(this.source, {
          onPost: (data) => (data?.kind === "log" ? this.log(data.text) : this.onPost?.(data)),
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
    this.onReset?.();
    this.log("reset: fresh parameters and optimizer state");
    this.status("reset — press Start");
  }
}
