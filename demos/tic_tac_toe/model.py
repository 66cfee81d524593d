"""Tic-tac-toe by self-play REINFORCE (the upstream tic-tac-toe sample): a policy
27→64→64→9 (tanh) over the 9 cells, illegal cells masked out.

The board is seen from the player to move: for each cell one-hot (empty, mine, theirs) = 27
inputs. K = 16 self-play games per rollout, moves sampled in the graph (`categorical`); each
of a game's 9 slots is one training row ([144, …], row ply·16 + game) holding the mover's
outcome (+1 win, −1 loss, 0 draw), normalized over the rollout; a mask drops the slots after
the game ended. loss = −Σ log π(a|s)·R·mask / 144; Adam lr 5e-3.
Pure Python, so it runs natively and in the browser worker.
"""

from __future__ import annotations

import math
import random

import tensorgrad as tg

K, CELLS = 16, 9
ROWS = K * CELLS
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


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


def optimizer() -> tg.optim.Adam:
    return tg.optim.Adam(lr=5e-3)


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


async def self_play(sample, rng: random.Random | None = None, vs_random: int = 0
                    ) -> tuple[dict, dict]:
    """K games with moves sampled by `sample`: the training batch and the results
    {x_wins, o_wins, draws}. The last `vs_random` games are against uniformly random moves
    (the policy is X in even ones, O in odd ones; only its moves are trained), the others
    self-play."""
    games = [[0] * CELLS for _ in range(K)]
    rng = rng or random.Random(0)
    rand_side = {k: 2 if k % 2 == 0 else 1 for k in range(K - vs_random, K)}
    board = [0.0] * (ROWS * 27)
    legal = [0.0] * (ROWS * CELLS)
    actions = [0] * ROWS
    mover_of = [0] * ROWS
    mask = [0.0] * ROWS
    done = [0] * K           # 0 playing, 1/2 winner, 3 draw
    for ply in range(CELLS):
        live = [k for k in range(K) if not done[k]]
        if not live:
            break
        me = 1 if ply % 2 == 0 else 2
        chosen = await moves(sample, [games[k] for k in live], [me] * len(live))
        for k, cell in zip(live, chosen):
            row = ply * K + k
            if rand_side.get(k) == me:  # the random opponent's move: not a training row
                cell = rng.choice([i for i, v in enumerate(games[k]) if not v])
                games[k][cell] = me
                w = winner(games[k])
                done[k] = w or (3 if all(games[k]) else 0)
                continue
            b, lg = encode(games[k], me)
            board[27 * row:27 * row + 27] = b
            legal[CELLS * row:CELLS * row + CELLS] = lg
            actions[row], mover_of[row], mask[row] = cell, me, 1.0
            games[k][cell] = me
            w = winner(games[k])
            if w:
                done[k] = w
            elif all(games[k]):
                done[k] = 3
    returns = [0.0] * ROWS
    for row in range(ROWS):
        if mask[row]:
            result = done[row % K]
            returns[row] = 0.0 if result == 3 else (1.0 if result == mover_of[row] else -1.0)
    live = [r for r, m in zip(returns, mask) if m]
    mean = sum(live) / len(live)
    std = math.sqrt(sum((r - mean) ** 2 for r in live) / len(live)) or 1.0
    returns = [(r - mean) / std if m else 0.0 for r, m in zip(returns, mask)]
    stats = {"x_wins": done.count(1), "o_wins": done.count(2), "draws": done.count(3)}
    return {"board": board, "legal": legal, "actions": actions, "returns": returns,
            "mask": mask}, stats


async def versus_random(greedy, games: int, rng: random.Random) -> dict:
    """The greedy policy against uniformly random moves: half the games as X (moving
    first), half as O. {wins, draws, losses} counted from the policy's side."""
    boards = [[0] * CELLS for _ in range(games)]
    policy_side = [1 if g % 2 == 0 else 2 for g in range(games)]
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
    return {"wins": result.count(1), "draws": result.count(2), "losses": result.count(3),
            "games": games}
