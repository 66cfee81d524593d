"""The demos' shared script helpers (demos/common/demo_common.py, char_lm.py) without a GPU:
when a demo evaluates (early steps, every `every`, and by the clock while a person watches),
reading classes off a forward's output, shuffled passes, and the character models' data."""

from __future__ import annotations

import array
import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "demos" / "common"))
import char_lm
import demo_common as dc

from tests.models import demo


def due_steps(schedule: dc.Schedule, last: int) -> list[int]:
    return [step for step in range(1, last + 1) if schedule(step)]


def test_evaluations_come_early_then_every_n_steps() -> None:
    assert due_steps(dc.Schedule(100, seconds=None), 450) == [25, 50, 100, 200, 300, 400]
    assert due_steps(dc.Schedule(250, seconds=None), 600) == [25, 50, 100, 200, 250, 500]
    assert due_steps(dc.Schedule(10, seconds=None), 45) == [10, 20, 30, 40]
    assert due_steps(dc.Schedule(1, seconds=None), 4) == [1, 2, 3, 4]


def test_a_watched_page_also_evaluates_by_the_clock() -> None:
    """After `seconds` (and twice the last evaluation's time; the first, which compiles the
    forward graphs, does not count), a slow page evaluates at whatever step it is at."""
    schedule = dc.Schedule(100, seconds=0.05)
    assert not schedule(7)
    schedule.record(time.perf_counter() - 5.0)   # the first evaluation: 5 s, compiling
    assert not schedule(7)
    time.sleep(0.06)
    assert schedule(7)
    schedule.record(time.perf_counter() - 0.1)   # an evaluation of 0.1 s: wait 0.2 s now
    time.sleep(0.06)
    assert not schedule(8)
    time.sleep(0.15)
    assert schedule(8)


def test_every_must_be_a_positive_number_of_steps() -> None:
    with pytest.raises(ValueError, match=r"demo setting every=0: a positive number of steps"):
        dc.Schedule(0)


def test_classes_of_class_ids_and_of_scores() -> None:
    assert dc.classes(array.array("i", [3, 1, 4]), 3) == [3, 1, 4]
    scores = array.array("f", [0.1, 0.7, 0.2, 0.9, 0.05, 0.05])
    assert dc.classes(scores, 2) == [1, 0]


def test_shuffled_passes_cover_every_row_once_per_pass_and_restart_on_reset() -> None:
    ns: dict = {"DEMO_CONFIG": {"seed": 3}}
    script = dc.Script(ns, "test", {"seed": 1})
    first = [r for _ in range(5) for r in script.shuffled(10, 2)]
    assert sorted(first) == list(range(10))
    assert ns["reset"] == script.reset     # the page's Reset, unless main.py defines one
    import asyncio
    asyncio.run(script.reset())
    assert [r for _ in range(5) for r in script.shuffled(10, 2)] == first


@pytest.mark.parametrize("name", ["makemore", "pokeformer"])
def test_names_encode_batch_and_decode_for_both_token_schemes(name: str) -> None:
    m = demo(name)
    seq = char_lm.encode("abc", m)
    assert len(seq) == m.T + 1 and seq[0] == seq[4] == seq[-1] == m.EOS
    assert seq[1:4] == [m.LETTER, m.LETTER + 1, m.LETTER + 2]
    assert char_lm.decode(seq[1:], m) == "abc"
    b = char_lm.batch(["ab", "xyz"], m)
    assert len(b["tokens"]) == len(b["targets"]) == 2 * m.T
    assert abs(sum(b["mask"]) - 1) < 1e-9 and sum(v > 0 for v in b["mask"]) == 3 + 4
    assert char_lm.clean(["Ok", "ok", "a" * m.T, "é"], m) == ["ok"]
    train, held = char_lm.split([f"n{i}" for i in range(200)])
    assert 5 < len(held) < 40 and not set(train) & set(held)
    uniform = char_lm.unigram_loss(["abc"] * 3, ["cab"], m)
    assert 0 < uniform < 3.5


def test_char_lm_settings_name_a_known_sampler() -> None:
    with pytest.raises(ValueError, match=r"sampler='gpu': 'host' or 'graph'"):
        char_lm.Settings(data="x.txt", what="x", model="M", sampler="gpu")


def test_the_addition_demo_answers_with_digits_only() -> None:
    """An untrained model's greedy answer is three digits, never '+' or '=' (the page showed
    "1221": '=' read as 11 in each place)."""
    import numpy as np

    import tensorgrad as tg
    from tensorgrad.reference import evaluate

    at = demo("addition_transformer")
    model = at.AdditionTransformer()
    tr = tg.trace_forward(model, at.predict_fn, {"tokens": ((4, at.T), "i32")})
    rng = random.Random(0)
    params = {n: np.zeros(s.shape, np.float32) for n, s in model.named_params().items()}
    params["ln_f.b"][:] = 1.0                # the final norm outputs ones (its gain is 0)
    params["tok_emb"][at.EQUALS] = 1.0       # so '=' scores D through the tied head, digits 0
    tokens = np.array([at.encode(rng.randrange(100), rng.randrange(100))[:at.T]
                       for _ in range(4)], np.int32)
    out = evaluate(tr.graph, {**params, "tokens": tokens})[tr.output]
    assert out.shape == (4, at.T) and out.max() <= 9
