"""The tic_tac_toe demo's exact critic (demos/tic_tac_toe/model.py): the positions it
enumerates and its dynamic programme, against a direct recursion over the game's rules."""

from __future__ import annotations

import importlib.util
import random
import sys
from functools import cache
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "demos" / "tic_tac_toe" / "model.py"


@pytest.fixture(scope="module")
def model():
    spec = importlib.util.spec_from_file_location("tic_tac_toe_model_under_test", PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod     # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def seats(model):
    return {seat: model.positions(seat) for seat in (1, 2)}


def test_positions_are_every_reachable_position_of_the_mover(model, seats) -> None:
    # X to move: as many X as O; O to move: one X more; nobody has won, the board is not full
    assert len(seats[1].states) == 2423 and len(seats[2].states) == 2097
    for seat, pos in seats.items():
        for i, state in enumerate(pos.states):
            xs, os_ = state.count(1), state.count(2)
            assert xs - os_ == (0 if seat == 1 else 1), state
            assert model.winner(list(state)) == 0 and 0 in state
            assert pos.index[state] == i
            cells = [cell for cell, *_ in pos.moves[i]]
            assert cells == [c for c in range(9) if state[c] == 0]
            for _, _, nxt, _ in pos.moves[i]:
                assert all(j > i for j in nxt)   # one backward sweep suffices


@pytest.mark.parametrize("seat", [1, 2])
def test_action_values_match_a_direct_recursion(model, seats, seat: int) -> None:
    rng = random.Random(3)
    pos = seats[seat]
    probs = []
    for state in pos.states:
        w = [rng.random() if v == 0 else 0.0 for v in state]
        probs += [x / sum(w) for x in w]

    def pi(state):
        i = pos.index[state]
        return probs[9 * i:9 * i + 9]

    @cache
    def value(state):      # the policy to move
        return sum(p * q(state, c) for c, p in enumerate(pi(state)) if p)

    @cache
    def q(state, cell):    # the policy plays `cell`, then random replies, then π
        after = list(state)
        after[cell] = seat
        if model.winner(after):
            return model.WIN
        free = [c for c in range(9) if not after[c]]
        if not free:
            return model.DRAW
        total = 0.0
        for c in free:
            reply = list(after)
            reply[c] = 3 - seat
            if model.winner(reply):
                total += model.LOSS
            elif all(reply):
                total += model.DRAW
            else:
                total += value(tuple(reply))
        return total / len(free)

    qs, vs = model.action_values(pos, probs)
    for i in rng.sample(range(len(pos.states)), 200) + [0]:
        state = pos.states[i]
        assert vs[i] == pytest.approx(value(state), abs=1e-9)
        for cell, got in qs[i]:
            assert got == pytest.approx(q(state, cell), abs=1e-9), (state, cell)


def test_action_values_of_a_never_losing_choice(model, seats) -> None:
    # X has two in the top row and O to move: only blocking at cell 2 avoids an immediate loss
    pos = seats[2]
    state = (1, 1, 0, 0, 2, 0, 0, 0, 0)
    i = pos.index[state]
    probs = [0.0] * (9 * len(pos.states))
    for j, s in enumerate(pos.states):     # a policy that plays its first free cell
        probs[9 * j + s.index(0)] = 1.0
    qs, _ = model.action_values(pos, probs)
    best = max(qs[i], key=lambda m: m[1])
    assert best[0] == 2, qs[i]
    # any other move leaves X a 1-in-5 chance (of 5 random replies) of taking cell 2
    assert dict(qs[i])[3] <= model.LOSS / 5 + 1.0 * 4 / 5
