// The bench's shared data (bench/bench_peers.py writes it): the initial params, made once by
// tensorgrad's init, and the batches, made once by the demo's own batch(); every library and
// mode trains from these, so the bench compares the same work.
//
//   /peers-data/<kind>.json  {params: [{name, shape, decay, offset, size}], inputs: {name:
//                             {shape, dtype}}, batches: [{name: [byteOffset, count]}], ...}
//   /peers-data/<kind>.bin   the values, little-endian f32 / i32

export async function loadFixture(kind) {
  const [meta, buf] = await Promise.all([
    fetch(`/peers-data/${kind}.json`).then((r) => r.json()),
    fetch(`/peers-data/${kind}.bin`).then((r) => r.arrayBuffer()),
  ]);
  const params = {}, shapes = {}, decay = {};
  for (const p of meta.params) {
    params[p.name] = new Float32Array(buf, p.offset, p.size);
    shapes[p.name] = p.shape;
    decay[p.name] = p.decay;
  }
  const inputShapes = {};
  for (const [name, spec] of Object.entries(meta.inputs)) inputShapes[name] = spec.shape;
  // Batch i (cycling), each array a fresh copy (the page client transfers what it is given).
  const batch = (i) => {
    const out = {};
    for (const [name, [offset, count]] of Object.entries(meta.batches[i % meta.batches.length])) {
      const Ctor = meta.inputs[name].dtype === "i32" ? Int32Array : Float32Array;
      out[name] = new Ctor(buf.slice(offset, offset + 4 * count));
    }
    return out;
  };
  return { meta, params, shapes, decay, inputShapes, batch };
}

// Warm-up: `count` steps at least, and until `seconds` have passed since `since` (a
// tiered start swaps its optimized kernels in after a few seconds of steps: steady speed is
// measured after it, for every library alike). Returns the next batch index.
export async function warmUp(step, first, count, since, seconds) {
  let i = first;
  while (i < first + count || performance.now() - since < 1000 * seconds) await step(i++);
  return i;
}

// The page's settings: ?kind=mlp|transformer&check=K&warmup=W&steps=N(&mode=page|script)
export function settings() {
  const q = new URL(self.location.href).searchParams;
  const int = (name, fallback) => Number.parseInt(q.get(name) ?? fallback, 10);
  return { kind: q.get("kind") ?? "mlp", mode: q.get("mode") ?? "page",
           check: int("check", 5), warmup: int("warmup", 2), steps: int("steps", 50),
           warmupSeconds: Number(q.get("warmupSeconds") ?? 0) };
}

// Steps/s of `count` steps through `step(i)` (a promise of the step's loss, a number), two
// ways: each step awaited before the next is sent ("await"), and one step sent ahead of the
// loss being read ("ahead"). Every loss is read and checked to be finite.
export async function steady(step, first, count) {
  const finite = (loss, i) => {
    if (!Number.isFinite(loss)) throw new Error(`step ${i}: loss ${loss}`);
  };
  let i = first;
  let t0 = performance.now();
  for (let k = 0; k < count; k++, i++) finite(await step(i), i);
  const awaitEach = (1000 * count) / (performance.now() - t0);
  t0 = performance.now();
  let pending = step(i++);
  for (let k = 1; k < count; k++, i++) {
    const next = step(i);
    finite(await pending, i - 1);
    pending = next;
  }
  finite(await pending, i - 1);
  const ahead = (1000 * count) / (performance.now() - t0);
  return { awaitEach, ahead };
}
