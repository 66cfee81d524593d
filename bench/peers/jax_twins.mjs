// The jax-js twins of the two bench workloads (bench/bench_peers.py): the same architecture,
// loss and optimizer as demos/mlp_sin/model.py and demos/addition_transformer/model.py in
// tensorgrad, with the params given (the fixture's, made by tensorgrad's init) rather than
// drawn. One jitted function does a whole training step: forward, backward and the update.
//
// jax-js's arrays are reference counted: a function takes ownership of every array passed to
// it, so a value used more than once is passed as `x.ref` for every use but the last.
//
// The optimizer is tensorgrad's (tensorgrad/optim.py): with lrt = lr_t sqrt(1 - b2^t) /
// (1 - b1^t) and s = 1 - lr_t wd (1 for params that do not decay), both computed on the host,
//   m' = b1 m + (1 - b1) g,  v' = b2 v + (1 - b2) g²,  p' = s p - lrt m' / (sqrt(v') + eps)
// after clipping (clip_grad_norm = c: every gradient times min(c / (||g|| + 1e-6), 1)).

const B1 = 0.9, B2 = 0.999, EPS = 1e-8;

// -- the MLP 1-64-64-1, MSE on sin(x), Adam(lr=5e-3) -----------------------------------------
function mlpLoss(np, nn, p, x, y) {
  const linear = (h, name) => np.matmul(h, p[`${name}.W`]).add(p[`${name}.b`]);
  const h1 = nn.relu(linear(x, "l1"));
  const h2 = nn.relu(linear(h1, "l2"));
  const out = linear(h2, "l3");
  return np.mean(np.square(out.sub(y)));
}

// -- the addition transformer: D 64, 4 heads, 3 layers, hidden 256, vocab 12, T 8 -------------
const VOCAB = 12, D = 64, HEADS = 4, LAYERS = 3, T = 8, ANSWERS = 3;

function layerNorm(np, x, g, b) {
  const mu = np.mean(x.ref, -1, { keepdims: true });
  const xc = x.sub(mu);
  const variance = np.mean(np.square(xc.ref), -1, { keepdims: true });
  return xc.div(np.sqrt(variance.add(1e-5))).mul(g).add(b);
}

function splitHeads(np, x) {  // [B, T, D] -> [B, H, T, D/H]
  const [b, t] = x.shape;
  return np.swapaxes(x.reshape([b, t, HEADS, D / HEADS]), 1, 2);
}

function mergeHeads(np, x) {  // [B, H, T, d] -> [B, T, H d]
  const [b, , t] = x.shape;
  return np.swapaxes(x, 1, 2).reshape([b, t, D]);
}

function transformerLoss(np, nn, p, tokens, targets, mask) {
  const [batch, t] = tokens.shape;
  // Embedding rows picked by one-hot products (exact: the other rows add zeros).
  const tokEmb = p.tok_emb;
  let x = np.matmul(nn.oneHot(tokens, VOCAB), tokEmb.ref)
    .add(p.pos_emb.slice([0, t]));
  // The causal mask: row q covers columns 0..q.
  const causal = np.tril(np.ones([t, t])).greater(0);
  for (let i = 0; i < LAYERS; i++) {
    const w = (name) => p[`blocks.${i}.${name}`];
    const h = layerNorm(np, x.ref, w("ln1.g"), w("ln1.b"));
    const q = splitHeads(np, np.matmul(h.ref, w("q.W")));
    const k = splitHeads(np, np.matmul(h.ref, w("k.W")));
    const v = splitHeads(np, np.matmul(h, w("v.W")));
    const scores = np.matmul(q, np.swapaxes(k, -1, -2)).mul(1 / Math.sqrt(D / HEADS));
    const attn = nn.softmax(np.where(i < LAYERS - 1 ? causal.ref : causal, scores, -Infinity), -1);
    x = x.add(np.matmul(mergeHeads(np, np.matmul(attn, v)), w("o.W")));
    const up = nn.relu(np.matmul(layerNorm(np, x.ref, w("ln2.g"), w("ln2.b")), w("up.W"))
      .add(w("up.b")));
    x = x.add(np.matmul(up, w("down.W")).add(w("down.b")));
  }
  const logits = np.matmul(layerNorm(np, x, p["ln_f.g"], p["ln_f.b"]), np.swapaxes(tokEmb, 0, 1));
  const ce = np.sum(nn.logSoftmax(logits, -1).mul(nn.oneHot(targets, VOCAB)), -1).neg();
  return np.sum(ce.mul(mask)).mul(1 / (batch * ANSWERS));
}

export const WORKLOADS = {
  mlp: { loss: mlpLoss, inputs: ["x", "y"], lr: () => 5e-3, weightDecay: 0, clip: null },
  transformer: {
    loss: transformerLoss, inputs: ["tokens", "targets", "mask"],
    // tg.lr.linear(peak=0.005, final=0.0005, steps=1500), at 1-based step t
    lr: (t) => 0.005 + (0.0005 - 0.005) * Math.min(t / 1500, 1),
    weightDecay: 0.01, clip: 1.0,
  },
};

// A trainer for `kind` ("mlp" | "transformer") starting from `params` {name: Float32Array}
// with `shapes` {name: dims} and `decay` {name: bool}: trainer.step(batch) dispatches one
// step and returns its loss (a jax-js Array: `await loss.data()` reads it).
export function trainer(jax, kind, params, shapes, decay) {
  const { numpy: np, nn, jit, valueAndGrad } = jax;
  const spec = WORKLOADS[kind];
  const names = Object.keys(params);
  const lossOf = (p, ...inputs) => spec.loss(np, nn, p, ...inputs);
  const update = jit((p, m, v, lrt, shrink, ...inputs) => {
    // (the params are used again by the update: the gradient takes references)
    const refs = Object.fromEntries(names.map((n) => [n, p[n].ref]));
    const [loss, grads] = valueAndGrad(lossOf)(refs, ...inputs);
    let scale = null;
    if (spec.clip !== null) {
      let total = null;
      for (const n of names) {
        const sq = np.sum(np.square(grads[n].ref));
        total = total === null ? sq : total.add(sq);
      }
      scale = np.minimum(np.array(spec.clip).div(np.sqrt(total).add(1e-6)), 1);
    }
    const p2 = {}, m2 = {}, v2 = {};
    for (const [i, n] of names.entries()) {
      const last = i === names.length - 1;
      const g = scale === null ? grads[n] : grads[n].mul(last ? scale : scale.ref);
      m2[n] = m[n].mul(B1).add(g.ref.mul(1 - B1));
      v2[n] = v[n].mul(B2).add(np.square(g).mul(1 - B2));
      const shrunk = decay[n] && spec.weightDecay ? p[n].mul(last ? shrink : shrink.ref) : p[n];
      p2[n] = shrunk.sub(m2[n].ref.div(np.sqrt(v2[n].ref).add(EPS)).mul(last ? lrt : lrt.ref));
      if (last && !(decay[n] && spec.weightDecay)) shrink.dispose();
    }
    return [loss, p2, m2, v2];
  });
  const put = (data, dims) => np.array(data, { shape: dims });
  let p = {}, m = {}, v = {};
  for (const n of names) {
    p[n] = put(params[n], shapes[n]);
    m[n] = np.zeros(shapes[n]);
    v[n] = np.zeros(shapes[n]);
  }
  let t = 0;
  return {
    // batch: {name: typed array}, with `inputShapes` {name: dims}, `inputTypes` {name: dtype}
    step(batch, inputShapes) {
      t += 1;
      const lr = spec.lr(t);
      const lrt = Math.fround(lr * Math.sqrt(1 - B2 ** t) / (1 - B1 ** t));
      const shrink = Math.fround(1 - lr * spec.weightDecay);
      const inputs = spec.inputs.map((name) => np.array(batch[name], {
        shape: inputShapes[name], dtype: batch[name] instanceof Int32Array ? np.int32 : np.float32,
      }));
      const scalar = (value) => np.array(new Float32Array([value]), { shape: [] });
      const [loss, p2, m2, v2] = update(p, m, v, scalar(lrt), scalar(shrink), ...inputs);
      p = p2; m = m2; v = v2;
      return loss;
    },
  };
}
