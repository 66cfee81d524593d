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
// step() and run() never reject: failures resolve to {kind: "failed", error}.

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
  has(name) { return name in this._data; }
  names() { return Object.keys(this._data).sort(); }
  get(name) {
    if (!this.has(name)) throw new Error(`no capture '${name}' (known: ${this.names().join(", ")})`);
    return this._data[name];
  }
  shape(name) { this.get(name); return this._shapes[name]; }
}

/** One worker: Pyodide with tensorgrad, a namespace, compiled graphs. */
export class Session {
  constructor(worker) {
    this.worker = worker;
    this.pending = new Map();  // id → {resolve, reject, onPost}
    this.nextId = 1;
    this.dead = null;          // an Error once the worker is gone
    this.timings = null;       // from the "ready" progress message
  }

  /** Send `{id, kind, payload}`; resolves with `result`, rejects with the remote error.
   *  `transfer` lists ArrayBuffers to move (not copy) to the worker. */
  request(kind, payload, { transfer = [], onPost } = {}) {
    if (this.dead) return Promise.reject(this.dead);
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
  exec(source) { return this.request("exec", source); }

  /** Fetch Python source from `url` (relative to the page) and run it like exec. */
  load(url) { return this.request("load", new URL(url, self.location.href).href); }

  /** Run source defining `async def main()`; `tensorgrad.web.post(obj)` calls `onPost(obj)`. */
  runScript(source, { onPost } = {}) { return this.request("runScript", source, { onPost }); }

  ping(value = null) { return this.request("ping", value); }

  /** Compile a training step: {model: "MLP()", loss: "loss_fn", inputs, optimizer, seed?}. */
  async compile(spec) {
    const info = await this.request("compile", spec);
    return new Train(this, info, spec);
  }

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
    this.graphId = info.graphId;
    this.paramNames = info.paramNames;
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

  downloadParams() { return this.session.request("downloadParams", { graphId: this.graphId }); }

  destroy() { return this.session.request("destroy", { graphId: this.graphId }); }
}

/** A compiled training step. */
export class Train extends Forward {
  constructor(session, info, spec) {
    super(session, info);
    this.kernelCount = info.kernelCount;
    this.spec = spec;
  }

  /** One training step; `inputs` ({name: Float32Array | Int32Array}) are transferred.
   *  Resolves {kind: "completed", loss, captures} | {kind: "aborted"} | {kind: "failed", error}. */
  step(inputs) {
    return resultOf(this.session.request("step", { graphId: this.graphId, inputs },
                                         { transfer: buffersOf(inputs) }));
  }

  /** A forward graph sharing this graph's parameters: {forward: "fn", inputs, output?}. */
  async attach(spec) {
    const info = await this.session.request("attach", { graphId: this.graphId, ...spec });
    return new Forward(this.session, info);
  }

  /** A number, or a Python expression building a schedule. */
  setLR(lr) { return this.session.request("setLR", { graphId: this.graphId, lr }); }

  /** Recompile for a new model expression ({seed?, optimizer?}); the handle stays valid. */
  async replaceModel(model, options = {}) {
    const info = await this.session.request("replaceModel",
                                            { graphId: this.graphId, model, ...options });
    this.paramNames = info.paramNames;
    this.kernelCount = info.kernelCount;
    return info;
  }
}

/** Start a worker and resolve when Pyodide and tensorgrad are loaded.
 *  onProgress({stage, ms, ...}): stage is loading-pyodide, installing, ready (with timings). */
export function start({ onProgress, workerUrl = DEFAULT_WORKER, wheelUrl, indexURL } = {}) {
  const url = new URL(workerUrl, self.location.href);
  if (wheelUrl) url.searchParams.append("wheel", new URL(wheelUrl, self.location.href).href);
  if (indexURL) url.searchParams.set("indexURL", new URL(indexURL, self.location.href).href);
  const worker = new Worker(url, { type: "module" });
  const session = new Session(worker);
  return new Promise((resolve, reject) => {
    worker.onmessage = (event) => {
      const msg = event.data;
      if (msg?.kind === "progress") {
        onProgress?.(msg);
        if (msg.stage === "ready") {
          session.timings = msg.timings;
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
