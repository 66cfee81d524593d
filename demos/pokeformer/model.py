"""pokeformer: a small Llama-style transformer that invents Pokémon names (the upstream
pokeformer sample), trained on the 1,023 species names of npm `pokemon@3.3.1`.

2 blocks of RMSNorm → attention (bias-free Q/K/V/O, rotary embeddings on Q and K, no
position table, causal softmax, scores ×1/√16) → RMSNorm → ReLU MLP 64→256→64; tied token
embedding as the LM head; D = 64, 4 heads. V = 27: a-z = 0..25, EOS = 26 (which also starts
a name), T = 16. Batches of 32 names, loss mask normalized to sum 1; AdamW with lr linear
0.005 → 0.0005 over 1,500 steps, weight decay 0.01, clipping at 1. Sampling runs in the
graph: `categorical(logits / temperature)` as i32, with the temperature an input [1].
The data, batches and training are demos/common/char_lm.py's. Pure Python, so it runs
natively and in the browser worker.
"""

from __future__ import annotations

import tensorgrad as tg

VOCAB, EOS, T = 27, 26, 16
LETTER = 0  # the token of 'a'
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


def optimizer() -> tg.optim.AdamW:
    return tg.optim.AdamW(lr=tg.lr.linear(peak=0.005, final=0.0005, steps=1500),
                          weight_decay=0.01, clip_grad_norm=1.0)
