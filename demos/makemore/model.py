"""makemore: a character-level transformer that invents first names (the upstream makemore
sample), trained on the US census first names of PyPI `names==0.3.0`.

The addition sample's transformer at V = 27 (EOS = 0 starts and ends a name, a-z = 1..26),
SEQ 17 (T = 16): 3 pre-LayerNorm blocks, D = 64, 4 heads, bias-free Q/K/V/O, MLP 64→256→64
ReLU, learned positions, tied token embedding as the LM head, scores ×1/√16, causal softmax.
Batches of 32 names; the loss mask [32, 16] covers each name's letters and its end and is
normalized to sum 1; AdamW with lr linear 0.005 → 0.0005 over 1,500 steps, weight decay
0.01, clipping at 1. Names are sampled on the host from the logits. The data, batches and
training are demos/common/char_lm.py's. Pure Python, so it runs natively and in the browser
worker.
"""

from __future__ import annotations

import tensorgrad as tg

VOCAB, SEQ = 27, 17
T = SEQ - 1
EOS, LETTER = 0, 1  # the token that starts and ends a name; the token of 'a'
D, HEADS, LAYERS, HIDDEN = 64, 4, 3, 256
BATCH = 32


class Block(tg.Module):
    def __init__(self) -> None:
        self.ln1, self.ln2 = tg.LayerNorm(D), tg.LayerNorm(D)
        self.q, self.k = tg.Linear(D, D, bias=False), tg.Linear(D, D, bias=False)
        self.v, self.o = tg.Linear(D, D, bias=False), tg.Linear(D, D, bias=False)
        self.up, self.down = tg.Linear(D, HIDDEN), tg.Linear(HIDDEN, D)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        h = self.ln1(x)
        q, k, v = (tg.split_heads(f(h), HEADS) for f in (self.q, self.k, self.v))
        scores = (q @ tg.swap_axes(k, -1, -2)) * (1.0 / (D // HEADS) ** 0.5)
        x = x + self.o(tg.merge_heads(tg.softmax_causal(scores) @ v))
        return x + self.down(tg.relu(self.up(self.ln2(x))))


class CharTransformer(tg.Module):
    def __init__(self) -> None:
        self.tok_emb = self.param((VOCAB, D), init=tg.init.randn(0.02))
        self.pos_emb = self.param((SEQ, D), init=tg.init.randn(0.02))
        self.blocks = [Block() for _ in range(LAYERS)]
        self.ln_f = tg.LayerNorm(D)

    def forward(self, tokens: tg.Tensor) -> tg.Tensor:
        """tokens [B, T] i32 → logits [B, T, V]."""
        x = tg.embedding(self.tok_emb, tokens) + tg.narrow(self.pos_emb, 0, 0, tokens.shape[-1])
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ tg.swap_axes(self.tok_emb, 0, 1)


def loss_fn(model: CharTransformer, tokens: tg.Tensor, targets: tg.Tensor,
            mask: tg.Tensor) -> tg.Tensor:
    """Σ cross-entropy · mask (the mask sums to 1)."""
    return tg.sum(tg.cross_entropy(model(tokens), targets, reduction="none") * mask)


def logits_fn(model: CharTransformer, tokens: tg.Tensor) -> tg.Tensor:
    return model(tokens)


INPUTS = {"tokens": ((BATCH, T), "i32"), "targets": ((BATCH, T), "i32"), "mask": (BATCH, T)}
VAL_INPUTS = {"tokens": ((None, T), "i32"), "targets": ((None, T), "i32"), "mask": (None, T)}
LOGITS_INPUTS = {"tokens": ((None, T), "i32")}


def optimizer() -> tg.optim.AdamW:
    return tg.optim.AdamW(lr=tg.lr.linear(peak=0.005, final=0.0005, steps=1500),
                          weight_decay=0.01, clip_grad_norm=1.0)
