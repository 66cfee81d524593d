"""pokeformer: a small Llama-style transformer that invents Pokémon names (the upstream
pokeformer sample), trained on the 1,023 species names of npm `pokemon@3.3.1`.

2 blocks of RMSNorm → attention (bias-free Q/K/V/O, rotary embeddings on Q and K, no
position table, causal softmax, scores ×1/√16) → RMSNorm → ReLU MLP 64→256→64; tied token
embedding as the LM head; D = 64, 4 heads. V = 27: a-z = 0..25, EOS = 26 (which also starts
a name), T = 16. Batches of 32 names, loss mask normalized to sum 1; AdamW with lr linear
0.005 → 0.0005 over 1,500 steps, weight decay 0.01, clipping at 1. Sampling runs in the
graph: `categorical(logits / temperature)` as i32, with the temperature an input [1].
Pure Python, so it runs natively and in the browser worker.
"""

from __future__ import annotations

import math
import random
import zlib

import tensorgrad as tg

VOCAB, EOS, T = 27, 26, 16
D, HEADS, LAYERS, HIDDEN = 64, 4, 2, 256
BATCH = 32


class Block(tg.Module):
    def __init__(self) -> None:
        self.n1, self.n2 = tg.RMSNorm(D), tg.RMSNorm(D)
        self.q, self.k = tg.Linear(D, D, bias=False), tg.Linear(D, D, bias=False)
        self.v, self.o = tg.Linear(D, D, bias=False), tg.Linear(D, D, bias=False)
        self.up, self.down = tg.Linear(D, HIDDEN), tg.Linear(HIDDEN, D)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        h = self.n1(x)
        q, k = tg.rope(tg.split_heads(self.q(h), HEADS), tg.split_heads(self.k(h), HEADS))
        v = tg.split_heads(self.v(h), HEADS)
        scores = (q @ tg.swap_axes(k, -1, -2)) * (1.0 / (D // HEADS) ** 0.5)
        x = x + self.o(tg.merge_heads(tg.softmax_causal(scores) @ v))
        return x + self.down(tg.relu(self.up(self.n2(x))))


class Pokeformer(tg.Module):
    def __init__(self) -> None:
        self.tok_emb = self.param((VOCAB, D), init=tg.init.randn(0.02))
        self.blocks = [Block() for _ in range(LAYERS)]
        self.norm = tg.RMSNorm(D)

    def forward(self, tokens: tg.Tensor) -> tg.Tensor:
        x = tg.embedding(self.tok_emb, tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ tg.swap_axes(self.tok_emb, 0, 1)


def loss_fn(model: Pokeformer, tokens: tg.Tensor, targets: tg.Tensor,
            mask: tg.Tensor) -> tg.Tensor:
    return tg.sum(tg.cross_entropy(model(tokens), targets, reduction="none") * mask)


def sample_fn(model: Pokeformer, tokens: tg.Tensor, temperature: tg.Tensor) -> tg.Tensor:
    """The next character at every position, sampled in the graph: [B, T] i32."""
    return tg.categorical(model(tokens) / temperature)


INPUTS = {"tokens": ((BATCH, T), "i32"), "targets": ((BATCH, T), "i32"), "mask": (BATCH, T)}
VAL_INPUTS = {"tokens": ((None, T), "i32"), "targets": ((None, T), "i32"), "mask": (None, T)}
SAMPLE_INPUTS = {"tokens": ((None, T), "i32"), "temperature": (1,)}
SAMPLE_OUTPUT = "i32"


def optimizer() -> tg.optim.AdamW:
    return tg.optim.AdamW(lr=tg.lr.linear(peak=0.005, final=0.0005, steps=1500),
                          weight_decay=0.01, clip_grad_norm=1.0)


def clean(words: list[str]) -> list[str]:
    return [w for w in words if w.isascii() and w.isalpha() and len(w) <= T - 1]


def split(words: list[str]) -> tuple[list[str], list[str]]:
    """(train, val): held out when crc32(name) % 10 == 0 (about 10%)."""
    val = [w for w in words if zlib.crc32(w.encode()) % 10 == 0]
    return [w for w in words if zlib.crc32(w.encode()) % 10 != 0], val


def encode(word: str) -> list[int]:
    return [EOS] + [ord(c) - 97 for c in word] + [EOS] * (T - len(word))


def batch(words: list[str]) -> dict:
    tokens, targets, mask = [], [], []
    for w in words:
        seq = encode(w)
        tokens += seq[:T]
        targets += seq[1:T + 1]
        mask += [1.0 if t <= len(w) else 0.0 for t in range(T)]
    total = sum(mask)
    return {"tokens": tokens, "targets": targets, "mask": [m / total for m in mask]}


def unigram_loss(train: list[str], val: list[str]) -> float:
    counts = [1.0] * VOCAB
    for w in train:
        for c in encode(w)[1:len(w) + 2]:
            counts[c] += 1
    total = sum(counts)
    seq = [c for w in val for c in encode(w)[1:len(w) + 2]]
    return -sum(math.log(counts[c] / total) for c in seq) / len(seq)


async def sample(sample_run, n: int, rng: random.Random, temperature: float = 1.0
                 ) -> list[str]:
    """n names: the in-graph sampler run once per character (`rng` is unused: the graph's
    PRNG draws)."""
    rows = [[EOS] * T for _ in range(n)]
    done = [False] * n
    for pos in range(T - 1):
        res = await sample_run(tokens=[t for r in rows for t in r], temperature=[temperature])
        if res.kind != "completed":
            raise RuntimeError(f"sample: {res.kind} {getattr(res, 'error', '')}")
        o = res.output
        ids = o.reshape(-1).tolist() if hasattr(o, "reshape") else memoryview(o).cast("B").cast("i").tolist()
        for i in range(n):
            if not done[i]:
                c = ids[i * T + pos]
                done[i] = c == EOS
                rows[i][pos + 1] = c
        if all(done):
            break
    names = []
    for row in rows:
        letters = row[1:]
        end = letters.index(EOS) if EOS in letters else len(letters)
        names.append("".join(chr(97 + c) for c in letters[:end]))
    return names
