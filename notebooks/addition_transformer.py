"""JupyterLite notebook: the addition transformer (demos/addition_transformer/), trained
in-process with a live loss chart, then greedy decoding of held-out sums.

Percent format (litebundle.py converts it to addition_transformer.ipynb).
"""

# %% [markdown]
# # A transformer learns 2-digit addition
#
# A 3-layer transformer reads `a1 a0 + b1 b0 =` and writes the digits of the sum, least
# significant first. Sums whose pair satisfies `((100a + b)·31 + 7) % 5 == 0` are held out of
# training and used to test it. The model is the one of `demos/addition_transformer/`; here
# it trains in this kernel's Web Worker on its own WebGPU.
#
# `STEPS = 30` keeps a run short on a CPU rasteriser (the loss falls from about 2.6 to below
# 1.75). Set `STEPS = 1500` to learn addition: on a real GPU that takes a few minutes and gets
# nearly every held-out sum right.

# %%
# %pip install tensorgrad-webgpu

# %%
import array
import random
import time

from IPython.display import HTML, display

import tensorgrad as tg

print((await tg.check_webgpu()).message)

STEPS, TARGET, SEED = 30, 1.75, 1

# %%
VOCAB, PLUS, EQUALS = 12, 10, 11
SEQ, T = 9, 8                      # tokens per example; the model reads the first 8
D, HEADS, LAYERS, HIDDEN = 64, 4, 3, 256
BATCH, ANSWER_FROM = 128, 5        # positions 5, 6, 7 predict the sum's three digits


class Block(tg.Module):
    def __init__(self):
        self.ln1, self.ln2 = tg.LayerNorm(D), tg.LayerNorm(D)
        self.q, self.k, self.v, self.o = (tg.Linear(D, D, bias=False) for _ in range(4))
        self.up, self.down = tg.Linear(D, HIDDEN), tg.Linear(HIDDEN, D)

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = (tg.split_heads(f(h), HEADS) for f in (self.q, self.k, self.v))
        scores = (q @ tg.swap_axes(k, -1, -2)) * (1.0 / (D // HEADS) ** 0.5)
        x = x + self.o(tg.merge_heads(tg.softmax_causal(scores) @ v))
        return x + self.down(tg.relu(self.up(self.ln2(x))))


class AdditionTransformer(tg.Module):
    def __init__(self):
        self.tok_emb = self.param((VOCAB, D), init=tg.init.randn(0.02))
        self.pos_emb = self.param((SEQ, D), init=tg.init.randn(0.02))
        self.blocks = [Block() for _ in range(LAYERS)]
        self.ln_f = tg.LayerNorm(D)

    def forward(self, tokens):
        x = tg.embedding(self.tok_emb, tokens) + tg.narrow(self.pos_emb, 0, 0, tokens.shape[-1])
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ tg.swap_axes(self.tok_emb, 0, 1)   # tied LM head


def loss_fn(model, tokens, targets, mask):
    ce = tg.cross_entropy(model(tokens), targets, reduction="none")
    return tg.sum(ce * mask) * (1.0 / (tokens.shape[0] * (T - ANSWER_FROM)))


def encode(a, b):
    s = a + b
    return [a // 10, a % 10, PLUS, b // 10, b % 10, EQUALS, s % 10, (s // 10) % 10, s // 100]


def held_out(a, b):
    return ((100 * a + b) * 31 + 7) % 5 == 0


TRAIN_PAIRS = [(a, b) for a in range(100) for b in range(100) if not held_out(a, b)]
TEST_PAIRS = [(a, b) for a in range(100) for b in range(100) if held_out(a, b)]
MASK = array.array("f", [1.0 if t >= ANSWER_FROM else 0.0 for t in range(T)])


def batch(rng):
    tokens, targets = array.array("i"), array.array("i")
    for _ in range(BATCH):
        seq = encode(*rng.choice(TRAIN_PAIRS))
        tokens.extend(seq[:-1])
        targets.extend(seq[1:])
    return {"tokens": tokens, "targets": targets, "mask": MASK}

# %%
t0 = time.perf_counter()
train = await tg.compile(
    model=AdditionTransformer(), loss=loss_fn,
    inputs={"tokens": ((BATCH, T), "i32"), "targets": ((BATCH, T), "i32"), "mask": (T,)},
    optimizer=tg.optim.AdamW(lr=tg.lr.linear(peak=0.005, final=0.0005, steps=1500),
                             weight_decay=0.01, clip_grad_norm=1.0),
    seed=SEED)
predict = await train.attach(forward=lambda m, tokens: tg.argmax(m(tokens), -1),
                             inputs={"tokens": ((None, T), "i32")}, output="i32")
print(f"compiled in {time.perf_counter() - t0:.1f} s: {train.kernel_count} kernels, "
      f"{train.param_count:,} params")

# %% [markdown]
# Training, with the loss drawn as it falls (one display, updated in place):

# %%
def chart(losses, rate):
    """An SVG line of the losses so far, and the latest figures."""
    w, h, top = 480, 160, max(losses)
    pts = " ".join(f"{8 + i * (w - 16) / max(1, len(losses) - 1):.1f},"
                   f"{h - 8 - (h - 16) * v / top:.1f}" for i, v in enumerate(losses))
    return HTML(f'<svg width="{w}" height="{h}" style="background:#f8fafc">'
                f'<polyline points="{pts}" fill="none" stroke="#2563eb" stroke-width="2"/>'
                f'</svg><div>step {len(losses)}: loss {losses[-1]:.4f}, {rate:.2f} steps/s</div>')


rng = random.Random(SEED)
losses = []
view = display(HTML("starting…"), display_id=True)
t0 = time.perf_counter()
for step in range(1, STEPS + 1):
    match await train.step(**batch(rng)):
        case tg.Completed(loss=loss):
            losses.append(loss)
        case other:
            raise RuntimeError(f"step {step}: {other}")
    view.update(chart(losses, step / (time.perf_counter() - t0)))
recent = sum(losses[-5:]) / len(losses[-5:])
print(f"loss {losses[0]:.3f} -> {recent:.3f} (mean of the last 5) after {STEPS} steps "
      f"on {train.device.description}")

# %% [markdown]
# Greedy decoding of held-out sums: the model writes the sum's digits one at a time, each
# fed back before the next.

# %%
async def predict_sums(pairs):
    rows = [encode(a, b)[:T] for a, b in pairs]
    for row in rows:
        row[ANSWER_FROM + 1:] = [0] * (T - ANSWER_FROM - 1)
    digits = [[] for _ in rows]
    for k in range(3):
        match await predict.run(tokens=array.array("i", [t for row in rows for t in row])):
            case tg.Completed(output=output):
                out = memoryview(output).cast("B").cast("i")
            case other:
                raise RuntimeError(f"predict: {other}")
        for r, row in enumerate(rows):
            digit = out[r * T + ANSWER_FROM + k]
            digits[r].append(digit)
            if ANSWER_FROM + k + 1 < T:
                row[ANSWER_FROM + k + 1] = digit
    return [d[0] + 10 * d[1] + 100 * d[2] for d in digits]


sample = random.Random(0).sample(TEST_PAIRS, 200)
sums = await predict_sums(sample)
right = sum(s == a + b for s, (a, b) in zip(sums, sample))
rows = "".join(f"<tr><td>{a} + {b}</td><td>{s}</td><td>{'✓' if s == a + b else '✗'}</td></tr>"
               for s, (a, b) in list(zip(sums, sample))[:8])
display(HTML(f"<table><tr><th>held out</th><th>model</th><th></th></tr>{rows}</table>"))
print(f"held-out accuracy: {right}/{len(sample)} after {STEPS} steps")
