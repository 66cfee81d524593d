"""REINFORCE on cart-pole (the upstream cartpole sample): a policy 4→16 (tanh)→2 logits.

Simulated with gym's CartPole-v1 constants; K = 16 environments run up to MAX_T = 200 steps
per rollout; discounted returns (γ = 0.99) are normalized over the rollout's live steps.
The training step sees one rollout flattened time-major ([3200, …], row t·16 + k) with a mask
for the steps after an episode ended: loss = −Σ log π(a|s)·R·mask / (200·16). Adam lr 5e-3.
Actions are sampled on the host from the policy's current weights (downloaded once per
rollout: 114 numbers), which is far cheaper than 200 GPU round trips per rollout.
Pure Python, so it runs natively and in the browser worker.
"""

from __future__ import annotations

import math
import random

import tensorgrad as tg

K, MAX_T, GAMMA = 16, 200, 0.99
ROWS = K * MAX_T
HIDDEN = 16

# gym CartPole-v1
GRAVITY, CART_MASS, POLE_MASS, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
THETA_LIMIT, X_LIMIT = 12 * 2 * math.pi / 360, 2.4


class Policy(tg.Module):
    def __init__(self) -> None:
        self.l1 = tg.Linear(4, HIDDEN, init=tg.init.kaiming(1.0))
        self.l2 = tg.Linear(HIDDEN, 2, init=tg.init.kaiming(1.0))

    def forward(self, obs: tg.Tensor) -> tg.Tensor:
        return self.l2(tg.tanh(self.l1(obs)))


def loss_fn(model: Policy, obs: tg.Tensor, actions: tg.Tensor, returns: tg.Tensor,
            mask: tg.Tensor) -> tg.Tensor:
    logp = -tg.cross_entropy(model(obs), actions, reduction="none")   # log π(a|s), [ROWS]
    return -tg.sum(logp * returns * mask) * (1.0 / ROWS)


INPUTS = {"obs": (ROWS, 4), "actions": ((ROWS,), "i32"), "returns": (ROWS,), "mask": (ROWS,)}


def optimizer() -> tg.optim.Adam:
    return tg.optim.Adam(lr=5e-3)


def step_env(s: list[float], action: int) -> list[float]:
    """One Euler step of the cart-pole dynamics; s = [x, x_dot, theta, theta_dot]."""
    x, x_dot, th, th_dot = s
    force = FORCE if action == 1 else -FORCE
    cos, sin = math.cos(th), math.sin(th)
    total = CART_MASS + POLE_MASS
    temp = (force + POLE_MASS * HALF_LENGTH * th_dot * th_dot * sin) / total
    th_acc = (GRAVITY * sin - cos * temp) / (
        HALF_LENGTH * (4.0 / 3.0 - POLE_MASS * cos * cos / total))
    x_acc = temp - POLE_MASS * HALF_LENGTH * th_acc * cos / total
    return [x + TAU * x_dot, x_dot + TAU * x_acc, th + TAU * th_dot, th_dot + TAU * th_acc]


def failed(s: list[float]) -> bool:
    return abs(s[0]) > X_LIMIT or abs(s[2]) > THETA_LIMIT


def host_policy(params: dict[str, list[float]]):
    """π(a=1|s) from the downloaded params, in plain Python."""
    w1, b1, w2, b2 = params["l1.W"], params["l1.b"], params["l2.W"], params["l2.b"]

    def prob_right(s: list[float]) -> float:
        h = [math.tanh(b1[j] + sum(s[i] * w1[i * HIDDEN + j] for i in range(4)))
             for j in range(HIDDEN)]
        z0 = b2[0] + sum(h[j] * w2[2 * j] for j in range(HIDDEN))
        z1 = b2[1] + sum(h[j] * w2[2 * j + 1] for j in range(HIDDEN))
        return 1.0 / (1.0 + math.exp(max(-60.0, min(60.0, z0 - z1))))
    return prob_right


def rollout(prob_right, rng: random.Random) -> tuple[dict, list[int], list[list[float]]]:
    """K episodes of up to MAX_T steps: (the training batch, episode lengths, the
    trajectory [x, theta] of episode 0)."""
    obs = [0.0] * (ROWS * 4)
    actions = [0] * ROWS
    rewards = [[0.0] * MAX_T for _ in range(K)]
    lengths = [MAX_T] * K
    states = [[rng.uniform(-0.05, 0.05) for _ in range(4)] for _ in range(K)]
    alive = [True] * K
    trajectory: list[list[float]] = [[states[0][0], states[0][2]]]
    for t in range(MAX_T):
        for k in range(K):
            if not alive[k]:
                continue
            s = states[k]
            row = t * K + k
            obs[4 * row:4 * row + 4] = s
            a = 1 if rng.random() < prob_right(s) else 0
            actions[row] = a
            states[k] = s = step_env(s, a)
            rewards[k][t] = 1.0
            if k == 0:
                trajectory.append([s[0], s[2]])
            if failed(s):
                alive[k] = False
                lengths[k] = t + 1
        if not any(alive):
            break
    returns = [0.0] * ROWS
    mask = [0.0] * ROWS
    live: list[float] = []
    for k in range(K):
        g = 0.0
        for t in range(lengths[k] - 1, -1, -1):
            g = rewards[k][t] + GAMMA * g
            returns[t * K + k] = g
            mask[t * K + k] = 1.0
            live.append(g)
    mean = sum(live) / len(live)
    std = math.sqrt(sum((g - mean) ** 2 for g in live) / len(live)) or 1.0
    returns = [(g - mean) / std if m else 0.0 for g, m in zip(returns, mask)]
    batch = {"obs": obs, "actions": actions, "returns": returns, "mask": mask}
    return batch, lengths, trajectory
