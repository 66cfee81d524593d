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
// "ready" message) before it is posted: an unknown kind or field, or a field of the wrong type,
// rejects with an Error named "ProtocolError" (`reset: field 'params' must be a bool, got
// string 'false'`) and nothing is sent (nor transferred). The field types, as the methods
// below name them: bool (true or false, never "false" or 0), integer (a safe integer: never
// NaN, Infinity, 1.5 or "1"), number (finite), string, Python source or expression (strings),
// typed array (Float32Array, Int32Array, ...), record {name: ...} (a plain object).

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

// The protocol's field types (tensorgrad/web/protocol.py, TYPES): the primitive ones are
// checked here by name; records and unions come with the table ({record: type} | {anyOf}).
const TYPED_ARRAYS = ["Float32Array", "Float64Array", "Int8Array", "Int16Array", "Int32Array",
                      "Uint8Array", "Uint16Array", "Uint32Array", "Uint8ClampedArray"];
const isRecord = (v) => v !== null && typeof v === "object" && !Array.isArray(v) &&
  [Object.prototype, null].includes(Object.getPrototypeOf(v));
const isInteger = (v) => Number.isSafeInteger(v);
// A free dim is null (undefined too: Python's None arrives so through the Python page client).
const isShape = (v) => isInteger(v) || (Array.isArray(v) && v.every((d) => isInteger(d) || d == null));
const isTypedArray = (v) => ArrayBuffer.isView(v) && TYPED_ARRAYS.includes(v.constructor?.name);

/** The protocol's primitive field types, each a predicate on a JS value: the same names and
 *  rules as `TYPES` in tensorgrad/web/protocol.py, which the worker checks (records and
 *  either-of types are built from these by the table the worker sends in "ready"). */
export const FIELD_CHECKS = {
  any: () => true,
  bool: (v) => typeof v === "boolean",
  id: isInteger,
  integer: isInteger,
  number: (v) => typeof v === "number" && Number.isFinite(v),
  string: (v) => typeof v === "string",
  source: (v) => typeof v === "string",
  expression: (v) => typeof v === "string",
  typedArray: isTypedArray,
  float32Array: (v) => v instanceof Float32Array,
  inputDecl: (v) => {
    if (isRecord(v)) {
      return "shape" in v && Object.keys(v).every((k) => k === "shape" || k === "dtype") &&
        isShape(v.shape) && (v.dtype == null || typeof v.dtype === "string");
    }
    if (Array.isArray(v) && v.length === 2 && typeof v[1] === "string") return isShape(v[0]);
    return isShape(v);
  },
  plainData: (v) => isRecord(v) && typeof v.kind === "string",
};

// A value's type and a short repr, for messages: string 'false', number NaN, Float64Array(3).
function describe(value) {
  if (value === null || value === undefined) return String(value);
  if (ArrayBuffer.isView(value)) return `${value.constructor.name}(${value.length ?? value.byteLength})`;
  const short = (text) => (text.length > 40 ? text.slice(0, 37) + "..." : text);
  switch (typeof value) {
    case "string": return `string '${short(value)}'`;
    case "number": case "boolean": case "bigint": return `${typeof value} ${value}`;
    case "function": return "function";
    case "symbol": return "symbol";
  }
  const name = Array.isArray(value) ? "array" : isRecord(value) ? "object"
    : (value.constructor?.name ?? "object");
  let text;
  try { text = JSON.stringify(value); } catch { text = undefined; }
  return text === undefined ? name : `${name} ${short(text)}`;
}

// null when `value` has the field type `name`, else what came ("got string 'false'", or
// "got ... for 'key'" naming a record's wrong entry).
function typeProblem(types, name, value) {
  const type = types[name];
  if (type?.record) {
    if (!isRecord(value)) return `got ${describe(value)}`;
    for (const [key, item] of Object.entries(value)) {
      if (typeProblem(types, type.record, item)) return `got ${describe(item)} for '${key}'`;
    }
    return null;
  }
  if (type?.anyOf) {
    return type.anyOf.some((n) => !typeProblem(types, n, value)) ? null : `got ${describe(value)}`;
  }
  const test = FIELD_CHECKS[name];
  if (!test) throw new Error(`tensorgrad.js has no check for the protocol's field type '${name}' ` +
                             "(the client and the worker come from different versions)");
  return test(value) ? null : `got ${describe(value)}`;
}

const failed = (err) => ({
  kind: "failed",
  error: err instanceof Error ? err : remoteError(err),
});

/** One worker: Pyodide with tensorgrad, a namespace, compiled graphs. */
export class Session {
  constructor(worker) {
    this.worker = worker;      // the module Web Worker running Pyodide and tensorgrad
    this.pending = new Map();  // id → {resolve, reject, onPost}
    this.nextId = 1;
    this.dead = null;          // an Error once the worker is gone
    this.timings = null;       // from the "ready" progress message: {pyodideMs, wheelMs, ...}
    this.install = null;       // from "ready" too: {path: "unpack" | "micropip", snapshot, wheels}
    this.protocol = null;      // {messages, events, types}, from the "ready" message
    this.watched = null;       // the lock request that notices the worker's death
  }

  /** A ProtocolError for a request the worker's table does not allow, else null: an unknown
   *  kind, a missing or unknown field, a field of the wrong type (null and undefined: absent). */
  check(kind, payload) {
    if (!this.protocol) return null;
    const messages = this.protocol.messages;
    const entry = messages[kind];
    const fail = (message) => Object.assign(new Error(message), { name: "ProtocolError" });
    if (!entry) return fail(`unknown message kind ${JSON.stringify(kind)} (known: ` +
                            `${Object.keys(messages).join(", ")})`);
    const fields = [...entry.required, ...entry.optional];
    const expected = [...entry.required, ...entry.optional.map((f) => f + "?")].join(", ");
    if (payload === null || typeof payload !== "object" || Array.isArray(payload)) {
      return fail(`${kind}: the payload must be an object {${expected}}`);
    }
    const absent = (v) => v === undefined || v === null;
    const given = Object.keys(payload).filter((k) => payload[k] !== undefined);
    const missing = entry.required.filter((f) => absent(payload[f]));
    const unknown = given.filter((k) => !fields.includes(k));
    if (missing.length || unknown.length) {
      const parts = [];
      if (missing.length) parts.push(`missing [${missing.join(", ")}]`);
      if (unknown.length) parts.push(`unknown [${unknown.join(", ")}]`);
      return fail(`${kind}: payload field(s) ${parts.join(" and ")}; expected {${expected}}`);
    }
    for (const [field, type] of Object.entries(entry.types)) {
      if (absent(payload[field])) continue;
      const problem = typeProblem(this.protocol.types, type, payload[field]);
      if (problem) {
        return fail(`${kind}: field '${field}' must be ${this.protocol.types[type].doc}, ${problem}`);
      }
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

  /** Run Python source (a string) in the worker's namespace; the repr of its last expression
   *  or null. */
  exec(source) { return this.request("exec", { source }); }

  /** Fetch Python source from `url` (a string, relative to the page) and run it like exec. */
  load(url) {
    const href = new URL(url, self.location.href).href;
    return this.request("load", { url: href });
  }

  /** Run source (a string) defining `async def main()`; `tensorgrad.web.post(obj)` calls
   *  `onPost(obj)`. */
  runScript(source, { onPost } = {}) { return this.request("runScript", { source }, { onPost }); }

  /** A round trip: resolves {pong: value, python, platform, kinds} (the worker's Python
   *  version, its platform and the message kinds it takes). */
  ping(value = null) { return this.request("ping", { value }); }

  /** Compile a training step: {model: "MLP()", loss: "loss_fn", inputs, optimizer?, seed?}.
   *  model and loss are Python expressions (strings); inputs a record {name: shape | [shape,
   *  dtype]} (shape a list of integers, dtype "f32" | "i32"); optimizer an expression
   *  ("tg.optim.Adam(lr=1e-3)") or plain data ({kind: "adam", lr: 1e-3}, lr a number or a
   *  schedule such as {kind: "linear", peak, final, steps}); seed an integer. */
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

// A step or run result, plain fields as the worker sends them (console.log and JSON show
// them as they are): {kind: "completed", loss | output + outputShape, captures: {name:
// Float32Array | Int32Array}, captureShapes: {name: dims}}, {kind: "aborted"}, or
// {kind: "failed", error} with `error` an Error carrying the Python name and traceback.
async function resultOf(promise) {
  try {
    const r = await promise;
    return r.kind === "failed" ? failed(r.error) : r;
  } catch (err) {
    return failed(err);
  }
}

/** A forward graph: attached to a training graph, sharing its parameters. */
export class Forward {
  constructor(session, info, order = { tail: Promise.resolve() }) {
    this.session = session;
    this.graphId = info.graphId;            // the worker's id of this graph
    this._order = order;                    // shared by a training graph and its forwards
    this._update(info);
  }

  // Several step() and run() calls may be in flight: the worker queues each as soon as it
  // arrives and runs them in call order. Their results settle in that order too, also where
  // the worker answers a later call at once (a step sent after destroy() is aborted without
  // waiting, a call refused by the protocol check fails here): each waits for the one before.
  _inOrder(result) {
    const settled = this._order.tail.then(() => result);
    this._order.tail = settled;
    return settled;
  }

  _update(info) {
    this.paramNames = info.paramNames;      // in param order
    this.paramShapes = info.paramShapes;    // {name: shape}
    this.paramCount = info.paramCount;      // how many values in all
  }

  /** Run the forward on `inputs`, a record {name: typed array} (transferred). Resolves
   *  {kind: "completed", output, outputShape, captures, captureShapes} | aborted | failed
   *  (see resultOf). Runs and steps of one training graph may be called without awaiting
   *  the last: they run, and resolve, in call order. */
  run(inputs) {
    return this._inOrder(resultOf(this.session.request("run", { graphId: this.graphId, inputs },
                                                       { transfer: buffersOf(inputs) })));
  }

  /** Write params, a record {name: Float32Array} (transferred); every param unless
   *  {partial: true} (a bool). */
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

  /** One training step; `inputs`, a record {name: Float32Array | Int32Array}, are transferred.
   *  Resolves {kind: "completed", loss, captures: {name: typed array}, captureShapes} |
   *  {kind: "aborted"} | {kind: "failed", error}. Steps may be called without awaiting the
   *  last: the worker queues each as soon as it arrives, they run one after another in call
   *  order with the results of awaited steps, and their promises resolve in that order (a
   *  few in flight keep the worker busy while the page reads the last loss). A replaceModel()
   *  or destroy() makes the steps called before it that have not finished resolve
   *  {kind: "aborted"}. */
  step(inputs) {
    return this._inOrder(resultOf(this.session.request("step", { graphId: this.graphId, inputs },
                                                       { transfer: buffersOf(inputs) })));
  }

  /** A forward graph sharing this graph's parameters: {forward, inputs, output?}: forward a
   *  Python expression ("fn"), inputs a record {name: shape | [shape, dtype]} with one null
   *  dim at most per input, output a capture's name (a string). */
  async attach({ forward, inputs, output } = {}) {
    const info = await this.session.request("attach",
                                            { graphId: this.graphId, forward, inputs, output });
    return new Forward(this.session, info, this._order);
  }

  /** Re-initialise params (same seed) and/or optimizer state ({params, optimizer}: bools,
   *  both true by default). */
  reset({ params = true, optimizer = true } = {}) {
    return this.session.request("reset", { graphId: this.graphId, params, optimizer });
  }

  /** A new learning rate: a finite number, a schedule as plain data ({kind:
   *  "cosine_annealing", ...}), or a Python expression (a string) building one. */
  setLR(lr) { return this.session.request("setLR", { graphId: this.graphId, lr }); }

  /** Recompile for a new model expression (a string; {seed?: integer, optimizer?: an
   *  expression or plain data}); the handle stays valid. Steps and runs called before it
   *  that have not finished resolve {kind: "aborted"}; those called after it run on the new
   *  model. */
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
