"""The cartpole demo's script: REINFORCE on 16 simulated cart-poles (model.py).

One training step per rollout. Besides the shared messages (demos/common/) it posts

    {kind: "episodes", step, mean, lengths}   each rollout's mean episode length (and all 16)
    {kind: "eval", step, xs, thetas, mean,    on the evaluation schedule: episode 0 of the
     avg10}                                   latest rollout (before the first, one rollout
                                              of the untrained policy), to animate

Config `until`: stop once the mean episode length over the last 10 rollouts reaches it.
Natively: ``python demos/cartpole/main.py steps=100``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "cartpole", {"steps": 400, "seed": 1, "every": 10, "until": 0})
STATE = D.state


def avg10() -> float:
    recent = STATE["means"][-10:]
    return sum(recent) / len(recent) if recent else 0.0


async def policy_rollout(rng: random.Random) -> tuple[dict, list[int], list[list[float]]]:
    """One rollout of the current policy (its weights downloaded to the host)."""
    m = STATE["module:model"]
    params = {n: dc.floats(v) for n, v in (await STATE["train"].download_params()).items()}
    return m.rollout(m.host_policy(params), rng)


async def next_rollout() -> dict:
    """Sample one rollout with the current policy; its training batch."""
    batch, lengths, STATE["trajectory"] = await policy_rollout(D.rng)
    mean = sum(lengths) / len(lengths)
    STATE["means"].append(mean)
    D.post("episodes", step=len(STATE["means"]), mean=mean, lengths=lengths)
    if D.cfg.get("until") and len(STATE["means"]) >= 10 and avg10() >= float(D.cfg["until"]):
        D.control["stop"] = True
    return batch


async def evaluate() -> dict:
    """Episode 0 of the latest rollout (of an untrained one before the first)."""
    mean = STATE["means"][-1] if STATE["means"] else None
    if mean is None:
        _, lengths, STATE["trajectory"] = await policy_rollout(random.Random(D.cfg["seed"] - 1))
        mean = sum(lengths) / len(lengths)
    traj = STATE["trajectory"]
    return {"xs": [s[0] for s in traj], "thetas": [s[1] for s in traj], "mean": mean,
            "avg10": avg10()}


async def reset() -> None:
    await D.reset()
    STATE.update(means=[], trajectory=[])


async def main() -> dict:
    m = await D.start()
    await D.compile(model=m.Policy(), loss=m.loss_fn, inputs=m.INPUTS, optimizer=m.optimizer())
    STATE.setdefault("means", [])
    return await D.run(next_rollout, evaluate=evaluate, each=True,
                       line="mean episode length {mean:6.1f} (last 10: {avg10:6.1f})",
                       figures=lambda ev: {"rollouts": len(STATE["means"]),
                                           "mean_length": ev["mean"],
                                           "mean_length_avg10": ev["avg10"]})


if __name__ == "__main__":
    dc.run_native(globals())
