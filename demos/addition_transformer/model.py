"""A 3-layer transformer learning 2-digit addition (the upstream tensorgrad sample).

Sequence: a1 a0 + b1 b0 = s0 s1 s2 (digits of the sum reversed); vocab 12 ('+'=10, '='=11).
The model reads the first 8 tokens and predicts the next token at every position; the loss
counts only the three answer positions. Pairs with ((100a + b)·31 + 7) % 5 == 0 are held out.
Pure Python (no numpy), so the same file runs natively and in the browser worker.
"""

from __future__ import annotations

import array
import random

import tensorgrad as tg

VOCAB, PLUS, EQUALS = 12, 10, 11
SEQ = 9           # tokens per example
T = SEQ - 1       # model input length
D, HEADS, LAYERS, HIDDEN = 64, 4, 3, 256
BATCH = 128
ANSWER_FROM = 5   # input positions 5, 6, 7 predict s0, s1, s2


class Block(tg.Module):
    def __init__(self) -> None:
        self.ln1 = tg.LayerNorm(D)
        self.q = tg.Linear(D, D, bias=False)
        self.k = tg.Linear(D, D, bias=False)
        self.v = tg.Linear(D, D, bias=False)
        self.o = tg.Linear(D, D, bias=False)
        self.ln2 = tg.LayerNorm(D)
        self.up = tg.Linear(D, HIDDEN)
        self.down = tg.Linear(HIDDEN, D)

    def forward(self, x: tg.Tensor, i: int) -> tg.Tensor:
        h = self.ln1(x)
        q = tg.split_heads(self.q(h), HEADS)
        k = tg.split_heads(self.k(h), HEADS)
        v = tg.split_heads(self.v(h), HEADS)
        scores = (q @ tg.swap_axes(k, -1, -2)) * (1.0 / (D // HEADS) ** 0.5)
        attn = tg.capture(f"attn.{i}", tg.softmax_causal(scores))
        x = x + self.o(tg.merge_heads(attn @ v))
        x = x + self.down(tg.relu(self.up(self.ln2(x))))
        return tg.capture(f"residual.{i}", x)


class AdditionTransformer(tg.Module):
    def __init__(self) -> None:
        self.tok_emb = self.param((VOCAB, D), init=tg.init.randn(0.02))
        self.pos_emb = self.param((SEQ, D), init=tg.init.randn(0.02))
        self.blocks = [Block() for _ in range(LAYERS)]
        self.ln_f = tg.LayerNorm(D)

    def forward(self, tokens: tg.Tensor) -> tg.Tensor:
        """tokens [B, T] i32 -> logits [B, T, VOCAB]."""
        t = tokens.shape[-1]
        x = tg.embedding(self.tok_emb, tokens) + tg.narrow(self.pos_emb, 0, 0, t)
        for i, block in enumerate(self.blocks):
            x = block(x, i)
        return self.ln_f(x) @ tg.swap_axes(self.tok_emb, 0, 1)  # tied LM head


def loss_fn(model: AdditionTransformer, tokens: tg.Tensor, targets: tg.Tensor,
            mask: tg.Tensor) -> tg.Tensor:
    """Mean cross-entropy over the answer positions."""
    ce = tg.cross_entropy(model(tokens), targets, reduction="none")   # [B, T]
    return tg.sum(ce * mask) * (1.0 / (tokens.shape[0] * (T - ANSWER_FROM)))


def predict_fn(model: AdditionTransformer, tokens: tg.Tensor) -> tg.Tensor:
    """Greedy next digit at every position: [B, T] i32 (the argmax over the ten digits
    only: an answer is digits, whatever an untrained model scores '+' or '=')."""
    return tg.argmax(tg.narrow(model(tokens), -1, 0, 10), -1)


INPUTS = {"tokens": ((BATCH, T), "i32"), "targets": ((BATCH, T), "i32"), "mask": (T,)}
PREDICT_INPUTS = {"tokens": ((None, T), "i32")}


def optimizer() -> tg.optim.AdamW:
    return tg.optim.AdamW(lr=tg.lr.linear(peak=0.005, final=0.0005, steps=1500),
                          weight_decay=0.01, clip_grad_norm=1.0)


def encode(a: int, b: int) -> list[int]:
    s = a + b
    return [a // 10, a % 10, PLUS, b // 10, b % 10, EQUALS, s % 10, (s // 10) % 10, s // 100]


def is_test_pair(a: int, b: int) -> bool:
    return ((100 * a + b) * 31 + 7) % 5 == 0


TRAIN_PAIRS = [(a, b) for a in range(100) for b in range(100) if not is_test_pair(a, b)]
TEST_PAIRS = [(a, b) for a in range(100) for b in range(100) if is_test_pair(a, b)]


def answer_mask() -> array.array:
    return array.array("f", [1.0 if t >= ANSWER_FROM else 0.0 for t in range(T)])


def batch(rng: random.Random, pairs: list[tuple[int, int]] = TRAIN_PAIRS,
          size: int = BATCH) -> dict[str, array.array]:
    """{tokens, targets, mask} for `size` random pairs."""
    tokens, targets = array.array("i"), array.array("i")
    for _ in range(size):
        seq = encode(*rng.choice(pairs))
        tokens.extend(seq[:-1])
        targets.extend(seq[1:])
    return {"tokens": tokens, "targets": targets, "mask": answer_mask()}


def _flat_ints(output: object) -> list[int]:
    if hasattr(output, "reshape"):  # a numpy array (a memoryview has tolist, not reshape)
        return [int(v) for v in output.reshape(-1).tolist()]  # type: ignore[attr-defined]
    return list(memoryview(output).cast("B").cast("i"))  # type: ignore[arg-type]


async def predict_digits(predict: tg.Forward, pairs: list[tuple[int, int]]
                         ) -> list[list[int]]:
    """The three answer digits of each pair (s0, s1, s2: the sum's digits reversed), by
    greedy decoding in 3 runs: each predicted digit is fed back before the next one (the
    model is causal, so the unknown later positions do not matter)."""
    rows = [encode(a, b)[:T] for a, b in pairs]
    for row in rows:
        row[ANSWER_FROM + 1:] = [0] * (T - ANSWER_FROM - 1)
    digits: list[list[int]] = [[] for _ in rows]
    for k in range(3):
        result = await predict.run(tokens=array.array("i", [t for row in rows for t in row]))
        if result.kind != "completed":
            raise RuntimeError(f"predict failed: {result}")
        out = _flat_ints(result.output)
        for r, row in enumerate(rows):
            digit = out[r * T + ANSWER_FROM + k]
            digits[r].append(digit)
            if ANSWER_FROM + k + 1 < T:
                row[ANSWER_FROM + k + 1] = digit
    return digits


async def predict_sums(predict: tg.Forward, pairs: list[tuple[int, int]]) -> list[int]:
    """The sum the model writes for each pair (greedy decoding)."""
    return [d[0] + 10 * d[1] + 100 * d[2] for d in await predict_digits(predict, pairs)]


async def accuracy(predict: tg.Forward, pairs: list[tuple[int, int]]) -> float:
    """Fraction of `pairs` whose sum the model writes correctly."""
    sums = await predict_sums(predict, pairs)
    return sum(s == a + b for s, (a, b) in zip(sums, pairs)) / len(pairs)
