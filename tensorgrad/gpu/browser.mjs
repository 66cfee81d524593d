// tensorgrad's browser GPU adapter, the JS half of tensorgrad/gpu/browser.py (shipped in the
// wheel, imported once per interpreter). Every Python→JS crossing costs far more than a WebGPU
// call made from here, so the per-step work lives in this module: createProgram() makes a
// step's bind groups and chunks once, execute() runs a whole step in one call (submit() and
// its readback: the same in two parts).

const USAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
const align4 = (n) => (n + 3) & ~3;

export async function requestDevice(limitNames, wantedFeatures) {
  const gpu = globalThis.navigator?.gpu;
  if (!gpu) throw new Error("WebGPU is not available here (navigator.gpu is missing): use a " +
    "browser with WebGPU, served from https:// or http://127.0.0.1");
  const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) throw new Error("navigator.gpu.requestAdapter() found no GPU adapter");
  const requiredLimits = {};
  for (const name of [...limitNames, "maxComputeWorkgroupSizeX", "maxComputeWorkgroupSizeY",
                      "maxComputeWorkgroupSizeZ"]) {
    if (adapter.limits[name] !== undefined) requiredLimits[name] = adapter.limits[name];
  }
  const requiredFeatures = wantedFeatures.filter((f) => adapter.features.has(f));
  let device;
  try {
    device = await adapter.requestDevice({ label: "tensorgrad", requiredLimits, requiredFeatures });
  } catch (err) {  // an optional feature refused: go on without them
    if (!requiredFeatures.length) throw err;
    device = await adapter.requestDevice({ label: "tensorgrad", requiredLimits });
  }
  const state = { device, adapter, lost: null, staging: [] };
  device.lost.then((info) => { state.lost = `${info.reason}: ${info.message}`; });
  const info = adapter.info ?? {};
  const limits = {};
  for (const name of limitNames) limits[name] = device.limits[name];
  // Chromium's software adapter (SwiftShader) says so in its architecture.
  const software = Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter) ||
    info.architecture === "swiftshader";
  return { state, limits, vendor: info.vendor ?? "", architecture: info.architecture ?? "",
           description: info.description ?? "", software, features: [...device.features] };
}

// The error of every call on a lost device, named so that Python maps it to DeviceLostError.
function lostError(state) {
  return Object.assign(new Error(`the GPU device was lost (${state.lost}); its graphs cannot ` +
    "run any more: compile again (a new device is requested) or start a new session"),
  { name: "DeviceLostError" });
}

// Why the device was lost ("reason: message"), or undefined (Python's None) while it works.
export function lostReason(state) {
  return state.lost ?? undefined;
}

export function createBuffer(state, size, label) {
  return state.device.createBuffer({ size: align4(size), usage: USAGE(), label });
}

export function writeBuffer(state, buffer, offset, data) {
  state.device.queue.writeBuffer(buffer, offset, data);
}

// The compiler's error messages of a shader module's compilation info.
function compileErrors(info) {
  return info.messages.filter((m) => m.type === "error")
    .map((m) => `error at line ${m.lineNum}:${m.linePos}: ${m.message}`);
}

// A compute pipeline plus a promise of its error messages ([] when it compiled).
export function createKernel(state, wgsl, label) {
  const device = state.device;
  device.pushErrorScope("validation");
  const module = device.createShaderModule({ code: wgsl, label });
  const pipeline = device.createComputePipeline({
    layout: "auto", compute: { module, entryPoint: "main" }, label });
  const scope = device.popErrorScope();
  const check = (async () => {
    const messages = compileErrors(await module.getCompilationInfo());
    const err = await scope;  // e.g. a pipeline the WGSL alone does not explain
    if (err && !messages.length) messages.push(err.message);
    return messages;
  })();
  return { pipeline, check };
}

// Many kernels at once: each pipeline is made with createComputePipelineAsync, so the
// browser may compile them in parallel; resolves to [{pipeline, messages}] in order
// (pipeline null and the compiler's messages where one failed).
export async function createKernels(state, sources, labels) {
  const device = state.device;
  return Promise.all(sources.map(async (code, i) => {
    const label = labels[i];
    device.pushErrorScope("validation");
    const module = device.createShaderModule({ code, label });
    const made = device.createComputePipelineAsync({
      layout: "auto", compute: { module, entryPoint: "main" }, label });
    const scope = device.popErrorScope();
    const [info, pipeline, err] = await Promise.allSettled([module.getCompilationInfo(), made,
                                                            scope]);
    const messages = info.status === "fulfilled" ? compileErrors(info.value) : [];
    if (!messages.length && pipeline.status === "rejected") messages.push(String(pipeline.reason?.message ?? pipeline.reason));
    if (!messages.length && err.status === "fulfilled" && err.value) messages.push(err.value.message);
    return { pipeline: pipeline.status === "fulfilled" ? pipeline.value : null, messages };
  }));
}

// createKernels in the background: a job whose `done` turns true once every pipeline is
// settled; `promise` resolves to what createKernels gives.
export function startKernels(state, sources, labels) {
  const job = { done: false, promise: null };
  job.promise = createKernels(state, sources, labels)
    .finally(() => { job.done = true; });
  job.promise.catch(() => {});
  return job;
}

// steps: ["d", pipeline, [[buffer, offset, size], ...], x, y, z, label] (size 0: the rest of
// the buffer) | ["c", src, srcOffset, dst, dstOffset, size]
export function createProgram(state, steps, chunkSize) {
  const device = state.device;
  device.pushErrorScope("validation");
  const chunks = [[]];
  let passes = 0;
  for (const s of steps) {
    if (s[0] === "d") {
      if (chunkSize > 0 && passes === chunkSize) { chunks.push([]); passes = 0; }
      const [, pipeline, buffers, x, y, z, label] = s;
      const bindGroup = device.createBindGroup({
        layout: pipeline.getBindGroupLayout(0), label,
        entries: buffers.map(([buffer, offset, size], binding) => ({
          binding, resource: size ? { buffer, offset, size } : { buffer, offset } })),
      });
      chunks[chunks.length - 1].push({ pipeline, bindGroup, x, y, z, label });
      passes += 1;
    } else {
      const [, src, srcOffset, dst, dstOffset, size] = s;
      chunks[chunks.length - 1].push({ src, srcOffset, dst, dstOffset, size: align4(size) });
    }
  }
  const error = device.popErrorScope();
  return { chunks, error, checked: false, passes: steps.filter((s) => s[0] === "d").length };
}

// Release a program: its chunks (pipelines, bind groups) are dropped for the GC; a run in
// flight keeps the array it read.
export function destroyProgram(state, program) {
  program.chunks = [];
  program.error = null;
}

// Consecutive dispatches share a compute pass, as in the native adapter (each dispatch is
// its own usage scope, so WebGPU orders their memory accesses); a copy ends the pass. In
// Chromium this took the addition transformer's encoding (138 dispatches) from 0.7 to 0.3 ms
// a step.
function encode(encoder, ops) {
  let pass = null, pipeline = null;
  for (const op of ops) {
    if (op.pipeline) {
      if (!pass) { pass = encoder.beginComputePass({ label: "tensorgrad step" }); pipeline = null; }
      if (op.pipeline !== pipeline) { pass.setPipeline(op.pipeline); pipeline = op.pipeline; }
      pass.setBindGroup(0, op.bindGroup);
      pass.dispatchWorkgroups(op.x, op.y, op.z);
    } else {
      if (pass) { pass.end(); pass = null; }
      encoder.copyBufferToBuffer(op.src, op.srcOffset, op.dst, op.dstOffset, op.size);
    }
  }
  if (pass) pass.end();
}

function takeStaging(state, size) {
  const i = state.staging.findIndex((b) => b.size >= size);
  if (i >= 0) return state.staging.splice(i, 1)[0];
  return state.device.createBuffer({
    size: Math.max(align4(size), 256), label: "tensorgrad-readback",
    usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
}

// Copy the reads ([buffer, offset, nbytes] flat) into one staging buffer; returns
// [staging, total] (null when no reads).
function encodeReads(state, encoder, reads) {
  let total = 0;
  for (let i = 0; i < reads.length; i += 3) total += align4(reads[i + 2]);
  if (total === 0) return null;
  const staging = takeStaging(state, total);
  let offset = 0;
  for (let i = 0; i < reads.length; i += 3) {
    const size = align4(reads[i + 2]);
    encoder.copyBufferToBuffer(reads[i], reads[i + 1], staging, offset, size);
    offset += size;
  }
  return [staging, total];
}

// One ArrayBuffer holding every read back to back (each padded to 4 bytes); `mapping`: the
// staging buffer's mapAsync when the caller issued it already.
async function mapReads(state, pending, mapping = null) {
  if (!pending) return new ArrayBuffer(0);
  const [staging, total] = pending;
  await (mapping ?? staging.mapAsync(GPUMapMode.READ, 0, total));
  const out = staging.getMappedRange(0, total).slice(0);
  staging.unmap();
  state.staging.push(staging);
  // The pool keeps the 8 most recently used buffers, 64 MiB together (as the native adapter).
  while (state.staging.length > 8 ||
         state.staging.reduce((n, b) => n + b.size, 0) > 64 * 1024 * 1024) {
    state.staging.shift().destroy();
  }
  return out;
}

function checkErrors(errors, what) {
  const messages = errors.filter((e) => e).map((e) => e.message);
  if (messages.length) throw new Error(`WebGPU validation failed in ${what}:\n` + messages.join("\n"));
}

// args: [writeBuffers, writeOffsets, writeSizes, blob (Uint8Array), reads (flat triples)]
export async function execute(state, program, args) {
  const job = submit(state, program, args);
  await job.ready;
  return job.readback;
}

// execute() in two parts: {ready, readback}. `ready` is undefined (Python's None) when the
// step is already written and submitted (a one-chunk program: no wait needed, no promise to
// await), else a promise of its submission; `readback` then holds a promise of the reads'
// bytes. What the queue gets after the submission runs after the step, so the next step can
// be submitted while this one's readback is on its way.
export function submit(state, program, args) {
  if (state.lost) throw lostError(state);
  if (program.checked && program.chunks.length <= 1) {
    return { ready: undefined, readback: submitChunks(state, program, args).readback };
  }
  const job = { ready: undefined, readback: undefined };
  job.ready = (async () => {
    if (!program.checked) {
      checkErrors([await program.error], "create_program");
      program.checked = true;
    }
    job.readback = (await submitChunks(state, program, args)).readback;
  })();
  return job;
}

// submit() when it needs no wait (a checked one-chunk program on a live device), its
// readback handed to `done(bytes, undefined)` or `done(undefined, error)`, which is then
// destroyed (a PyProxy); false, with nothing done, otherwise. Python's express steps.
export function submitNow(state, program, args, done) {
  if (state.lost || !program.checked || program.chunks.length > 1) return false;
  const { readback } = submitOne(state, program, args);
  readback.then((out) => done(out, undefined), (err) => done(undefined, err))
    .finally(() => done.destroy());
  return true;
}

// Write the inputs and submit the chunks (waiting between them for a program of more than
// one chunk: then it returns a promise); {readback}.
function submitChunks(state, program, args) {
  if (program.chunks.length <= 1) return submitOne(state, program, args);
  return submitMany(state, program, args);
}

// One error scope for the writes and the submission (one answer to wait for, not two).
function submitOne(state, program, args) {
  const device = state.device;
  device.pushErrorScope("validation");
  writeInputs(state, args);
  const encoder = device.createCommandEncoder();
  encode(encoder, program.chunks[0] ?? []);
  const pending = encodeReads(state, encoder, args[4]);
  device.queue.submit([encoder.finish()]);
  const scopes = [device.popErrorScope()];
  const done = pending ? null : device.queue.onSubmittedWorkDone();
  return { readback: readAfter(state, pending, done, scopes) };
}

// Write the inputs of args.
function writeInputs(state, args) {
  const [writeBuffers, writeOffsets, writeSizes, blob] = args;
  const queue = state.device.queue;
  let offset = 0;
  for (let i = 0; i < writeBuffers.length; i++) {
    queue.writeBuffer(writeBuffers[i], writeOffsets[i], blob, offset, writeSizes[i]);
    offset += writeSizes[i];
  }
}

// The readback of a submitted step: its reads mapped at once (the map resolves when the last
// chunk is done), before the error scopes are awaited: their answers and the map's come in
// one wait.
function readAfter(state, pending, previous, scopes) {
  const mapping = pending ? pending[0].mapAsync(GPUMapMode.READ, 0, pending[1]) : null;
  mapping?.catch(() => {});
  const readback = finish(state, pending, mapping, previous, scopes);
  readback.catch(() => {});  // handled: the caller awaits it
  return readback;
}

async function submitMany(state, program, args) {
  const reads = args[4];
  const device = state.device, queue = device.queue;
  device.pushErrorScope("validation");
  writeInputs(state, args);
  const scopes = [device.popErrorScope()];
  let previous = null, pending = null;
  const chunks = program.chunks;
  for (let c = 0; c < chunks.length; c++) {
    device.pushErrorScope("validation");
    const encoder = device.createCommandEncoder();
    encode(encoder, chunks[c]);
    if (c === chunks.length - 1) pending = encodeReads(state, encoder, reads);
    queue.submit([encoder.finish()]);
    scopes.push(device.popErrorScope());
    // At most two chunks in flight: chunk c is queued before waiting for chunk c - 1. The
    // last chunk's reads are mapped, which waits for it: no onSubmittedWorkDone of its own
    // (one round trip to the GPU process less a step; the MLP's whole step is one chunk).
    const done = c === chunks.length - 1 && pending ? null : queue.onSubmittedWorkDone();
    if (previous) await previous;
    previous = done;
  }
  return { readback: readAfter(state, pending, previous, scopes) };
}

async function finish(state, pending, mapping, previous, scopes) {
  if (previous) await previous;
  try {
    checkErrors(await Promise.all(scopes), "execute");
  } catch (err) {
    if (mapping) {  // the staging buffer goes back to the pool, unmapped
      await mapping.catch(() => {});
      if (pending[0].mapState === "mapped") pending[0].unmap();
      state.staging.push(pending[0]);
    }
    throw err;
  }
  return mapReads(state, pending, mapping);
}

export async function readBuffers(state, reads) {
  if (state.lost) throw lostError(state);
  const device = state.device;
  device.pushErrorScope("validation");
  const encoder = device.createCommandEncoder();
  const pending = encodeReads(state, encoder, reads);
  device.queue.submit([encoder.finish()]);
  checkErrors([await device.popErrorScope()], "read_buffers");
  return mapReads(state, pending);
}

export function destroy(state) {
  for (const b of state.staging) b.destroy();
  state.staging.length = 0;
  state.device.destroy();
}

// Whether navigator.gpu gives an adapter (retried: a first null adapter can be transient);
// {ok, message, reason}. No device is created.
export async function probeAdapter() {
  const gpu = globalThis.navigator?.gpu;
  if (!gpu) {
    return { ok: false, reason: "no-webgpu", message: "WebGPU is not available here " +
      "(navigator.gpu is missing): use a browser with WebGPU, served from https:// or " +
      "http://127.0.0.1", ...where() };
  }
  for (const delay of [0, 100, 400]) {
    if (delay) await new Promise((resolve) => setTimeout(resolve, delay));
    const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" }).catch(() => null);
    if (adapter) {
      const info = adapter.info ?? {};
      const name = [info.vendor, info.architecture].filter(Boolean).join(" ") || "an adapter";
      return { ok: true, message: `WebGPU ready: ${name}`, adapter: name, ...where() };
    }
  }
  return { ok: false, reason: "no-adapter", message: "WebGPU is present but found no GPU " +
    "adapter (blocked or unsupported GPU; on Linux, Chrome needs --enable-unsafe-webgpu)",
    ...where() };
}

// What the in-process path depends on besides the adapter: whether this browser has JSPI
// (WebAssembly.Suspending, which Pyodide's run_sync needs) and whether the page is
// cross-origin isolated (tensorgrad does not need it; reported for completeness).
function where() {
  return { jspiBrowser: typeof globalThis.WebAssembly?.Suspending === "function",
           crossOriginIsolated: Boolean(globalThis.crossOriginIsolated) };
}

// -- param init ---------------------------------------------------------------------------
// tensorgrad/init.py's Mulberry32.normals, for Pyodide without NumPy (the Python loop took
// 0.4 s of a compile for the addition transformer's 148,800 values): `n` Box–Muller values
// (cosine branch, u1 clamped at 1e-10, in double) times `std`, rounded to f32, from the
// stream whose uint32 state is `state`; the caller advances its state by 2n draws. JS's
// log and cos may round the last bit of a double unlike the C library's: the f32 values
// agree to one ulp, as the NumPy path's do.
export function normals(state, n, std) {
  const out = new Float32Array(n);
  let s = state >>> 0;
  const draw = () => {
    s = (s + 0x6D2B79F5) >>> 0;
    let t = Math.imul(s ^ (s >>> 15), s | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const twoPi = 2 * Math.PI;
  for (let i = 0; i < n; i++) {
    const u1 = draw();
    const u2 = draw();
    out[i] = Math.sqrt(-2 * Math.log(Math.max(1e-10, u1))) * Math.cos(twoPi * u2) * std;
  }
  return out;
}
