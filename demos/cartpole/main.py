"""The cartpole demo's script: REINFORCE on 16 simulated cart-poles (model.py).

One training step per rollout. Besides the shared messages (demos/common/) it posts

    {kind: "episodes", step, mean, lengths}   each rollout's mean episode length (and all 16)
    {kind: "trajectory", step, xs, thetas}    every `every` rollouts: episode 0, to animate

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


async def setup() -> None:
    m = await D.module("model")
    await D.compile(model=m.Policy(), loss=m.loss_fn, inputs=m.INPUTS, optimizer=m.optimizer())
    STATE.setdefault("rng", random.Random(D.cfg["seed"]))
    STATE.setdefault("means", [])


def avg10() -> float:
    recent = STATE["means"][-10:]
    return sum(recent) / len(recent) if recent else 0.0


async def next_rollout() -> dict:
    """Sample one rollout with the current policy; its training batch."""
    m = STATE["module:model"]
    params = {n: dc.floats(v) for n, v in (await STATE["train"].download_params()).items()}
    batch, lengths, trajectory = m.rollout(m.host_policy(params), STATE["rng"])
    mean = sum(lengths) / len(lengths)
    STATE["means"].append(mean)
    STATE["trajectory"] = trajectory
    D.post("episodes", step=len(STATE["means"]), mean=mean, lengths=lengths)
    if D.cfg.get("until") and len(STATE["means"]) >= 10 and avg10() >= float(D.cfg["until"]):
        D.control["stop"] = True
    return batch


async def reset() -> None:
    await D.reset()
    STATE.update(rng=random.Random(D.cfg["seed"]), means=[])


async def main() -> dict:
    D.config()
    await setup()

    async def progress(step: int, loss: float, rate: float) -> None:
        traj = STATE["trajectory"]
        D.post("trajectory", step=step, xs=[s[0] for s in traj], thetas=[s[1] for s in traj])
        D.log(f"rollout {step:4d}  mean episode length {STATE['means'][-1]:6.1f}  "
              f"(last 10: {avg10():6.1f})  {rate:.1f} rollouts/s")

    run = await D.train_each(STATE["train"], next_rollout, on_every=progress)
    return D.figures(run, rollouts=len(STATE["means"]), mean_length=STATE["means"][-1],
                     mean_length_avg10=avg10())


if __name__ == "__main__":
    dc.run_native(globals())
