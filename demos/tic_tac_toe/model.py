"""Tic-tac-toe by REINFORCE (after the upstream tic-tac-toe sample): a policy 27→64→64→9
(tanh) over the 9 cells, illegal cells masked out, its moves sampled in the graph.

The board is seen from the player to move: for each cell one-hot (empty, mine, theirs) = 27
inputs. The upstream sample trains by self-play (K = 16 games × 9 slots, every move gets the
game's normalized outcome); measured here that plateaus at 5-18% losses against random moves.
This procedure keeps the model, the loss, Adam and the 144-row batch and changes how the games
are made and credited:

* a rollout is 16 games as X (the policy moves first) and 16 as O, all against a uniformly
  random legal-move opponent; only the policy's moves are training rows: 5 slots for an X game,
  4 for an O game (the most moves that side makes), 16·5 + 16·4 = 144 rows;
* the outcome is +1 win, 0 draw, −20 loss (against random moves the best reply to a weight
  of −1 still loses 0.7% of its games as O; from about −5 on it is a never-losing one), and a
  move's return is that outcome discounted by 0.5 per later move of the same player, so the
  move that let a line through carries most of a loss; returns are normalized over the rollout;
* Adam's lr falls linearly from 5e-3 to 5e-4 over the run (tg.lr.linear).

loss = −Σ log π(a|s)·R·mask / 144. Evaluation: the greedy policy (argmax) against random
moves from both seats, as sampled games and as exact outcome probabilities (every random reply
enumerated). Pure Python, so it runs natively and in the browser worker.
"""

from __future__ import annotations

import math
import random

import tensorgrad as tg

CELLS = 9
SEAT_GAMES = 16                      # games per seat and rollout
SLOTS = {1: 5, 2: 4}                 # rows per game: most moves made as X (1), as O (2)
ROWS = SEAT_GAMES * (SLOTS[1] + SLOTS[2])
WIN, DRAW, LOSS = 1.0, 0.0, -20.0
GAMMA = 0.5                          # per later move of the same player
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
SEATS = {1: "x", 2: "o"}


class Policy(tg.Module):
    def __init__(self) -> None:
        self.l1 = tg.Linear(27, 64, init=tg.init.kaiming(1.0))
        self.l2 = tg.Linear(64, 64, init=tg.init.kaiming(1.0))
        self.l3 = tg.Linear(64, 9, init=tg.init.kaiming(1.0))

    def forward(self, board: tg.Tensor, legal: tg.Tensor) -> tg.Tensor:
        """Masked logits [B, 9]: illegal cells get -1e9."""
        logits = self.l3(tg.tanh(self.l2(tg.tanh(self.l1(board)))))
        return tg.where(tg.greater(legal, 0.5), logits, -1e9)


def loss_fn(model: Policy, board: tg.Tensor, legal: tg.Tensor, actions: tg.Tensor,
            returns: tg.Tensor, mask: tg.Tensor) -> tg.Tensor:
    logp = -tg.cross_entropy(model(board, legal), actions, reduction="none")
    return -tg.sum(logp * returns * mask) * (1.0 / ROWS)


def sample_fn(model: Policy, board: tg.Tensor, legal: tg.Tensor) -> tg.Tensor:
    """A move per board, sampled from π."""
    return tg.categorical(model(board, legal))


def greedy_fn(model: Policy, board: tg.Tensor, legal: tg.Tensor) -> tg.Tensor:
    """The most probable move per board."""
    return tg.argmax(model(board, legal), -1)


INPUTS = {"board": (ROWS, 27), "legal": (ROWS, CELLS), "actions": ((ROWS,), "i32"),
          "returns": (ROWS,), "mask": (ROWS,)}
PLAY_INPUTS = {"board": (None, 27), "legal": (None, CELLS)}


def optimizer(steps: int = 600) -> tg.optim.Adam:
    """Adam, lr 5e-3 falling linearly to 5e-4 over `steps` rollouts (then staying there)."""
    return tg.optim.Adam(lr=tg.lr.linear(peak=5e-3, final=5e-4, steps=max(1, int(steps))))


def winner(cells: list[int]) -> int:
    """1 or 2 when that player has a line, 0 otherwise."""
    for a, b, c in LINES:
        if cells[a] and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return 0


def encode(cells: list[int], me: int) -> tuple[list[float], list[float]]:
    """(27 inputs, 9 legal flags) of `cells` seen by player `me` (1 or 2)."""
    board: list[float] = []
    for v in cells:
        board += (1.0 if v == 0 else 0.0, 1.0 if v == me else 0.0,
                  1.0 if v not in (0, me) else 0.0)
    return board, [1.0 if v == 0 else 0.0 for v in cells]


async def moves(forward, games: list[list[int]], movers: list[int]) -> list[int]:
    """One forward run for all `games` (each seen by its mover): the chosen cells."""
    board: list[float] = []
    legal: list[float] = []
    for cells, me in zip(games, movers):
        b, lg = encode(cells, me)
        board += b
        legal += lg
    result = await forward.run(board=board, legal=legal)
    if result.kind != "completed":
        raise RuntimeError(f"policy: {result.kind} {getattr(result, 'error', '')}")
    out = result.output
    return [int(v) for v in (out.reshape(-1).tolist() if hasattr(out, "reshape")
                             else memoryview(out).cast("B").cast("i").tolist())]


def _outcome(result: int, seat: int) -> float:
    return DRAW if result == 3 else (WIN if result == seat else LOSS)


async def rollout(sample, rng: random.Random) -> tuple[dict, dict]:
    """SEAT_GAMES games as X and as many as O against uniformly random moves, the policy's
    moves sampled by `sample`: (the training batch, {wins, draws, losses} of the policy)."""
    seats = [1] * SEAT_GAMES + [2] * SEAT_GAMES
    first_row = [SLOTS[1] * g if s == 1 else SLOTS[1] * SEAT_GAMES + SLOTS[2] * (g - SEAT_GAMES)
                 for g, s in enumerate(seats)]
    games = [[0] * CELLS for _ in seats]
    done = [0] * len(seats)      # 0 playing, 1/2 winner, 3 draw
    made = [0] * len(seats)      # the policy's moves so far in each game
    board = [0.0] * (ROWS * 27)
    legal = [0.0] * (ROWS * CELLS)
    actions = [0] * ROWS
    mask = [0.0] * ROWS
    for ply in range(CELLS):
        me = 1 if ply % 2 == 0 else 2
        live = [g for g in range(len(seats)) if not done[g]]
        if not live:
            break
        ours = [g for g in live if seats[g] == me]
        picks = dict(zip(ours, await moves(sample, [games[g] for g in ours], [me] * len(ours))
                         if ours else []))
        for g in live:
            cells = games[g]
            if g in picks:
                row = first_row[g] + made[g]
                made[g] += 1
                b, lg = encode(cells, me)
                board[27 * row:27 * row + 27] = b
                legal[CELLS * row:CELLS * row + CELLS] = lg
                actions[row], mask[row] = picks[g], 1.0
                cell = picks[g]
            else:
                cell = rng.choice([i for i, v in enumerate(cells) if not v])
            cells[cell] = me
            w = winner(cells)
            done[g] = w or (3 if all(cells) else 0)
    returns = [0.0] * ROWS
    for g, seat in enumerate(seats):
        r = _outcome(done[g], seat)
        for i in range(made[g]):
            returns[first_row[g] + i] = r * GAMMA ** (made[g] - 1 - i)
    live_r = [r for r, m in zip(returns, mask) if m]
    mean = sum(live_r) / len(live_r)
    std = math.sqrt(sum((r - mean) ** 2 for r in live_r) / len(live_r)) or 1.0
    returns = [(r - mean) / std if m else 0.0 for r, m in zip(returns, mask)]
    results = [_outcome(d, s) for d, s in zip(done, seats)]
    stats = {"wins": results.count(WIN), "draws": results.count(DRAW),
             "losses": results.count(LOSS)}
    return {"board": board, "legal": legal, "actions": actions, "returns": returns,
            "mask": mask}, stats


async def versus_random(greedy, games: int, rng: random.Random,
                        seats: tuple[int, ...] = (1, 2)) -> dict:
    """`games` games of the greedy policy against uniformly random moves, split evenly over
    `seats` (1: the policy is X and moves first, 2: it is O). {wins, draws, losses, games} from
    the policy's side, and the same per seat as x_wins, ..., o_games."""
    boards = [[0] * CELLS for _ in range(games)]
    policy_side = [seats[g % len(seats)] for g in range(games)]
    result = [0] * games     # 0 playing, 1 policy won, 2 draw, 3 policy lost
    for ply in range(CELLS):
        me = 1 if ply % 2 == 0 else 2
        live = [g for g in range(games) if not result[g]]
        if not live:
            break
        ours = [g for g in live if policy_side[g] == me]
        picks = dict(zip(ours, await moves(greedy, [boards[g] for g in ours], [me] * len(ours))
                         if ours else []))
        for g in live:
            cells = boards[g]
            cell = picks[g] if g in picks else rng.choice([i for i, v in enumerate(cells) if not v])
            cells[cell] = me
            w = winner(cells)
            if w:
                result[g] = 1 if w == policy_side[g] else 3
            elif all(cells):
                result[g] = 2
    out = {"wins": result.count(1), "draws": result.count(2), "losses": result.count(3),
           "games": games}
    for seat, name in SEATS.items():
        mine = [r for r, s in zip(result, policy_side) if s == seat]
        out.update({f"{name}_wins": mine.count(1), f"{name}_draws": mine.count(2),
                    f"{name}_losses": mine.count(3), f"{name}_games": len(mine)})
    return out


async def exact_vs_random(greedy) -> dict:
    """The greedy policy's exact outcome probabilities against uniformly random moves, per
    seat: every random reply is followed (one forward run per policy ply over all positions
    reached). {x_win, x_draw, x_loss, o_win, o_draw, o_loss}; x_loss = 0 means that as X it
    loses to no sequence of moves at all."""
    out: dict = {}
    for seat, name in SEATS.items():
        frontier: dict[tuple[int, ...], float] = {(0,) * CELLS: 1.0}
        p = {"win": 0.0, "draw": 0.0, "loss": 0.0}
        for ply in range(CELLS):
            if not frontier:
                break
            me = 1 if ply % 2 == 0 else 2
            states = list(frontier)
            if me == seat:
                picks = await moves(greedy, [list(s) for s in states], [me] * len(states))
                options = [[c] for c in picks]
            else:
                options = [[c for c in range(CELLS) if not s[c]] for s in states]
            nxt: dict[tuple[int, ...], float] = {}
            for s, cells in zip(states, options):
                share = frontier[s] / len(cells)
                for c in cells:
                    t = list(s)
                    t[c] = me
                    w = winner(t)
                    if w:
                        p["win" if w == seat else "loss"] += share
                    elif all(t):
                        p["draw"] += share
                    else:
                        key = tuple(t)
                        nxt[key] = nxt.get(key, 0.0) + share
            frontier = nxt
        out.update({f"{name}_{k}": v for k, v in p.items()})
    return out
