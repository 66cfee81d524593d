"""PyTorch twins of the models in bench/models.py: the same layers, loss and optimizer
(Adam / AdamW with the same hyper-parameters, weight decay on the same params — weights of
Linear, Embedding and Conv2d, not biases or norm gains — and global gradient-norm clipping
where tensorgrad clips). Only the speed is compared, so the init is PyTorch's own and an LR
schedule (the addition transformer's linear decay) runs at its peak.

Imported only when torch is; nothing here runs at import time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(1, 64), nn.Linear(64, 64), nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


class AddBlock(nn.Module):
    """The addition transformer's block: pre-LN, bias-free q/k/v/o, ReLU MLP."""

    def __init__(self, d: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.o(_causal_attention(self.q(h), self.k(h), self.v(h), self.heads))
        return x + self.down(torch.relu(self.up(self.ln2(x))))


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      heads: int) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d) + causal mask) v, written out as tensorgrad computes it (no
    fused SDPA kernel: the same math, op for op)."""
    b, t, d = q.shape
    q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d // heads))
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    attn = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    return (attn @ v).transpose(1, 2).reshape(b, t, d)


class AdditionTransformer(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, hidden: int,
                 seq: int) -> None:
        super().__init__()
        self.tok_emb = nn.Parameter(torch.randn(vocab, d) * 0.02)
        self.pos_emb = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(AddBlock(d, heads, hidden) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb[tokens] + self.pos_emb[: tokens.shape[-1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.tok_emb.t()   # tied LM head


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.proj(_causal_attention(self.q(h), self.k(h), self.v(h), self.heads))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, c: Any) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(c.vocab, c.d), nn.Embedding(c.t, c.d)
        self.blocks = nn.ModuleList(GPTBlock(c.d, c.heads) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d)
        self.head = nn.Linear(c.d, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(32 * 7 * 7, 64), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = F.max_pool2d(torch.relu(self.conv2(h)), 2)
        return self.fc2(torch.relu(self.fc1(h.reshape(x.shape[0], -1))))


@dataclass
class TorchBench:
    """A twin: the module, its loss of (module, **batch tensors), its optimizer, clipping,
    and how to turn a host batch (the tensorgrad bench's) into tensors."""

    model: nn.Module
    loss: Callable[..., torch.Tensor]
    optimizer: torch.optim.Optimizer
    clip: float | None
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]
    # Mixed precision (report.py --precision mixed): (autocast device type, its dtype, a
    # GradScaler or None): float16 with a GradScaler on CUDA, bfloat16 on a CPU.
    amp: tuple[str, torch.dtype, Any] | None = None


def _decay_groups(model: nn.Module, wd: float) -> list[dict[str, Any]]:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def make_torch_bench(name: str, config: dict[str, Any], device: torch.device,
                     amp: bool = False) -> TorchBench:
    """The twin of bench model `name` (mlp | transformer | gpt | gpt2 | cnn) on `device`;
    `amp`: trained under torch.autocast (float16 and a GradScaler with GradScaler's defaults
    on CUDA, as tensorgrad's precision="mixed"; bfloat16 without one on a CPU)."""
    tb = _make_torch_bench(name, config, device)
    if amp:
        cuda = device.type == "cuda"
        tb.amp = (device.type, torch.float16 if cuda else torch.bfloat16,
                  torch.amp.GradScaler("cuda") if cuda else None)
    return tb


def _make_torch_bench(name: str, config: dict[str, Any], device: torch.device) -> TorchBench:
    f32, i64 = torch.float32, torch.int64
    if name == "mlp":
        model = MLP().to(device)
        b = config["batch"]
        return TorchBench(model, lambda m, x, y: torch.mean(torch.square(m(x) - y)),
                          torch.optim.Adam(model.parameters(), lr=5e-3), None,
                          {"x": ((b, 1), f32), "y": ((b, 1), f32)})
    if name == "transformer":
        c = config
        model = AdditionTransformer(c["vocab"], c["d"], c["heads"], c["layers"], c["hidden"],
                                    c["seq"]).to(device)
        scale = 1.0 / (c["batch"] * (c["t"] - c["answer_from"]))

        def loss(m: nn.Module, tokens: torch.Tensor, targets: torch.Tensor,
                 mask: torch.Tensor) -> torch.Tensor:
            logits = m(tokens)
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                 reduction="none").view(targets.shape)
            return torch.sum(ce * mask) * scale

        bt = (c["batch"], c["t"])
        return TorchBench(model, loss,
                          torch.optim.AdamW(_decay_groups(model, 0.01), lr=0.005), 1.0,
                          {"tokens": (bt, i64), "targets": (bt, i64), "mask": ((c["t"],), f32)})
    if name in ("gpt", "gpt2"):
        c = config["gpt"]
        model = GPT(c).to(device)

        def loss(m: nn.Module, tokens: torch.Tensor, positions: torch.Tensor,
                 targets: torch.Tensor) -> torch.Tensor:
            logits = m(tokens, positions)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

        bt = (c.batch, c.t)
        return TorchBench(model, loss,
                          torch.optim.AdamW(_decay_groups(model, c.weight_decay), lr=c.lr),
                          c.clip, {"tokens": (bt, i64), "positions": ((c.t,), i64),
                                   "targets": (bt, i64)})
    if name == "cnn":
        model = CNN().to(device)
        b, side = config["batch"], config["side"]
        return TorchBench(model, lambda m, x, y: F.cross_entropy(m(x), y),
                          torch.optim.AdamW(_decay_groups(model, 0.01), lr=1e-3), 1.0,
                          {"x": ((b, 1, side, side), f32), "y": ((b,), i64)})
    raise KeyError(f"no torch twin for {name!r}")


def host_tensors(tb: TorchBench, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The host batch (array.array buffers) as CPU tensors of the twin's shapes/dtypes."""
    out = {}
    for name, (shape, dtype) in tb.shapes.items():
        src = torch.frombuffer(bytearray(memoryview(batch[name]).cast("B")),
                               dtype=torch.int32 if dtype == torch.int64 else torch.float32)
        out[name] = src.to(dtype).reshape(shape)
        if torch.cuda.is_available():
            out[name] = out[name].pin_memory()
    return out


def train_step(tb: TorchBench, model: Callable[..., Any], batch: dict[str, torch.Tensor],
               device: torch.device) -> float:
    """One step as tensorgrad's: upload the host batch, forward, backward, clip, update,
    read the loss back (a sync)."""
    feeds = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if tb.amp is None:
        loss = tb.loss(model, **feeds)
        loss.backward()
        if tb.clip is not None:
            torch.nn.utils.clip_grad_norm_(tb.model.parameters(), tb.clip)
        tb.optimizer.step()
    else:
        kind, dtype, scaler = tb.amp
        with torch.autocast(kind, dtype=dtype):
            loss = tb.loss(model, **feeds)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(tb.optimizer)
        if tb.clip is not None:
            torch.nn.utils.clip_grad_norm_(tb.model.parameters(), tb.clip)
        if scaler:
            scaler.step(tb.optimizer)
            scaler.update()
        else:
            tb.optimizer.step()
    tb.optimizer.zero_grad(set_to_none=True)
    return float(loss.item())
