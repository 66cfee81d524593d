// tensorgrad's module Web Worker: loads Pyodide and the tensorgrad wheel, then hands every
// message from the page to Python's message loop (tensorgrad.web.worker.handle) and posts
// replies. The messages are described by one table, tensorgrad/web/protocol.py; the "ready"
// progress message carries it to the page client, which checks its requests against it.
//
//   page → worker  {id, kind, payload}
//   worker → page  {id, ok: true, result} | {id, ok: false, error: {name, message, traceback}}
//                  {kind: "progress", stage, ms, ...}   stage: loading-pyodide | installing |
//                                                       ready (with protocol) | error
//                  {kind: "post", id, data}             from tensorgrad.web.post() in Python
//
// Where things come from: the query string of this worker's URL (?indexURL=...&wheel=...),
// else manifest.json beside this file (written by `python build.py web`).

const T0 = performance.now();
const elapsed = () => Math.round(performance.now() - T0);
const here = new URL(".", self.location.href);

let handle = null;      // Python: tensorgrad.worker.handle (async), once ready
let startError = null;  // set when start-up failed: every request is answered with it
const queued = [];      // requests that arrived before Python was ready

function progress(stage, extra = {}) {
  self.postMessage({ kind: "progress", stage, ms: elapsed(), ...extra });
}

// Every ArrayBuffer under `value` (typed arrays, plain objects, arrays), once each.
// Buffers of WebAssembly memory are never transferred (that would detach Python's heap).
function transferables(value, found = new Set(), seen = new Set()) {
  if (value === null || typeof value !== "object" || seen.has(value)) return found;
  seen.add(value);
  if (ArrayBuffer.isView(value)) value = value.buffer;
  if (value instanceof ArrayBuffer) {
    if (value !== heapBuffer() && value.byteLength > 0) found.add(value);
    return found;
  }
  if (Array.isArray(value)) {
    for (const v of value) transferables(v, found, seen);
  } else if (Object.getPrototypeOf(value) === Object.prototype) {
    for (const v of Object.values(value)) transferables(v, found, seen);
  }
  return found;
}

let pyodide = null;
const heapBuffer = () => pyodide?._module?.HEAPU8?.buffer;

// Post a message, transferring its ArrayBuffers. Python's tensorgrad.web.post() calls this.
function postWithTransfer(message) {
  self.postMessage(message, [...transferables(message)]);
}
globalThis.tensorgradPost = postWithTransfer;

function errorOf(err) {
  return {
    name: err?.name ?? "Error",
    message: String(err?.message ?? err),
    traceback: String(err?.stack ?? ""),
  };
}

async function dispatch(msg) {
  let reply;
  try {
    const proxy = handle(msg);  // a Python coroutine (awaitable from JS)
    try {
      reply = await proxy;
    } finally {
      proxy.destroy?.();
    }
    // The reply is a JS object built in Python (tensorgrad.worker.handle): {id, ok, ...}.
    postWithTransfer(reply);
  } catch (err) {
    // Python's handle() answers its own exceptions; this is a JS-level failure
    // (a non-cloneable result, Pyodide itself, ...).
    self.postMessage({ id: msg?.id, ok: false, error: errorOf(err) });
  }
}

self.onmessage = (event) => {
  const msg = event.data;
  if (handle) dispatch(msg);
  else if (startError) self.postMessage({ id: msg?.id, ok: false, error: startError });
  else queued.push(msg);
};

async function start() {
  const params = new URL(self.location.href).searchParams;
  let manifest = {};
  const res = await fetch(new URL("manifest.json", here)).catch(() => null);
  if (res?.ok) manifest = await res.json();
  const indexURL = new URL(params.get("indexURL") ?? manifest.indexURL ?? "pyodide/", here).href;
  const wheels = params.getAll("wheel");
  if (!wheels.length && manifest.wheel) wheels.push(manifest.wheel);
  if (!wheels.length) throw new Error("no tensorgrad wheel: pass ?wheel=URL or serve manifest.json");
  const wheelURLs = wheels.map((w) => new URL(w, here).href);

  progress("loading-pyodide", { indexURL });
  const { loadPyodide } = await import(new URL("pyodide.mjs", indexURL).href);
  pyodide = await loadPyodide({ indexURL });
  const pyodideMs = elapsed();

  progress("installing", { wheels: wheelURLs, pyodideMs });
  const quiet = () => {};
  await pyodide.loadPackage("micropip", { messageCallback: quiet });
  const micropipMs = elapsed() - pyodideMs;
  const micropip = pyodide.pyimport("micropip");
  await micropip.install(wheelURLs);
  micropip.destroy();
  const wheelMs = elapsed() - pyodideMs - micropipMs;

  handle = pyodide.pyimport("tensorgrad.web.worker").handle;
  const protocol = JSON.parse(pyodide.pyimport("tensorgrad.web.protocol").as_json());
  const importMs = elapsed() - pyodideMs - micropipMs - wheelMs;
  progress("ready", {
    timings: { pyodideMs, micropipMs, wheelMs, importMs, totalMs: elapsed() },
    python: pyodide.version,
    protocol,
  });
  for (const msg of queued.splice(0)) dispatch(msg);
}

start().catch((err) => {
  startError = errorOf(err);
  progress("error", { error: startError });
  for (const msg of queued.splice(0)) {
    self.postMessage({ id: msg?.id, ok: false, error: startError });
  }
});
