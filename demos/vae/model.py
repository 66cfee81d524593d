"""A variational autoencoder of MNIST digits (the upstream vae sample).

Encoder 784→256→256 (ReLU) → μ and log σ² of an 8-d latent; decoder 8→256→256 (ReLU) →784
(sigmoid). z = μ + σ·ε with ε from the graph's own `randn`. Loss per batch of 128 digits
(pixels 0..1): Σ‖x̂ − x‖² / B + KL(q(z|x) ‖ N(0, I)) / B (β = 1); Adam lr 1e-3, clipping at 1.
Pure Python, so it runs natively and in the browser worker.
"""

from __future__ import annotations

import tensorgrad as tg

BATCH, PIXELS, LATENT, HIDDEN = 128, 784, 8, 256


class VAE(tg.Module):
    def __init__(self) -> None:
        k = tg.init.kaiming
        self.e1, self.e2 = tg.Linear(PIXELS, HIDDEN, init=k()), tg.Linear(HIDDEN, HIDDEN, init=k())
        self.mu, self.logvar = tg.Linear(HIDDEN, LATENT), tg.Linear(HIDDEN, LATENT)
        self.d1, self.d2 = tg.Linear(LATENT, HIDDEN, init=k()), tg.Linear(HIDDEN, HIDDEN, init=k())
        self.d3 = tg.Linear(HIDDEN, PIXELS, init=k(1.0))

    def encode(self, x: tg.Tensor) -> tuple[tg.Tensor, tg.Tensor]:
        h = tg.relu(self.e2(tg.relu(self.e1(x))))
        return self.mu(h), self.logvar(h)

    def decode(self, z: tg.Tensor) -> tg.Tensor:
        return tg.sigmoid(self.d3(tg.relu(self.d2(tg.relu(self.d1(z))))))


def loss_fn(model: VAE, x: tg.Tensor) -> tg.Tensor:
    mu, logvar = model.encode(x)
    z = mu + tg.exp(logvar * 0.5) * tg.randn((x.shape[0], LATENT))
    recon = tg.sum(tg.square(model.decode(z) - x))
    kl = -0.5 * tg.sum(1.0 + logvar - mu * mu - tg.exp(logvar))
    return (recon + kl) * (1.0 / x.shape[0])


def reconstruct_fn(model: VAE, x: tg.Tensor) -> tg.Tensor:
    """x → decode(μ(x)) (the mean code, no noise)."""
    return model.decode(model.encode(x)[0])


def decode_fn(model: VAE, z: tg.Tensor) -> tg.Tensor:
    return model.decode(z)


INPUTS = {"x": (BATCH, PIXELS)}
RECON_INPUTS = {"x": (None, PIXELS)}
DECODE_INPUTS = {"z": (None, LATENT)}


def optimizer() -> tg.optim.Adam:
    return tg.optim.Adam(lr=1e-3, clip_grad_norm=1.0)
