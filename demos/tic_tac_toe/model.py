"""Tic-tac-toe by policy gradient with an exact critic (after the upstream tic-tac-toe sample):
a policy 27→64→64→9 (tanh) over the 9 cells, illegal cells masked out.

The board is seen from the player to move: for each cell one-hot (empty, mine, theirs) = 27
inputs. The upstream sample trains by self-play (K = 16 games × 9 slots, every move gets the
game's normalized outcome); measured here that plateaus at 5-18% losses against random moves,
and plain REINFORCE against random moves still lost 0.4-9% of its games as O after 600-5,000
rollouts. This procedure keeps the model, the loss, Adam and the 144-row batch and changes how
the rows are made:

* a rollout is 16 games with the policy as X (moving first) and 16 as O, against a uniformly
  random legal-move opponent; each game opens with 0-4 random moves by both sides (exploring
  starts), then the policy's moves are sampled from π; only the policy's moves are rows: 5 slots
  for an X game, 4 for an O game (the most moves that side makes), 16·5 + 16·4 = 144 rows;
* the critic is exact: tic-tac-toe against random moves is small (2,423 positions with X to
  move, 2,097 with O), so before each rollout one forward run gives π on every position and
  Q(s, a), the expected outcome (+1 win, 0 draw, −20 loss) of playing a in s and following π
  after, is computed for all of them by dynamic programming (`action_values`);
* a row's action is the best move a* = argmax Q(s, ·) and its weight the advantage
  Q(s, a*) − V(s) ≥ 0, V(s) = Σ π(a|s) Q(s, a) (policy iteration by gradient steps: a row whose
  best move π already plays carries no weight); −20 per loss makes the best moves never-losing;
* Adam's lr falls linearly from 5e-3 to 5e-4 over the run (tg.lr.linear).

loss = −Σ log π(a*|s)·A·mask / 144. Evaluation: the greedy policy (argmax) against random
moves from both seats, as sampled games and as exact outcome probabilities (every random reply
enumerated). Pure Python, so it runs natively and in the browser worker.
"""

from __future__ import annotations

import array
import random
from collections.abc import Sequence
from dataclasses import dataclass

import tensorgrad as tg

CELLS = 9
SEAT_GAMES = 16                      # games per seat and rollout
SLOTS = {1: 5, 2: 4}                 # rows per game: most moves made as X (1), as O (2)
ROWS = SEAT_GAMES * (SLOTS[1] + SLOTS[2])
WIN, DRAW, LOSS = 1.0, 0.0, -20.0
OPENING = 4                          # a rollout game opens with 0..OPENING random moves
CRITIC_EVERY = 4                     # rollouts per exact evaluation of π (one big forward run)
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


def probs_fn(model: Policy, board: tg.Tensor, legal: tg.Tensor) -> tg.Tensor:
    """π(·|board) [B, 9]: 0 on illegal cells."""
    return tg.softmax(model(board, legal), -1)


def greedy_fn(model: Policy, board: tg.Tensor, legal: tg.Tensor) -> tg.Tensor:
    """The most probable move per board."""
    return tg.argmax(model(board, legal), -1)


INPUTS = {"board": (ROWS, 27), "legal": (ROWS, CELLS), "actions": ((ROWS,), "i32"),
          "returns": (ROWS,), "mask": (ROWS,)}
PLAY_INPUTS = {"board": (None, 27), "legal": (None, CELLS)}


def optimizer(steps: int = 1500) -> tg.optim.Adam:
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


@dataclass
class Positions:
    """Every position where the policy, playing `seat`, is to move against random moves.

    moves[i] lists, for each legal cell of states[i], (cell, value, next, replies): playing
    it ends the game at once (value = its outcome, no next) or leaves `replies` random
    replies, of which those that end the game add up to `value` (already divided by
    `replies`) and the others lead to the positions `next`. States come in breadth-first
    order, so a position's successors always come after it."""
    seat: int
    states: list[tuple[int, ...]]
    index: dict[tuple[int, ...], int]
    moves: list[list[tuple[int, float, tuple[int, ...], int]]]


def positions(seat: int) -> Positions:
    """The positions of `seat` (1: X, 2: O) reachable when the other side moves at random."""
    opp = 3 - seat
    roots = [(0,) * CELLS] if seat == 1 else [
        tuple(opp if c == r else 0 for c in range(CELLS)) for r in range(CELLS)]
    pos = Positions(seat, [], {}, [])

    def find(state: tuple[int, ...]) -> int:
        if state not in pos.index:
            pos.index[state] = len(pos.states)
            pos.states.append(state)
        return pos.index[state]

    for root in roots:
        find(root)
    k = 0
    while k < len(pos.states):
        row = []
        for cell in range(CELLS):
            after = list(pos.states[k])
            if after[cell]:
                continue
            after[cell] = seat
            free = [c for c in range(CELLS) if not after[c]]
            if winner(after) or not free:
                row.append((cell, WIN if winner(after) else DRAW, (), 1))
                continue
            ended, nxt = 0.0, []
            for c in free:
                reply = list(after)
                reply[c] = opp
                if winner(reply):
                    ended += LOSS
                elif all(reply):
                    ended += DRAW
                else:
                    nxt.append(find(tuple(reply)))
            row.append((cell, ended / len(free), tuple(nxt), len(free)))
        pos.moves.append(row)
        k += 1
    return pos


def action_values(pos: Positions, probs: Sequence[float], offset: int = 0
                  ) -> tuple[list[list[tuple[int, float]]], list[float]]:
    """Exact Q and V of the policy `probs` (π of pos.states[i] at probs[offset + 9i:][:9])
    against random moves: Q[i] = [(cell, expected outcome of playing it and following π
    after)], V[i] = Σ π(cell) Q. One sweep from the last position back."""
    n = len(pos.states)
    values = [0.0] * n
    q: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for i in range(n - 1, -1, -1):
        base = offset + CELLS * i
        v = 0.0
        row = q[i]
        for cell, ended, nxt, replies in pos.moves[i]:
            value = ended + sum(values[j] for j in nxt) / replies if nxt else ended
            row.append((cell, value))
            v += probs[base + cell] * value
        values[i] = v
    return q, values


class Critic:
    """Both seats' positions, encoded once for one forward run of π over all of them.

    The values are recomputed every `every` rollouts: the forward run over 4,520 positions
    costs ~90 ms on a CPU rasteriser, a training step ~25 ms, and a critic a few steps old
    still points at better moves."""

    def __init__(self, every: int = CRITIC_EVERY) -> None:
        self.every, self.calls, self.last = max(1, int(every)), 0, None
        self.seats = {seat: positions(seat) for seat in SEATS}
        board: list[float] = []
        legal: list[float] = []
        self.offset = {}
        for seat, pos in self.seats.items():
            self.offset[seat] = len(legal)
            for state in pos.states:
                b, lg = encode(list(state), seat)
                board += b
                legal += lg
        self.board, self.legal = array.array("f", board), array.array("f", legal)

    async def current(self, probs_forward) -> tuple[list[float], dict]:
        """`evaluate`'s result, recomputed on every `every`-th call."""
        if self.last is None or self.calls % self.every == 0:
            self.last = await self.evaluate(probs_forward)
        self.calls += 1
        return self.last

    async def evaluate(self, probs_forward) -> tuple[list[float], dict]:
        """π on every position (flat, 9 per position) and {seat: (Q, V)} of that π."""
        result = await probs_forward.run(board=self.board, legal=self.legal)
        if result.kind != "completed":
            raise RuntimeError(f"policy: {result.kind} {getattr(result, 'error', '')}")
        out = result.output
        probs = (out.reshape(-1).tolist() if hasattr(out, "reshape")
                 else memoryview(out).cast("B").cast("f").tolist())
        return probs, {seat: action_values(pos, probs, self.offset[seat])
                       for seat, pos in self.seats.items()}


async def rollout(probs_forward, critic: Critic, rng: random.Random) -> tuple[dict, dict]:
    """SEAT_GAMES games as X and as many as O against uniformly random moves, each opening
    with 0..OPENING random moves, then the policy's moves sampled from π: (the training batch,
    {wins, draws, losses} of the policy). A row's action is the best move by the exact
    critic, its return that move's advantage over π."""
    probs, values = await critic.current(probs_forward)
    board = [0.0] * (ROWS * 27)
    legal = [0.0] * (ROWS * CELLS)
    actions = [0] * ROWS
    returns = [0.0] * ROWS
    mask = [0.0] * ROWS
    results = []
    row = 0
    for seat in [1] * SEAT_GAMES + [2] * SEAT_GAMES:
        pos, (q, v) = critic.seats[seat], values[seat]
        cells, me, opening, first = [0] * CELLS, 1, rng.randint(0, OPENING), row
        while True:
            if me == seat and opening <= 0:
                i = pos.index[tuple(cells)]
                base = critic.offset[seat] + CELLS * i
                cell = rng.choices(range(CELLS), probs[base:base + CELLS])[0]
                best, best_q = max(q[i], key=lambda m: m[1])
                b, lg = encode(cells, me)
                board[27 * row:27 * row + 27] = b
                legal[CELLS * row:CELLS * row + CELLS] = lg
                actions[row], returns[row], mask[row] = best, best_q - v[i], 1.0
                row += 1
            else:
                cell = rng.choice([c for c in range(CELLS) if not cells[c]])
            opening -= 1
            cells[cell] = me
            w = winner(cells)
            if w or all(cells):
                results.append(_outcome(w or 3, seat))
                break
            me = 3 - me
        row = first + SLOTS[seat]
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
