"""The tic_tac_toe demo's script: policy gradient with an exact critic on the policy of
model.py, against random moves.

One training step per rollout: 16 games with the policy as X and 16 as O, against uniformly
random moves, each opening with 0-4 random moves (model.rollout); the rows' targets come from
the exact critic (model.Critic, refreshed every 4 rollouts). Besides the shared messages
(demos/common/) it posts

    {kind: "rollout", step, wins, draws, losses}   each rollout's 32 results (policy's side)
    {kind: "eval", step, wins, draws, losses, games, x_wins, ..., o_losses, o_games,
     x_win, x_draw, x_loss, o_win, o_draw, o_loss}
        on the evaluation schedule: the greedy policy (argmax) plays `games` games against
        random moves, half as X (moving first) and half as O (its own random generator, so
        the evaluations do not change training); x_loss/o_loss are the exact probabilities
        of a loss from each seat (model.exact_vs_random: every random reply followed)

Measured natively (lavapipe, an evaluation every 50 rollouts, `until` on): the greedy policy's
exact loss probability is 0 from both seats, so it loses to no sequence of moves at all, at
rollout 650, 850 and 1,000 for seeds 1, 2 and 3 with the lr schedule over 1,000 rollouts, and
at 750 and 600 for seeds 3 and 4 over 1,500 (the default); 13-17 rollouts/s.

The page plays against the policy with ``await policy_move(cells, me)`` (cells: 9 of 0/1/2).
Config `until`: stop after the first evaluation at which the exact loss probability is 0
from both seats (0 = off). Natively: ``python demos/tic_tac_toe/main.py steps=100``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "tic_tac_toe",
              {"steps": 1500, "seed": 1, "every": 10, "games": 200, "until": 0})
STATE = D.state
SEATS = [f"{s}_{k}" for s in ("x", "o") for k in ("wins", "draws", "losses", "games")]


def eval_rng() -> random.Random:
    """The evaluations' own random generator (so they do not change training)."""
    return STATE.setdefault("eval_rng", random.Random(int(D.cfg["seed"]) + 1_000_003))


async def next_rollout() -> dict:
    m = STATE["module:model"]
    batch, stats = await m.rollout(STATE["probs"], STATE["critic"], D.rng)
    D.post("rollout", step=D.step + 1, **stats)
    return batch


async def evaluate() -> dict:
    m = STATE["module:model"]
    ev = await m.versus_random(STATE["greedy"], int(D.cfg["games"]), eval_rng())
    ev.update(await m.exact_vs_random(STATE["greedy"]))
    return ev


async def policy_move(cells: list[int], me: int) -> int:
    """The greedy policy's move for player `me` on `cells` (the page's game)."""
    await setup()
    return (await STATE["module:model"].moves(STATE["greedy"], [list(cells)], [me]))[0]


async def setup() -> None:
    m = await D.module("model")
    await D.compile(model=m.Policy(), loss=m.loss_fn, inputs=m.INPUTS,
                    optimizer=m.optimizer(int(D.cfg["steps"])))
    await D.attach("probs", forward=m.probs_fn, inputs=m.PLAY_INPUTS)
    await D.attach("greedy", forward=m.greedy_fn, inputs=m.PLAY_INPUTS, output="i32")
    STATE.setdefault("critic", m.Critic())


async def reset() -> None:
    await D.reset()
    STATE.pop("eval_rng", None)


def figures(last: dict) -> dict:
    n = last["games"]
    return {"games": n, "win_rate": last["wins"] / n, "draw_rate": last["draws"] / n,
            "loss_rate": last["losses"] / n, "losses_vs_random": last["losses"],
            **{k: last[k] for k in SEATS}, "x_loss_prob": last["x_loss"],
            "o_loss_prob": last["o_loss"]}


async def main() -> dict:
    D.config()
    await setup()
    return await D.run(next_rollout, evaluate=evaluate, each=True, figures=figures,
                       line="vs random (win/draw/loss): as X {x_wins}/{x_draws}/{x_losses}, "
                       "as O {o_wins}/{o_draws}/{o_losses}; exact P(loss) X {x_loss:.4f} "
                       "O {o_loss:.4f}",
                       until=lambda ev: ev["x_loss"] == 0 and ev["o_loss"] == 0)


if __name__ == "__main__":
    dc.run_native(globals())
