"""The models bench/report.py measures: the MLP, the addition transformer and the CNN of the
demos, and a GPT (decoder-only transformer) defined here, each with its loss, inputs,
optimizer and a few host batches. Their PyTorch twins are in bench/torch_models.py.

Pure Python (no numpy): batches are ``array.array`` buffers, as the demos make them.
"""

from __future__ import annotations

import array
import importlib.util
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tensorgrad as tg

# ----------------------------------------------------------------------------- GPT


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the GPT: width, layers, heads, context, batch, vocabulary (~65 characters,
    as tiny-shakespeare's), and the AdamW settings."""

    d: int = 256
    layers: int = 6
    heads: int = 4
    t: int = 64
    batch: int = 64
    vocab: int = 65
    lr: float = 3e-4
    weight_decay: float = 0.1
    clip: float = 1.0

    @property
    def hidden(self) -> int:
        return 4 * self.d


GPT_FULL = GPTConfig()
GPT_TINY = GPTConfig(d=64, layers=2, heads=4, t=16, batch=8)  # --quick
# GPT-2 small's shape (untied head: 162M params), GPT-2's vocabulary padded to 50,304
GPT2_SMALL = GPTConfig(d=768, layers=12, heads=12, t=256, batch=32, vocab=50304)


class GPTBlock(tg.Module):
    """Pre-LayerNorm block: causal multi-head self-attention, then a GELU MLP (4·D)."""

    def __init__(self, c: GPTConfig) -> None:
        self.c = c
        self.ln1 = tg.LayerNorm(c.d)
        self.q = tg.Linear(c.d, c.d)
        self.k = tg.Linear(c.d, c.d)
        self.v = tg.Linear(c.d, c.d)
        self.proj = tg.Linear(c.d, c.d)
        self.ln2 = tg.LayerNorm(c.d)
        self.up = tg.Linear(c.d, c.hidden)
        self.down = tg.Linear(c.hidden, c.d)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        c = self.c
        h = self.ln1(x)
        q = tg.split_heads(self.q(h), c.heads)       # [B, H, T, d]
        k = tg.split_heads(self.k(h), c.heads)
        v = tg.split_heads(self.v(h), c.heads)
        x = x + self.proj(tg.merge_heads(tg.scaled_dot_product_attention(q, k, v, is_causal=True)))
        return x + self.down(tg.gelu(self.up(self.ln2(x))))


class GPT(tg.Module):
    """Token + learned position embeddings, `layers` blocks, final LayerNorm, LM head."""

    def __init__(self, c: GPTConfig = GPT_FULL) -> None:
        self.c = c
        self.tok = tg.Embedding(c.vocab, c.d)
        self.pos = tg.Embedding(c.t, c.d)
        self.blocks = [GPTBlock(c) for _ in range(c.layers)]
        self.ln_f = tg.LayerNorm(c.d)
        self.head = tg.Linear(c.d, c.vocab, bias=False)

    def forward(self, tokens: tg.Tensor, positions: tg.Tensor) -> tg.Tensor:
        """tokens [B, T] i32, positions [T] i32 (0..T-1) -> logits [B, T, vocab]."""
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt_loss(model: GPT, tokens: tg.Tensor, positions: tg.Tensor,
             targets: tg.Tensor) -> tg.Tensor:
    """Mean next-token cross-entropy over every position."""
    return tg.cross_entropy(model(tokens, positions), targets)


def gpt_batch(rng: random.Random, c: GPTConfig) -> dict[str, array.array]:
    """A random character stream cut into B windows of T + 1 (inputs, shifted targets)."""
    tokens, targets = array.array("i"), array.array("i")
    for _ in range(c.batch):
        seq = [rng.randrange(c.vocab) for _ in range(c.t + 1)]
        tokens.extend(seq[:-1])
        targets.extend(seq[1:])
    return {"tokens": tokens, "positions": array.array("i", range(c.t)), "targets": targets}


# ----------------------------------------------------------------------------- registry


def load_demo(name: str) -> ModuleType:
    """demos/NAME/model.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"bench_demo_{name}",
                                                  ROOT / "demos" / name / "model.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Bench:
    """One model to measure: what tg.compile takes, host batches, and a note on its sizes."""

    name: str
    model: tg.Module
    loss: Callable[..., Any]
    inputs: dict[str, Any]
    optimizer: Any
    batches: list[dict[str, Any]]
    sizes: str
    config: dict[str, Any] = field(default_factory=dict)  # what the torch twin needs


def _mlp(rng: random.Random, quick: bool) -> Bench:
    demo = load_demo("mlp_sin")
    return Bench("mlp", demo.MLP(), demo.loss_fn, demo.INPUTS, demo.optimizer(),
                 [demo.batch(rng) for _ in range(8)], f"1-64-64-1, B={demo.BATCH}, Adam",
                 {"batch": demo.BATCH})


def _transformer(rng: random.Random, quick: bool) -> Bench:
    demo = load_demo("addition_transformer")
    return Bench("transformer", demo.AdditionTransformer(), demo.loss_fn, demo.INPUTS,
                 demo.optimizer(), [demo.batch(rng) for _ in range(8)],
                 f"D={demo.D} L={demo.LAYERS} H={demo.HEADS} T={demo.T} B={demo.BATCH}, AdamW",
                 {"vocab": demo.VOCAB, "d": demo.D, "heads": demo.HEADS, "layers": demo.LAYERS,
                  "hidden": demo.HIDDEN, "seq": demo.SEQ, "t": demo.T, "batch": demo.BATCH,
                  "answer_from": demo.ANSWER_FROM})


def _gpt(rng: random.Random, quick: bool, full: GPTConfig = GPT_FULL,
         name: str = "gpt") -> Bench:
    c = GPT_TINY if quick else full
    opt = tg.optim.AdamW(lr=c.lr, weight_decay=c.weight_decay, clip_grad_norm=c.clip)
    inputs = {"tokens": ((c.batch, c.t), "i32"), "positions": ((c.t,), "i32"),
              "targets": ((c.batch, c.t), "i32")}
    return Bench(name, GPT(c), gpt_loss, inputs, opt, [gpt_batch(rng, c) for _ in range(4)],
                 f"D={c.d} L={c.layers} H={c.heads} T={c.t} B={c.batch} V={c.vocab}, AdamW",
                 {"gpt": c})


def _cnn(rng: random.Random, quick: bool) -> Bench:
    demo = load_demo("mnist_cnn")
    n = demo.BATCH * demo.SIDE * demo.SIDE
    batches = [{"x": array.array("f", [rng.random() for _ in range(n)]),
                "y": array.array("i", [rng.randrange(10) for _ in range(demo.BATCH)])}
               for _ in range(4)]
    return Bench("cnn", demo.CNN(), demo.loss_fn, demo.INPUTS, demo.optimizer(), batches,
                 f"2 conv + 2 fc, 28x28, B={demo.BATCH}, AdamW",
                 {"batch": demo.BATCH, "side": demo.SIDE})


def _gpt2(rng: random.Random, quick: bool) -> Bench:
    return _gpt(rng, quick, GPT2_SMALL, "gpt2")


BUILDERS: dict[str, Callable[[random.Random, bool], Bench]] = {
    "mlp": _mlp, "transformer": _transformer, "gpt": _gpt, "cnn": _cnn, "gpt2": _gpt2}
ALIASES = {"mlp_sin": "mlp", "addition_transformer": "transformer", "mnist_cnn": "cnn"}


def make_bench(name: str, seed: int = 0, quick: bool = False) -> Bench:
    """The :class:`Bench` of model `name` (mlp | transformer | gpt | cnn | gpt2, or a demo
    name); `quick` shrinks the GPTs (the demo models have fixed sizes)."""
    key = ALIASES.get(name, name)
    if key not in BUILDERS:
        raise KeyError(f"unknown model {name!r}: choose from {sorted(BUILDERS)}")
    return BUILDERS[key](random.Random(seed), quick)
