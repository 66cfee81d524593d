"""A small CNN classifying MNIST digits (the upstream mnist-cnn sample).

conv 3x3 1→16 (pad 1) + ReLU + 2x2 max-pool → conv 3x3 16→32 (pad 1) + ReLU + 2x2 max-pool →
flatten (32·7·7 = 1568) → Linear 64 + ReLU → Linear 10; cross-entropy; AdamW lr 1e-3,
weight decay 0.01, gradient clipping at norm 1; batches of 64 digits (pixels 0..1).
The flatten uses the batch size of its input (upstream hard-codes 64, which breaks its own
B=256 evaluation graph). Kaiming init throughout (small N(0, 0.02) weights train far
slower here: 80% vs 86% held-out accuracy after 50-100 steps). Pure Python, so it runs
natively and in the browser worker.
"""

from __future__ import annotations

import tensorgrad as tg

BATCH = 64
SIDE = 28


class CNN(tg.Module):
    def __init__(self) -> None:
        self.conv1 = tg.Conv2d(1, 16, 3, padding=1, init=tg.init.kaiming())
        self.conv2 = tg.Conv2d(16, 32, 3, padding=1, init=tg.init.kaiming())
        self.fc1 = tg.Linear(32 * 7 * 7, 64, init=tg.init.kaiming())
        self.fc2 = tg.Linear(64, 10, init=tg.init.kaiming(1.0))

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        """x [B, 1, 28, 28] → logits [B, 10]."""
        h = tg.max_pool2d(tg.relu(self.conv1(x)), 2)
        h = tg.max_pool2d(tg.relu(self.conv2(h)), 2)
        h = tg.reshape(h, (x.shape[0], -1))
        return self.fc2(tg.relu(self.fc1(h)))


def loss_fn(model: CNN, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.cross_entropy(model(x), y)


def predict_fn(model: CNN, x: tg.Tensor) -> tg.Tensor:
    """The predicted class of each digit: [B] i32."""
    return tg.argmax(model(x), -1)


INPUTS = {"x": (BATCH, 1, SIDE, SIDE), "y": ((BATCH,), "i32")}
PREDICT_INPUTS = {"x": (None, 1, SIDE, SIDE)}


def optimizer() -> tg.optim.AdamW:
    return tg.optim.AdamW(lr=1e-3, weight_decay=0.01, clip_grad_norm=1.0)
