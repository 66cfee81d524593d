"""Layer modules: Linear, LayerNorm, RMSNorm, Embedding, Conv2d.

Layouts follow the TypeScript library: `Linear.W` is ``[in, out]`` (``y = x @ W + b``; the
transpose of PyTorch's layout), `Conv2d.W` is ``[out, in/groups, kH, kW]`` (NCHW, as PyTorch).
Weights default to ``init.randn(0.02)`` with weight decay; biases to zeros without decay;
norm gains to ones without decay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import init as _init
from .errors import ShapeError
from .module import Module
from .ops.conv import conv2d
from .ops.index import embedding
from .ops.linalg import matmul
from .ops.norm import layer_norm, rms_norm
from .ops.shape import reshape
from .tensor import Tensor

__all__ = ["Conv2d", "Embedding", "LayerNorm", "Linear", "RMSNorm"]


def _positive(layer: str, what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ShapeError(layer, f"{what} must be a positive int, got {value!r}")
    return value


def _pair(layer: str, what: str, value: int | Sequence[int], minimum: int) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum
                             for v in pair):
        raise ShapeError(layer, f"{what} must be an int ≥ {minimum} or a pair of them, "
                         f"got {value!r}")
    return pair


class Linear(Module):
    """``y = x @ W + b``; x ``[..., in]`` → ``[..., out]``. W ``[in, out]``, b ``[out]``.

    init/decay apply to W (default randn(0.02), decay on); b is zeros, no decay."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 init: _init.InitSpec | None = None, decay: bool | None = None):
        self.in_features = _positive("Linear", "in_features", in_features)
        self.out_features = _positive("Linear", "out_features", out_features)
        self.W = self.param((in_features, out_features), init=init, decay=decay,
                            fan_in=in_features)
        self.b = self.param((out_features,), init=_init.zeros()) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """``x @ W + b`` (``x @ W`` without a bias)."""
        y = matmul(x, self.W)
        return y if self.b is None else y + self.b


class LayerNorm(Module):
    """Normalize over the last axis (biased variance): ``(x - m) / sqrt(v + eps) * g + b``.

    g ``[d]`` ones, b ``[d]`` zeros (or none); `decay` (default off) applies to both."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, decay: bool = False):
        self.dim = _positive("LayerNorm", "dim", dim)
        self.eps = float(eps)
        self.g = self.param((dim,), init=_init.ones(), decay=decay)
        self.b = self.param((dim,), init=_init.zeros(), decay=decay) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """``tg.layer_norm(x, g, b, eps)`` over the last axis."""
        return layer_norm(x, self.g, self.b, self.eps)


class RMSNorm(Module):
    """``x / sqrt(mean(x²) + eps) * g`` over the last axis; g ``[d]`` ones, no decay."""

    def __init__(self, dim: int, eps: float = 1e-6, decay: bool = False):
        self.dim = _positive("RMSNorm", "dim", dim)
        self.eps = float(eps)
        self.g = self.param((dim,), init=_init.ones(), decay=decay)

    def forward(self, x: Tensor) -> Tensor:
        """``tg.rms_norm(x, g, eps)`` over the last axis."""
        return rms_norm(x, self.g, self.eps)


class Embedding(Module):
    """Rows of W ``[vocab, dim]`` picked by i32 indices: ``[...]`` → ``[..., dim]``.

    An out-of-range index gives a zero row. init/decay apply to W (randn(0.02), decay on)."""

    def __init__(self, vocab: int, dim: int, init: _init.InitSpec | None = None,
                 decay: bool | None = None):
        self.vocab = _positive("Embedding", "vocab", vocab)
        self.dim = _positive("Embedding", "dim", dim)
        self.W = self.param((vocab, dim), init=init, decay=decay, fan_in=vocab)

    def forward(self, idx: Tensor) -> Tensor:
        """The rows of W that the i32 `idx` picks: ``[...]`` → ``[..., dim]``."""
        return embedding(self.W, idx)


class Conv2d(Module):
    """2-D convolution, NCHW: x ``[B, in, H, W]`` → ``[B, out, Ho, Wo]``.

    W ``[out, in/groups, kH, kW]`` (init/decay apply to it; kaiming uses fan_in
    ``in/groups·kH·kW``), b ``[out]`` zeros. kernel_size, stride, padding: int or (h, w)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
                 groups: int = 1, bias: bool = True, init: _init.InitSpec | None = None,
                 decay: bool | None = None):
        self.in_channels = _positive("Conv2d", "in_channels", in_channels)
        self.out_channels = _positive("Conv2d", "out_channels", out_channels)
        self.kernel_size = _pair("Conv2d", "kernel_size", kernel_size, 1)
        self.stride = _pair("Conv2d", "stride", stride, 1)
        self.padding = _pair("Conv2d", "padding", padding, 0)
        self.groups = _positive("Conv2d", "groups", groups)
        if in_channels % groups or out_channels % groups:
            raise ShapeError("Conv2d", f"groups={groups} must divide both in_channels="
                             f"{in_channels} and out_channels={out_channels}")
        kh, kw = self.kernel_size
        per_group = in_channels // groups
        self.W = self.param((out_channels, per_group, kh, kw), init=init, decay=decay,
                            fan_in=per_group * kh * kw)
        self.b = self.param((out_channels,), init=_init.zeros()) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """``tg.conv2d(x, W, stride, padding, groups)`` plus the bias per channel."""
        y = conv2d(x, self.W, stride=self.stride, padding=self.padding, groups=self.groups)
        if self.b is None:
            return y
        return y + reshape(self.b, (1, self.out_channels, 1, 1))
