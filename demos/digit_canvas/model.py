"""An MLP 784→H→10 for MNIST digits (the upstream digit-canvas sample), H ∈ {32, 64, 128, 256}.

ReLU hidden layer, dropout 0.1 after it in the training forward only, softmax in predict;
cross-entropy; AdamW lr 1e-3 (the page offers 5e-4…5e-3), weight decay 0.01, clipping at 1;
batches of 64 digits (pixels 0..1). Pure Python, so it runs natively and in the worker.
"""

from __future__ import annotations

import tensorgrad as tg

BATCH = 64
PIXELS = 28 * 28
HIDDEN_SIZES = (32, 64, 128, 256)
DROPOUT = 0.1


class MLP(tg.Module):
    def __init__(self, hidden: int = 128) -> None:
        self.hidden = hidden
        self.fc1 = tg.Linear(PIXELS, hidden, init=tg.init.kaiming())
        self.fc2 = tg.Linear(hidden, 10, init=tg.init.kaiming(1.0))

    def forward(self, x: tg.Tensor, train: bool = False) -> tg.Tensor:
        """x [B, 784] → logits [B, 10]; dropout only when `train`."""
        h = tg.relu(self.fc1(x))
        if train:
            h = tg.dropout(h, DROPOUT)
        return self.fc2(h)


def loss_fn(model: MLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.cross_entropy(model(x, train=True), y)


def predict_fn(model: MLP, x: tg.Tensor) -> tg.Tensor:
    """Class probabilities [B, 10]."""
    return tg.softmax(model(x), -1)


INPUTS = {"x": (BATCH, PIXELS), "y": ((BATCH,), "i32")}
PREDICT_INPUTS = {"x": (None, PIXELS)}


def optimizer(lr: float = 1e-3) -> tg.optim.AdamW:
    return tg.optim.AdamW(lr=lr, weight_decay=0.01, clip_grad_norm=1.0)
