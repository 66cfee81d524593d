// tensorgrad's module Web Worker: loads Pyodide and the tensorgrad wheel, then hands every
// message from the page to Python's message loop (tensorgrad.web.worker.handle) and posts
// replies; a step message is offered to tensorgrad.web.worker.express first, which submits
// it at once when nothing is ahead of it and posts its reply itself (express steps). The
// messages are described by one table, tensorgrad/web/protocol.py; the "ready"
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
//
// Start-up, the path to "ready": the manifest; then Pyodide's loadPyodide(), from the
// bundle's memory snapshot where it fits (tensorgrad.web.worker already imported in it; see
// "the snapshot" below), while the wheel is fetched and decompressed; loadPyodide's fsInit hook
// unpacks the wheel into site-packages before Python starts (no micropip: it is loaded only for
// a wheel that cannot be unpacked as is, or ?install=micropip); then tensorgrad.web.worker is
// imported (a no-op after a restore). Without the snapshot (?snapshot=off, another wheel or
// browser), the imports read .pyc files that Pyodide compiled at build time (build.py), in the
// stdlib and in the wheel, so nothing compiles in the browser.
// "ready" carries {timings: {pyodideMs, snapshotMs?, fetchMs, wheelMs, micropipMs, importMs,
// totalMs}, install: {path: "unpack" | "micropip", snapshot: {used: true, file} | {used: false,
// reason}, wheels: [{url, path, files?, reason?}]}}: pyodideMs, snapshotMs (fetched and
// gunzipped) and fetchMs (the wheels fetched and decompressed) are times since the worker
// started, the others durations (an unpacked wheel's wheelMs, the wait in fsInit, lies inside
// pyodideMs).

const T0 = performance.now();
const elapsed = () => Math.round(performance.now() - T0);
const here = new URL(".", self.location.href);

// The page learns that this worker died (closed, crashed) when it is granted this lock, which
// the worker holds for its whole life (the browser releases it when the worker goes).
const LIFE_LOCK = new URL(self.location.href).searchParams.get("lock");
const holdingLock = LIFE_LOCK && self.navigator?.locks
  ? new Promise((held) => self.navigator.locks.request(LIFE_LOCK, () => {
    held(true);
    return new Promise(() => {});  // never released while the worker lives
  }))
  : Promise.resolve(false);

let handle = null;      // Python: tensorgrad.web.worker.handle (async), once ready
let express = null;     // Python: tensorgrad.web.worker.express (a step's fast path), too
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

// A step message is offered to express() first: it submits the step at once when nothing is
// to be waited for, and posts the reply itself (true); otherwise handle() takes it.
function takenByExpress(msg) {
  if (msg?.kind !== "step") return false;
  try {
    return express(msg) === true;
  } catch {
    return false;  // (Python answers its own errors: this is Pyodide failing; handle() tells)
  }
}

self.onmessage = (event) => {
  const msg = event.data;
  if (handle) {
    if (!takenByExpress(msg)) dispatch(msg);
  } else if (startError) self.postMessage({ id: msg?.id, ok: false, error: startError });
  else queued.push(msg);
};

// -- the wheel, unpacked straight into site-packages ---------------------------------------
// A pure-Python wheel (Root-Is-Purelib, no .data folder, no requirements) is a zip of files
// that belong in site-packages as they are: written there by fsInit, before Python starts, from
// bytes fetched while Pyodide loads. Anything else goes to micropip (loaded only then), as does
// every wheel with ?install=micropip.

const utf8 = new TextDecoder();

// The entries of a zip archive: [{name, data: Uint8Array}] (stored or deflated; no zip64).
async function unzip(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let eocd = bytes.length - 22;
  while (eocd >= 0 && view.getUint32(eocd, true) !== 0x06054b50) eocd--;
  if (eocd < 0) throw new Error("not a zip archive (no end of central directory)");
  const count = view.getUint16(eocd + 10, true);
  let at = view.getUint32(eocd + 16, true);
  const entries = [];
  for (let i = 0; i < count; i++) {
    if (view.getUint32(at, true) !== 0x02014b50) throw new Error("bad zip central directory");
    const method = view.getUint16(at + 10, true);
    const size = view.getUint32(at + 20, true);  // compressed
    const nameLen = view.getUint16(at + 28, true);
    const local = view.getUint32(at + 42, true);
    const name = utf8.decode(bytes.subarray(at + 46, at + 46 + nameLen));
    at += 46 + nameLen + view.getUint16(at + 30, true) + view.getUint16(at + 32, true);
    if (view.getUint32(local, true) !== 0x04034b50) throw new Error(`${name}: bad zip entry`);
    const start = local + 30 + view.getUint16(local + 26, true) + view.getUint16(local + 28, true);
    const raw = bytes.subarray(start, start + size);
    entries.push({ name, method, raw });
  }
  return Promise.all(entries.map(async ({ name, method, raw }) => {
    if (method === 0) return { name, data: raw };
    if (method !== 8) throw new Error(`${name}: zip method ${method} is not supported`);
    const stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
    return { name, data: new Uint8Array(await new Response(stream).arrayBuffer()) };
  }));
}
// Why a wheel cannot be unpacked as is (a string), or null when it can.
function notUnpackable(entries) {
  const file = (suffix) => entries.find((e) => /^[^/]+\.dist-info\//.test(e.name) &&
                                             e.name.endsWith(suffix));
  const wheel = file(".dist-info/WHEEL");
  const metadata = file(".dist-info/METADATA");
  if (!wheel || !metadata) return "no .dist-info/WHEEL or METADATA";
  if (!/^Root-Is-Purelib:\s*true\s*$/im.test(utf8.decode(wheel.data))) return "not purelib";
  if (entries.some((e) => /^[^/]+\.data\//.test(e.name))) return "it has a .data folder";
  const requires = utf8.decode(metadata.data).split(/\r?\n/)
    .filter((line) => /^Requires-Dist:/i.test(line) && !/;.*\bextra\s*==/.test(line));
  if (requires.length) return `it has requirements (${requires.join("; ")})`;
  return null;
}

// Write the entries under `root` (Emscripten's FS), refusing paths that leave it.
function writeTree(FS, root, entries) {
  for (const { name, data } of entries) {
    const parts = name.split("/");
    if (name.startsWith("/") || parts.includes("..")) throw new Error(`unsafe path ${name}`);
    if (name.endsWith("/")) {
      FS.mkdirTree(`${root}/${name}`);
      continue;
    }
    if (parts.length > 1) FS.mkdirTree(`${root}/${parts.slice(0, -1).join("/")}`);
    FS.writeFile(`${root}/${name}`, data);
  }
}

// -- the snapshot: Python's memory after `import tensorgrad.web.worker` ------------------------
// `python build.py web` has Chromium run this worker with ?snapshot=make: Pyodide starts, the
// wheel is unpacked, tensorgrad.web.worker is imported, and Pyodide's memory snapshot of that
// state (gzipped) goes into the bundle (manifest.snapshot). Restoring it skips Python's own
// start-up and every import. It is used only where it fits: the manifest's own wheel and
// Pyodide, and a browser with the same wasm features as the one that made it (the JSPI flavour,
// and the call trampoline Pyodide's preRun picked, which the snapshot's memory holds);
// otherwise Pyodide starts as usual. The snapshot fixes the interpreter's str hash seed per
// build; the random module is reseeded after a restore.
const JSPI = {
  newJspi: typeof WebAssembly.Suspending === "function",
  oldJspi: typeof WebAssembly.Suspender === "function",
};
const trampolineOf = (m) => m.HEAPU32[(m.__PyRuntime +
  m.HEAPU32[m.__PyEM_EMSCRIPTEN_TRAMPOLINE_OFFSET / 4]) / 4];

async function gunzip(res) {
  if (!res.ok) throw new Error(`HTTP ${res.status}`);
  const stream = res.body.pipeThrough(new DecompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

async function gzip(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new CompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

// Python run after a restore: what must differ between page loads, and the page's language.
const LANG = `${(self.navigator?.languages?.[0] ?? "C").replace("-", "_")}.UTF-8`;
const AFTER_RESTORE = `
import os, random, sys
random.seed()
os.environ["LANG"] = ${JSON.stringify(LANG)}
sys.path[:] = list(dict.fromkeys(sys.path))
del os, random, sys
`;

async function start() {
  const params = new URL(self.location.href).searchParams;
  const [manifest, lifeLock] = await Promise.all([
    fetch(new URL("manifest.json", here)).then((r) => (r.ok ? r.json() : {})).catch(() => ({})),
    holdingLock,
  ]);
  const indexURL = new URL(params.get("indexURL") ?? manifest.indexURL ?? "pyodide/", here).href;
  const wheels = params.getAll("wheel");
  if (!wheels.length && manifest.wheel) wheels.push(manifest.wheel);
  if (!wheels.length) throw new Error("no tensorgrad wheel: pass ?wheel=URL or serve manifest.json");
  const wheelURLs = wheels.map((w) => new URL(w, here).href);
  const forceMicropip = params.get("install") === "micropip";
  const snapshotParam = params.get("snapshot");  // "make" (build.py) | "off" | null
  const making = snapshotParam === "make";

  progress("loading-pyodide", { indexURL, lifeLock });
  const failed = (what) => (err) => {
    throw new Error(`${what} failed: ${err?.message ?? err}`);
  };
  const timings = { pyodideMs: 0, fetchMs: 0, wheelMs: 0, micropipMs: 0, importMs: 0 };

  const snap = manifest.snapshot;
  let noSnapshot = null;  // why the snapshot is not used
  if (!snap) noSnapshot = "the manifest has none";
  else if (snapshotParam) noSnapshot = `?snapshot=${snapshotParam}`;
  else if (forceMicropip) noSnapshot = "?install=micropip";
  else if (params.getAll("wheel").length || params.get("indexURL")) {
    noSnapshot = "a wheel or Pyodide other than the manifest's";
  } else if (JSPI.newJspi !== snap.features.newJspi || JSPI.oldJspi !== snap.features.oldJspi) {
    noSnapshot = `made in a browser with other wasm features (${JSON.stringify(snap.features)})`;
  }
  const snapshotBytes = noSnapshot ? null : fetch(new URL(snap.file, here)).then(gunzip)
    .catch(failed(`fetching the snapshot ${snap.file}`))
    .finally(() => { timings.snapshotMs = elapsed(); });
  snapshotBytes?.catch(() => {});

  // The wheels are fetched and decompressed while Pyodide loads, written to site-packages
  // before Python starts.
  const unpacked = forceMicropip ? [] : wheelURLs.map((url) => fetch(url)
    .then(async (res) => {
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      return new Uint8Array(await res.arrayBuffer());
    })
    .catch(failed(`fetching ${url}`))
    .then((bytes) => unzip(bytes).catch(failed(`unpacking ${url}`)))
    .finally(() => { timings.fetchMs = Math.max(timings.fetchMs, elapsed()); }));
  for (const u of unpacked) u.catch(() => {});  // awaited in fsInit; no unhandled rejection
  const install = { path: "unpack", snapshot: { used: false }, wheels: [] };
  let installError = null;
  const installWheels = async (FS, sitePackages) => {
    progress("installing", { wheels: wheelURLs, path: "unpack" });
    const t0 = elapsed();
    install.wheels = [];
    try {
      for (const [i, url] of wheelURLs.entries()) {
        const entries = await unpacked[i];
        const reason = notUnpackable(entries);
        if (!reason) writeTree(FS, sitePackages, entries);
        install.wheels.push({ url, path: reason ? "micropip" : "unpack", files: entries.length,
                              ...(reason ? { reason } : {}) });
      }
    } catch (err) {
      installError = err;  // thrown once loadPyodide returns (a failing fsInit would hang it)
    }
    timings.wheelMs = elapsed() - t0;
  };

  const { loadPyodide } = await import(new URL("pyodide.mjs", indexURL).href)
    .catch(failed(`loading Pyodide from ${indexURL}`));
  // One start of Pyodide, from the snapshot (a promise of its bytes) or not. fsInit runs in
  // Pyodide's preRun: after its trampoline is chosen, before a snapshot is restored.
  const boot = async (snapshot) => {
    let module = null;
    const asm = import(new URL("pyodide.asm.mjs", indexURL).href);
    const fsInit = async (FS, { sitePackages }) => {
      const trampoline = trampolineOf(module);
      if (snapshot && trampoline !== snap.features.trampoline) {
        noSnapshot = `its trampoline ${snap.features.trampoline} is not this browser's ${trampoline}`;
        (await snapshot)[0] ^= 0xff;  // a bad magic number: Pyodide refuses it before Python runs
        return;
      }
      if (!forceMicropip) await installWheels(FS, sitePackages);
    };
    const options = {
      indexURL, fsInit,
      createPyodideModule: async (settings) => {
        module = settings;
        return (await asm).default(settings);
      },
      ...(snapshot ? { _loadSnapshot: snapshot } : {}),
      ...(making ? { _makeSnapshot: true } : {}),
    };
    const py = await loadPyodide(options);
    return { py, trampoline: trampolineOf(module) };
  };
  let booted = null;
  if (snapshotBytes) {
    // (Pyodide awaits the bytes once it has started fetching and compiling its wasm)
    booted = await boot(snapshotBytes).catch((err) => {
      noSnapshot ??= `restoring it failed: ${err?.message ?? err}`;
      return null;
    });
  }
  booted ??= await boot(null).catch(failed(`starting Pyodide from ${indexURL}`));
  pyodide = booted.py;
  install.snapshot = noSnapshot ? { used: false, reason: noSnapshot }
    : { used: true, file: snap.file };
  timings.pyodideMs = elapsed();
  if (installError) throw installError;
  if (install.snapshot.used) {
    // What the state made at build time lacks: a fresh random seed, the page's language, and
    // Pyodide's record of the packages found in site-packages (the snapshot must not hold it).
    pyodide.runPython(AFTER_RESTORE);
    Object.assign(pyodide.loadedPackages, snap.loadedPackages ?? {});
  }

  const viaMicropip = forceMicropip ? wheelURLs
    : install.wheels.filter((w) => w.path === "micropip").map((w) => w.url);
  if (viaMicropip.length) {
    install.path = "micropip";
    if (forceMicropip) {
      progress("installing", { wheels: wheelURLs, path: "micropip" });
      install.wheels = wheelURLs.map((url) => ({ url, path: "micropip", reason: "?install=micropip" }));
    }
    const t0 = elapsed();
    await pyodide.loadPackage("micropip", { messageCallback: () => {} });
    timings.micropipMs = elapsed() - t0;
    const micropip = pyodide.pyimport("micropip");
    await micropip.install(viaMicropip).catch(failed(`installing ${viaMicropip.join(", ")}`));
    micropip.destroy();
    timings.wheelMs += elapsed() - t0 - timings.micropipMs;
  }

  const t0 = elapsed();
  if (making) {
    // build.py's run: the state after the imports, as a gzipped snapshot, and the features of
    // the browser that made it. Pyodide's JS-side record of loaded packages must be empty in
    // a snapshot: it is kept aside and put back after a restore. This worker then stops.
    pyodide.runPython("import tensorgrad.web.worker, tensorgrad.web.protocol");
    const loadedPackages = { ...pyodide.loadedPackages };
    for (const name of Object.keys(loadedPackages)) delete pyodide.loadedPackages[name];
    const bytes = pyodide.makeMemorySnapshot();
    const data = await gzip(bytes);
    self.postMessage({ kind: "snapshot", data, size: bytes.length, loadedPackages,
                       features: { ...JSPI, trampoline: booted.trampoline } }, [data.buffer]);
    return;
  }
  const worker = pyodide.pyimport("tensorgrad.web.worker");
  handle = worker.handle;
  express = worker.express;
  // Ready callbacks in batches, a few browser tasks a step (tensorgrad/web/loop.py); after
  // Pyodide's own start-up (a restore sets up its event loop again), before any message.
  pyodide.pyimport("tensorgrad.web.loop").install();
  const protocol = JSON.parse(pyodide.pyimport("tensorgrad.web.protocol").as_json());
  timings.importMs = elapsed() - t0;
  timings.totalMs = elapsed();
  progress("ready", { timings, install, python: pyodide.version, protocol });
  for (const msg of queued.splice(0)) dispatch(msg);
}

start().catch((err) => {
  startError = errorOf(err);
  progress("error", { error: startError });
  for (const msg of queued.splice(0)) {
    self.postMessage({ id: msg?.id, ok: false, error: startError });
  }
});
