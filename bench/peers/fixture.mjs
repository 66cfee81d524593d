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
// (&rounds=R: steady speed measured R times each way, see steady)
export function settings() {
  const q = new URL(self.location.href).searchParams;
  const int = (name, fallback) => Number.parseInt(q.get(name) ?? fallback, 10);
  return { kind: q.get("kind") ?? "mlp", mode: q.get("mode") ?? "page",
           check: int("check", 5), warmup: int("warmup", 2), steps: int("steps", 50),
           warmupSeconds: Number(q.get("warmupSeconds") ?? 0), rounds: int("rounds", 1) };
}

// Steps/s of `count` steps through `step(i)` (a promise of the step's loss, a number), with
// `depth` steps in flight: each step is sent `depth - 1` steps before its loss is read (1:
// each awaited before the next is sent). Every loss is read, in order, and checked finite.
async function rate(step, first, count, depth) {
  const inFlight = [];
  const t0 = performance.now();
  for (let i = first; i < first + count; i++) {
    inFlight.push([i, step(i)]);
    if (inFlight.length === depth) {
      const [j, loss] = inFlight.shift();
      finite(await loss, j);
    }
  }
  for (const [j, loss] of inFlight) finite(await loss, j);
  return (1000 * count) / (performance.now() - t0);
}

function finite(loss, i) {
  if (!Number.isFinite(loss)) throw new Error(`step ${i}: loss ${loss}`);
}

// Steady steps/s three ways, `count` steps a measure: each step awaited before the next is
// sent ("awaitEach"), one step sent ahead of reading the last one's loss ("ahead", 2 in
// flight), and pipelined ("pipelined", 4 in flight: three steps sent ahead). With `rounds`
// above 1 the three measures take turns, each round in another order (a machine whose load
// drifts weighs on every way alike), and each figure is the median of its rounds.
export async function steady(step, first, count, rounds = 1) {
  const ways = [["awaitEach", 1], ["ahead", 2], ["pipelined", 4]];
  const got = { awaitEach: [], ahead: [], pipelined: [] };
  let i = first;
  for (let r = 0; r < rounds; r++) {
    for (let w = 0; w < ways.length; w++) {
      const [name, depth] = ways[(w + r) % ways.length];
      got[name].push(await rate(step, i, count, depth));
      i += count;
    }
  }
  const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b), m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
  };
  return Object.fromEntries(Object.entries(got).map(([k, xs]) => [k, median(xs)]));
}
