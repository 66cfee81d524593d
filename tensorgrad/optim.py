"""Optimizers: plain-data configs, and the update ops they append to a training graph.

Configs are frozen dataclasses (``to_dict`` / ``from_dict`` carry them across the worker
boundary), each an :class:`OptimizerConfig` that appends its own update ops
(``append_update``) and computes its own per-step hidden inputs (``host_scalars``).
:func:`append_optimizer` appends, after autograd, the gradient transforms, the optimizer
state (zero-initialized ``state`` leaves) and the update ops, and returns an
:class:`OptimizerPlan`: the writebacks the runtime copies after each step and the hidden
0-d inputs it feeds each step (values from :meth:`OptimizerPlan.host_scalars`). What every
optimizer shares (the interface, the :class:`Appender`, the arenas) is in
:mod:`tensorgrad.update`.

Semantics (step t is 1-based; the runtime increments t before each step):

* Gradient transforms, in this order: ``normalize_grads`` (selected params:
  ``g / (||g|| + 1e-8)``), then ``clip_grad_norm = c`` (``total`` = global L2 norm of the
  normalized gradients, every gradient times ``min(c / (total + 1e-6), 1)``). They are folded
  into the update kernels; no scaled gradient is materialized.
* Adam / AdamW: ``m' = b1 m + (1 - b1) g``, ``v' = b2 v + (1 - b2) g²``,
  ``p' = s p - lrt m' / (sqrt(v') + eps)`` with ``lrt = lr_t sqrt(1 - b2^t) / (1 - b1^t)``
  computed on the host (this is Adam with eps scaled by ``sqrt(1 - b2^t)`` relative to the
  textbook ``m_hat / (sqrt(v_hat) + eps)``). AdamW's decoupled decay ``s = 1 - lr_t wd`` is a
  per-step input too (so ``set_lr`` changes it); s = 1 for params that do not decay.
* SGD: ``g_eff = g + wd p`` for decayed params (coupled L2); with momentum ``v' = mu v + g_eff``
  and the update is ``v'`` (or ``g_eff + mu v'`` with Nesterov), else ``g_eff``;
  ``p' = p - lr_t update``.
* Which params decay (``weight_decay > 0``): a flag a param was declared with
  (``Module.param(decay=...)``, a layer's ``decay=``) wins; the others follow
  ``decay_filter``: True (the default) decays those not initialised to zeros or ones (weights,
  not biases or norm gains), False none, a glob or a callable exactly the params it matches.

Name filters (``normalize_grads``, ``decay_filter``): True (all), False (none), a glob pattern
matched against the whole param name with :func:`fnmatch.fnmatchcase` (``"*.weight"``), or a
callable ``name -> bool``. A callable does not serialize: ``to_dict`` writes the marker
``"<callable>"``, which is fine for the worker (filters only matter when appending the
optimizer) but is refused if a config read back with it is appended to a graph.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from . import lr as lr_mod
from .gpu.interface import DeviceLimits
from .ir import Node
from .ops import optim_ops as oo
from .update import (
    CALLABLE_MARK,  # noqa: F401  (optim.CALLABLE_MARK: a callable filter in plain data)
    CONFIGS,
    Appender,
    NameFilter,
    OptimizerConfig,
    OptimizerPlan,
    Writeback,
    append_optimizer,
    check_filter,
    check_number,
    host_scalars,
)

ADAM_LRT = "__adam_lrt"
"""The hidden per-step input of Adam/AdamW: ``lr_t sqrt(1 - b2^t) / (1 - b1^t)``."""
ADAM_SHRINK = "__adam_decay_shrink"
"""The hidden per-step input of AdamW's decoupled decay: ``1 - lr_t weight_decay``."""
SGD_LR = "__sgd_lr"
"""The hidden per-step input of SGD: the step's learning rate."""


# ---- Adam and AdamW ------------------------------------------------------------------------

def _moments_packed(p: Node, limits: DeviceLimits) -> bool:
    """m and v share one [2, ...] state when that tensor fits one binding."""
    return 2 * max(4, p.nbytes) <= min(limits.max_storage_buffer_binding_size,
                                       limits.max_buffer_size)


class _AdamUpdate(OptimizerConfig):
    """The update Adam and AdamW share (no `kind`: not an optimizer of its own)."""

    beta1: float
    beta2: float
    eps: float

    def _check_moments(self) -> None:
        name = type(self).__name__
        self.check_common()
        check_number(f"{name}: beta1", self.beta1, 0.0, 1.0)
        check_number(f"{name}: beta2", self.beta2, 0.0, 1.0)
        check_number(f"{name}: eps", self.eps, 0.0, low_open=True)

    def append_update(self, a: Appender, decayed: Sequence[str], limits: DeviceLimits
                      ) -> tuple[str, ...]:
        """Moments m and v (one ``[2, ...]`` state when it fits a binding), then the param
        (see the module docstring); `decayed` params shrink by the ``ADAM_SHRINK`` input."""
        lrt = a.scalar(ADAM_LRT)
        shrink = a.scalar(ADAM_SHRINK) if decayed else None
        states = {}
        for n in a.grads:
            p = a.params[n]
            parts = ("mv",) if _moments_packed(p.node, limits) else ("m", "v")
            states[n] = [(part, a.state(f"adam_{part}_{n}",
                                        (2, *p.shape) if part == "mv" else p.shape))
                         for part in parts]
        a.guard("adam", [(n, states[n], [("lr", lrt),
                                         ("shrink", shrink if n in decayed else None)])
                         for n in a.grads],
                {"beta1": self.beta1, "beta2": self.beta2, "eps": self.eps})
        for n, g in a.grads.items():
            moments = []
            for part, state in states[n]:
                moments.append(oo.adam_moments(state, g, part, self.beta1, self.beta2,
                                               **a.scale(n)))
                a.write(moments[-1], f"adam_{part}_{n}", "state")
            p_new = oo.adam_update_p(a.params[n], moments, lrt, self.eps,
                                     shrink if n in decayed else None, ok=a.ok)
            a.write(p_new, n, "param")
        return (ADAM_LRT, ADAM_SHRINK) if decayed else (ADAM_LRT,)

    def host_scalars(self, lr: float, t: int) -> dict[str, float]:
        """``ADAM_LRT``: `lr` with both bias corrections folded in."""
        return {ADAM_LRT: lr * math.sqrt(1.0 - self.beta2 ** t) / (1.0 - self.beta1 ** t)}


@dataclass(frozen=True)
class Adam(_AdamUpdate):
    """Adam (no weight decay). See the module docstring for the exact update."""

    lr: lr_mod.LR
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    clip_grad_norm: float | None = None
    normalize_grads: NameFilter = False
    kind: ClassVar[str] = "adam"

    def __post_init__(self) -> None:
        self._check_moments()


@dataclass(frozen=True)
class AdamW(_AdamUpdate):
    """Adam with decoupled weight decay ``p <- (1 - lr_t wd) p`` on the decayed params."""

    lr: lr_mod.LR
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    decay_filter: NameFilter = True
    clip_grad_norm: float | None = None
    normalize_grads: NameFilter = False
    kind: ClassVar[str] = "adamw"

    def __post_init__(self) -> None:
        self._check_moments()
        check_number("AdamW: weight_decay", self.weight_decay, 0.0)
        check_filter("AdamW: decay_filter", self.decay_filter)

    def host_scalars(self, lr: float, t: int) -> dict[str, float]:
        """Adam's ``ADAM_LRT``, and ``ADAM_SHRINK``: ``1 - lr weight_decay``."""
        return {**super().host_scalars(lr, t), ADAM_SHRINK: 1.0 - lr * self.weight_decay}


# ---- SGD -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SGD(OptimizerConfig):
    """SGD with optional momentum / Nesterov and coupled (L2) weight decay."""

    lr: lr_mod.LR
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    decay_filter: NameFilter = True
    clip_grad_norm: float | None = None
    normalize_grads: NameFilter = False
    kind: ClassVar[str] = "sgd"

    def __post_init__(self) -> None:
        self.check_common()
        check_number("SGD: momentum", self.momentum, 0.0)
        check_number("SGD: weight_decay", self.weight_decay, 0.0)
        check_filter("SGD: decay_filter", self.decay_filter)
        if not isinstance(self.nesterov, bool):
            raise TypeError(f"SGD: nesterov must be a bool, got {self.nesterov!r}")
        if self.nesterov and self.momentum <= 0:
            raise ValueError(f"SGD: nesterov=True needs momentum > 0, got momentum="
                             f"{self.momentum!r}")

    def append_update(self, a: Appender, decayed: Sequence[str], limits: DeviceLimits
                      ) -> tuple[str, ...]:
        """A velocity state with momentum, then the param (see the module docstring);
        `decayed` params add ``weight_decay * p`` to their gradient."""
        lr_in = a.scalar(SGD_LR)
        mu = self.momentum

        def wd_of(n: str) -> float:
            return self.weight_decay if n in decayed else 0.0

        velocity = {n: a.state(f"sgd_v_{n}", a.params[n].shape) if mu > 0 else None
                    for n in a.grads}
        a.guard("sgd", [(n, [("v", v)] if (v := velocity[n]) is not None else [],
                         [("lr", lr_in)]) for n in a.grads],
                lambda n: {"momentum": mu, "nesterov": self.nesterov, "weight_decay": wd_of(n)})
        for n, g in a.grads.items():
            p, v, wd = a.params[n], velocity[n], wd_of(n)
            v_new = None
            if v is not None:
                v_new = oo.sgd_velocity(v, g, mu, wd, p if wd else None, **a.scale(n))
                a.write(v_new, f"sgd_v_{n}", "state")
            needs_g = mu == 0 or self.nesterov
            p_new = oo.sgd_update_p(p, lr_in, g if needs_g else None, v_new, momentum=mu,
                                    nesterov=self.nesterov, weight_decay=wd, **a.scale(n))
            a.write(p_new, n, "param")
        return (SGD_LR,)

    def host_scalars(self, lr: float, t: int) -> dict[str, float]:
        """``SGD_LR``: the step's learning rate."""
        return {SGD_LR: lr}


# ---- plain data ----------------------------------------------------------------------------

def to_dict(config: OptimizerConfig) -> dict[str, object]:
    """`config` as plain data (``{kind: "adam", lr: ..., ...}``), what the worker protocol
    carries; :func:`from_dict` reads it back."""
    return config.to_dict()


def from_dict(data: Mapping[str, object]) -> OptimizerConfig:
    """Inverse of :meth:`to_dict` (a callable filter comes back as the marker string)."""
    kind = data.get("kind")
    if kind not in CONFIGS:
        raise ValueError(f"unknown optimizer kind {kind!r} (known: {sorted(CONFIGS)})")
    args = {k: v for k, v in data.items() if k != "kind"}
    if "lr" in args:
        args["lr"] = lr_mod.from_dict(args["lr"])
    return CONFIGS[kind](**args)


__all__ = ["ADAM_LRT", "ADAM_SHRINK", "SGD", "SGD_LR", "Adam", "AdamW", "Appender",
           "OptimizerConfig", "OptimizerPlan", "Writeback", "append_optimizer", "from_dict",
           "host_scalars", "to_dict"]
