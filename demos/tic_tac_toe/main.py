"""The tic_tac_toe demo's script: self-play REINFORCE on the policy of model.py.

One training step per rollout of 16 self-play games. Besides the shared messages
(demos/common/) it posts

    {kind: "selfplay", step, x_wins, o_wins, draws}     each rollout's results
    {kind: "eval", step, wins, draws, losses, games}    every `every` rollouts: the greedy
                                                        policy against random moves

The page plays against the policy with ``await policy_move(cells, me)`` (cells: 9 of 0/1/2).
Config `until`: stop after the first evaluation with no loss (0 = off). Natively:
``python demos/tic_tac_toe/main.py steps=100``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "tic_tac_toe",
              {"steps": 600, "seed": 1, "every": 10, "games": 200, "until": 0,
               "vs_random": 8})
STATE = D.state


async def setup() -> None:
    m = await D.module("model")
    train = await D.compile(model=m.Policy(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "sample" not in STATE:
        STATE.update(sample=await train.attach(forward=m.sample_fn, inputs=m.PLAY_INPUTS,
                                               output="i32"),
                     greedy=await train.attach(forward=m.greedy_fn, inputs=m.PLAY_INPUTS,
                                               output="i32"),
                     rng=random.Random(D.cfg["seed"]), evals=[])


async def next_rollout() -> dict:
    m = STATE["module:model"]
    batch, stats = await m.self_play(STATE["sample"], STATE["rng"], int(D.cfg["vs_random"]))
    D.post("selfplay", step=STATE["step"] + 1, **stats)
    return batch


async def evaluate() -> dict:
    m = STATE["module:model"]
    ev = await m.versus_random(STATE["greedy"], int(D.cfg["games"]), STATE["rng"])
    ev["step"] = STATE["step"]
    STATE["evals"].append(ev)
    D.post("eval", **ev)
    return ev


async def policy_move(cells: list[int], me: int) -> int:
    """The greedy policy's move for player `me` on `cells` (the page's game)."""
    await setup()
    return (await STATE["module:model"].moves(STATE["greedy"], [list(cells)], [me]))[0]


async def reset() -> None:
    await D.reset()
    STATE.update(rng=random.Random(D.cfg["seed"]), evals=[])


async def main() -> dict:
    D.config()
    await setup()
    if STATE["step"] == 0:
        await evaluate()

    async def progress(step: int, loss: float, rate: float) -> None:
        ev = await evaluate()
        n = ev["games"]
        D.log(f"rollout {step:4d}  vs random: win {ev['wins'] / n:.0%}  draw "
              f"{ev['draws'] / n:.0%}  loss {ev['losses'] / n:.0%}  {rate:.1f} rollouts/s")
        if D.cfg.get("until") and ev["losses"] == 0:
            D.control["stop"] = True

    run = await D.train_each(STATE["train"], next_rollout, on_every=progress)
    last = STATE["evals"][-1]
    if last["step"] != STATE["step"]:
        last = await evaluate()
    n = last["games"]
    return D.figures(run, games=n, win_rate=last["wins"] / n, draw_rate=last["draws"] / n,
                     loss_rate=last["losses"] / n, losses_vs_random=last["losses"])


if __name__ == "__main__":
    dc.run_native(globals())
