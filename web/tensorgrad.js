// tensorgrad's page client: starts the worker (Pyodide + tensorgrad) and talks to it.
//
//   import { start } from "./tensorgrad.js";
//   const session = await start({ onProgress: (p) => console.log(p.stage, p.ms) });
//   await session.exec("import tensorgrad as tg\nfrom model import MLP, loss_fn");
//   const train = await session.compile({ model: "MLP()", loss: "loss_fn",
//     inputs: { x: [32, 784], y: [[32], "i32"] }, optimizer: "tg.optim.Adam(lr=1e-3)" });
//   const r = await train.step({ x: xs, y: ys });   // xs, ys are transferred (detached here)
//   if (r.kind === "completed") console.log(r.loss);
//
// Requests reject with an Error carrying the Python `name`, `message` and `traceback`;
// step() and run() never reject: failures resolve to {kind: "failed", error}. Every request
// is checked against the worker's protocol table (tensorgrad/web/protocol.py, sent with the
// "ready" message) before it is posted: an unknown kind or field rejects with a ProtocolError.

const DEFAULT_WORKER = new URL("./worker.mjs", import.meta.url);

// The ArrayBuffers behind the typed arrays in `record`, once each.
function buffersOf(record) {
  const found = new Set();
  for (const value of Object.values(record ?? {})) {
    if (ArrayBuffer.isView(value)) found.add(value.buffer);
    else if (value instanceof ArrayBuffer) found.add(value);
  }
  return [...found];
}

function remoteError(error) {
  const err = new Error(error?.message ?? String(error));
  err.name = error?.name ?? "Error";
  err.traceback = error?.traceback ?? "";
  return err;
}

const failed = (err) => ({
  kind: "failed",
  error: err instanceof Error ? err : remoteError(err),
});

/** Captured tensors of one step or run, by name. */
export class Captures {
  constructor(data = {}, shapes = {}) {
    this._data = data;
    this._shapes = shapes;
  }
  /** Whether a tensor was captured under `name`. */
  has(name) { return name in this._data; }
  /** The capture names, sorted. */
  names() { return Object.keys(this._data).sort(); }
  /** The captured tensor `name`, flat (a Float32Array or Int32Array); throws for an unknown
   *  name, listing the known ones. */
  get(name) {
    if (!this.has(name)) throw new Error(`no capture '${name}' (known: ${this.names().join(", ")})`);
    return this._data[name];
  }
  /** The shape of the captured tensor `name` (an array of ints). */
  shape(name) { this.get(name); return this._shapes[name]; }
}

/** One worker: Pyodide with tensorgrad, a namespace, compiled graphs. */
export class Session {
  constructor(worker) {
    this.worker = worker;      // the module Web Worker running Pyodide and tensorgrad
    this.pending = new Map();  // id → {resolve, reject, onPost}
    this.nextId = 1;
    this.dead = null;          // an Error once the worker is gone
    this.timings = null;       // from the "ready" progress message: {pyodideMs, wheelMs, ...}
    this.install = null;       // from "ready" too: {path: "unpack" | "micropip", snapshot, wheels}
    this.protocol = null;      // {kind: {required, optional}}, from the "ready" message
    this.watched = null;       // the lock request that notices the worker's death
  }

  /** A ProtocolError for a request the worker's table does not allow, else null. */
  check(kind, payload) {
    if (!this.protocol) return null;
    const entry = this.protocol[kind];
    const fail = (message) => Object.assign(new Error(message), { name: "ProtocolError" });
    if (!entry) return fail(`unknown message kind ${JSON.stringify(kind)} (known: ` +
                            `${Object.keys(this.protocol).join(", ")})`);
    const fields = [...entry.required, ...entry.optional];
    const expected = [...entry.required, ...entry.optional.map((f) => f + "?")].join(", ");
    if (payload === null || typeof payload !== "object" || Array.isArray(payload)) {
      return fail(`${kind}: the payload must be an object {${expected}}`);
    }
    const given = Object.keys(payload).filter((k) => payload[k] !== undefined);
    const missing = entry.required.filter((f) => payload[f] === undefined || payload[f] === null);
    const unknown = given.filter((k) => !fields.includes(k));
    if (missing.length || unknown.length) {
      const parts = [];
      if (missing.length) parts.push(`missing [${missing.join(", ")}]`);
      if (unknown.length) parts.push(`unknown [${unknown.join(", ")}]`);
      return fail(`${kind}: payload field(s) ${parts.join(" and ")}; expected {${expected}}`);
    }
    return null;
  }

  /** Send `{id, kind, payload}`; resolves with `result`, rejects with the remote error.
   *  `transfer` lists ArrayBuffers to move (not copy) to the worker. */
  request(kind, payload = {}, { transfer = [], onPost } = {}) {
    if (this.dead) return Promise.reject(this.dead);
    const invalid = this.check(kind, payload);
    if (invalid) return Promise.reject(invalid);
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, onPost });
      try {
        this.worker.postMessage({ id, kind, payload }, transfer);
      } catch (err) {
        this.pending.delete(id);
        reject(err);
      }
    });
  }

  _receive(msg) {
    if (msg.kind === "post") {
      const p = this.pending.get(msg.id);
      if (p?.onPost) p.onPost(msg.data);
      else this.onPost?.(msg.data, msg.id);
      return;
    }
    if (msg.kind === "progress") return;  // handled by start()
    const p = this.pending.get(msg.id);
    if (!p) return;
    this.pending.delete(msg.id);
    if (msg.ok) p.resolve(msg.result);
    else p.reject(remoteError(msg.error));
  }

  _fail(err) {
    this.dead ??= err;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
  }

  /** Run Python source in the worker's namespace; the repr of its last expression or null. */
  exec(source) { return this.request("exec", { source }); }

  /** Fetch Python source from `url` (relative to the page) and run it like exec. */
  load(url) {
    const href = new URL(url, self.location.href).href;
    return this.request("load", { url: href });
  }

  /** Run source defining `async def main()`; `tensorgrad.web.post(obj)` calls `onPost(obj)`. */
  runScript(source, { onPost } = {}) { return this.request("runScript", { source }, { onPost }); }

  /** A round trip: resolves {pong: value, python, platform, kinds} (the worker's Python
   *  version, its platform and the message kinds it takes). */
  ping(value = null) { return this.request("ping", { value }); }

  /** Compile a training step: {model: "MLP()", loss: "loss_fn", inputs, optimizer?, seed?};
   *  optimizer is an expression ("tg.optim.Adam(lr=1e-3)") or plain data ({kind: "adam",
   *  lr: 1e-3}, lr a number or a schedule such as {kind: "linear", peak, final, steps}). */
  async compile(spec) {
    const info = await this.request("compile", spec);
    return new Train(this, info, spec);
  }

  /** End the worker now: pending and later requests reject ("worker terminated"). */
  terminate() {
    this.worker.terminate();
    this._fail(new Error("worker terminated"));
  }
}

async function resultOf(promise) {
  try {
    const r = await promise;
    if (r.kind !== "completed") return r.kind === "failed" ? failed(r.error) : r;
    return { ...r, captures: new Captures(r.captures, r.captureShapes) };
  } catch (err) {
    return failed(err);
  }
}

/** A forward graph: attached to a training graph, sharing its parameters. */
export class Forward {
  constructor(session, info) {
    this.session = session;
    this.graphId = info.graphId;            // the worker's id of this graph
    this._update(info);
  }

  _update(info) {
    this.paramNames = info.paramNames;      // in param order
    this.paramShapes = info.paramShapes;    // {name: shape}
    this.paramCount = info.paramCount;      // how many values in all
  }

  /** Resolves {kind: "completed", output, outputShape, captures} | aborted | failed. */
  run(inputs) {
    return resultOf(this.session.request("run", { graphId: this.graphId, inputs },
                                         { transfer: buffersOf(inputs) }));
  }

  /** Write {name: Float32Array}; every param unless {partial: true}. */
  uploadParams(params, { partial = false } = {}) {
    return this.session.request("uploadParams", { graphId: this.graphId, params, partial },
                                { transfer: buffersOf(params) });
  }

  /** Resolves {name: Float32Array} of every param, flat (shapes in `paramShapes`), after the
   *  calls made before it. */
  downloadParams() { return this.session.request("downloadParams", { graphId: this.graphId }); }

  /** Free the graph in the worker (a training graph frees its attached forwards too);
   *  pending and later step/run calls resolve {kind: "aborted"}. */
  destroy() { return this.session.request("destroy", { graphId: this.graphId }); }
}

/** A compiled training step. */
export class Train extends Forward {
  constructor(session, info, spec) {
    super(session, info);
    this.spec = spec;                       // the compile request it came from
  }

  _update(info) {
    super._update(info);
    this.kernelCount = info.kernelCount;    // GPU kernels of one step
  }

  /** One training step; `inputs` ({name: Float32Array | Int32Array}) are transferred.
   *  Resolves {kind: "completed", loss, captures} | {kind: "aborted"} | {kind: "failed", error}. */
  step(inputs) {
    return resultOf(this.session.request("step", { graphId: this.graphId, inputs },
                                         { transfer: buffersOf(inputs) }));
  }

  /** A forward graph sharing this graph's parameters: {forward: "fn", inputs, output?}. */
  async attach({ forward, inputs, output } = {}) {
    const info = await this.session.request("attach",
                                            { graphId: this.graphId, forward, inputs, output });
    return new Forward(this.session, info);
  }

  /** Re-initialise params (same seed) and/or optimizer state ({params, optimizer}: both
   *  true by default). */
  reset({ params = true, optimizer = true } = {}) {
    return this.session.request("reset", { graphId: this.graphId, params, optimizer });
  }

  /** A number, a schedule as plain data ({kind: "cosine_annealing", ...}), or a Python
   *  expression building one. */
  setLR(lr) { return this.session.request("setLR", { graphId: this.graphId, lr }); }

  /** Recompile for a new model expression ({seed?, optimizer?}); the handle stays valid. */
  async replaceModel(model, { seed, optimizer } = {}) {
    const info = await this.session.request("replaceModel",
                                            { graphId: this.graphId, model, seed, optimizer });
    this._update(info);
    return info;
  }
}

/** Start a worker and resolve when Pyodide and tensorgrad are loaded.
 *  onProgress({stage, ms, ...}): stage is loading-pyodide, installing, ready (with timings).
 *  The worker restores the bundle's Pyodide snapshot where it can (snapshot: false starts
 *  Python instead) and unpacks a pure-Python wheel straight into site-packages (install:
 *  "micropip" installs every wheel with micropip instead); session.install says what it did. */
export function start({ onProgress, workerUrl = DEFAULT_WORKER, wheelUrl, indexURL,
                        install, snapshot = true } = {}) {
  const url = new URL(workerUrl, self.location.href);
  const lock = `tensorgrad-worker-${crypto.randomUUID?.() ?? Math.random()}`;
  if (url.protocol !== "blob:" && url.protocol !== "data:") url.searchParams.set("lock", lock);
  if (wheelUrl) url.searchParams.append("wheel", new URL(wheelUrl, self.location.href).href);
  if (indexURL) url.searchParams.set("indexURL", new URL(indexURL, self.location.href).href);
  if (install) url.searchParams.set("install", install);
  if (!snapshot) url.searchParams.set("snapshot", "off");
  const worker = new Worker(url, { type: "module" });
  const session = new Session(worker);
  return new Promise((resolve, reject) => {
    worker.onmessage = (event) => {
      const msg = event.data;
      if (msg?.kind === "progress") {
        if (msg.lifeLock && !session.watched) {
          // Granted once the worker holds it no more: it was closed or it crashed.
          session.watched = navigator.locks.request(lock, () => {
            const err = Object.assign(new Error("tensorgrad's worker stopped (it was closed or " +
              "crashed); pending calls failed: call start() again for a new one"),
            { name: "WorkerDied" });
            session._fail(err);
            reject(err);  // when it dies while starting
          });
        }
        onProgress?.(msg);
        if (msg.stage === "ready") {
          session.timings = msg.timings;
          session.install = msg.install ?? null;
          session.protocol = msg.protocol ?? null;
          resolve(session);
        } else if (msg.stage === "error") {
          const err = remoteError(msg.error);
          session._fail(err);
          worker.terminate();
          reject(err);
        }
        return;
      }
      session._receive(msg);
    };
    const onError = (event) => {
      event.preventDefault?.();
      const err = new Error(`tensorgrad worker failed: ${event.message ?? "error"}` +
        (event.filename ? ` (${event.filename}:${event.lineno})` : ""));
      session._fail(err);
      worker.terminate();
      reject(err);
    };
    worker.onerror = onError;
    worker.onmessageerror = () => session._fail(new Error("a message from the worker could not be read"));
  });
}

/** Latest-wins wrapper for a one-argument async function: at most one call in flight and one
 *  queued. A newer call displaces the queued one, which resolves {kind: "aborted"}; the others
 *  resolve {kind: "completed", value}. A rejection of `fn` rejects that caller's promise. */
export function singleFlight(fn) {
  let busy = false;
  let queued = null;
  const run = (arg, resolve, reject) => {
    busy = true;
    Promise.resolve()
      .then(() => fn(arg))
      .then((value) => resolve({ kind: "completed", value }), reject)
      .finally(() => {
        busy = false;
        const next = queued;
        queued = null;
        if (next) run(next.arg, next.resolve, next.reject);
      });
  };
  return (arg) => new Promise((resolve, reject) => {
    if (!busy) return run(arg, resolve, reject);
    queued?.resolve({ kind: "aborted" });
    queued = { arg, resolve, reject };
  });
}

// The adapter probe, run in a throwaway module worker: a first requestAdapter() on the page's
// main thread can stall rendering for a long time.
const PROBE = `
const gpu = globalThis.navigator?.gpu;
let result = { ok: false, reason: "no-webgpu" };
if (gpu) {
  result = { ok: false, reason: "no-adapter" };
  for (const delay of [0, 100, 400]) {
    if (delay) await new Promise((r) => setTimeout(r, delay));
    const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" }).catch(() => null);
    if (adapter) {
      const info = adapter.info ?? {};
      result = { ok: true, name: [info.vendor, info.architecture].filter(Boolean).join(" ") };
      break;
    }
  }
}
postMessage(result);
`;

const MESSAGES = {
  "no-webgpu": "WebGPU is not available in this browser (navigator.gpu is missing). Use a " +
    "recent Chrome, Edge or Safari, served from https:// or http://127.0.0.1.",
  "no-adapter": "WebGPU is present but no GPU adapter is available (the GPU is blocked or " +
    "unsupported; on Linux, Chrome needs --enable-unsafe-webgpu).",
};

let webgpuReady = null;  // the cached success

function probeHere() {
  return new Promise((resolve) => {
    const blob = new Blob([PROBE], { type: "text/javascript" });
    let worker;
    try {
      worker = new Worker(URL.createObjectURL(blob), { type: "module" });
    } catch {
      resolve(null);  // workers unusable: probe on this thread
      return;
    }
    const timer = setTimeout(() => { worker.terminate(); resolve(null); }, 10_000);
    worker.onmessage = (event) => { clearTimeout(timer); worker.terminate(); resolve(event.data); };
    worker.onerror = () => { clearTimeout(timer); worker.terminate(); resolve(null); };
  });
}

async function probeThread() {
  const gpu = globalThis.navigator?.gpu;
  if (!gpu) return { ok: false, reason: "no-webgpu" };
  const adapter = await gpu.requestAdapter().catch(() => null);
  return adapter ? { ok: true, name: adapter.info?.vendor ?? "" } : { ok: false, reason: "no-adapter" };
}

/** Whether this browser can run tensorgrad: {ok, message, reason?} with reason "no-webgpu" or
 *  "no-adapter". The adapter is probed in a throwaway worker, so the page never stalls; a
 *  success is cached, a failure is not (a later call can see a recovery). */
export async function checkWebGPU() {
  if (webgpuReady) return webgpuReady;
  if (!globalThis.navigator?.gpu) return { ok: false, reason: "no-webgpu", message: MESSAGES["no-webgpu"] };
  const got = (await probeHere()) ?? (await probeThread());
  if (!got.ok) return { ok: false, reason: got.reason, message: MESSAGES[got.reason] };
  webgpuReady = { ok: true, message: `WebGPU ready${got.name ? ": " + got.name : ""}` };
  return webgpuReady;
}
