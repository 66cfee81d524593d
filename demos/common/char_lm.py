"""The training script of the character models (makemore: first names, pokeformer: Pokémon
names): each demo's main.py runs :func:`main` with its differences as settings
(:class:`Settings`: the data file, the model class, the sampler), its model.py holds only the
model. The page imports this file into the worker as the module ``char_lm`` (its Demo's
``python: ["char_lm"]``); natively it is imported from demos/common.

Data: one lowercase name per line; names of at most T − 1 letters a-z; a name is held out when
crc32(name) % 10 == 0 (about 10%). A name is encoded as [EOS, letters..., EOS, EOS...] (T + 1
tokens; letter c is token LETTER + c − 'a'); a batch's mask covers each name's letters and
its end and is normalized to sum 1.

A model.py gives: VOCAB, T, EOS, LETTER, BATCH, INPUTS and VAL_INPUTS ({tokens, targets,
mask}), loss_fn, optimizer(), the model class, and for the "host" sampler ``logits_fn`` and
LOGITS_INPUTS (softmax sampling on the host, one character per run) or for the "graph"
sampler ``sample_fn`` and SAMPLE_INPUTS (``categorical(logits / temperature)`` in the graph,
i32).

Besides the shared messages (demos/common/) the script posts, on the evaluation schedule,

    {kind: "eval", step, val_loss, unigram, samples}   loss on the held-out names, the
                                                       unigram baseline, `samples` names
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import demo_common as dc

DEFAULTS = {"steps": 1500, "seed": 1, "every": 100, "val": 512, "samples": 12}


@dataclass(frozen=True)
class Settings:
    """What a character demo chooses: its data file, what the names are (for the log), its
    model class in model.py and its sampler ("host" or "graph")."""

    data: str
    what: str
    model: str
    sampler: str

    def __post_init__(self) -> None:
        if self.sampler not in ("host", "graph"):
            raise ValueError(f"char_lm.Settings sampler={self.sampler!r}: 'host' or 'graph'")


def clean(words: list[str], m: ModuleType) -> list[str]:
    """The names the model can hold: a-z only, at most T − 1 letters."""
    return [w for w in words
            if w.isascii() and w.isalpha() and w.islower() and len(w) <= m.T - 1]


def split(words: list[str]) -> tuple[list[str], list[str]]:
    """(train, held out): held out when crc32(name) % 10 == 0 (about 10%)."""
    held = [w for w in words if zlib.crc32(w.encode()) % 10 == 0]
    return [w for w in words if zlib.crc32(w.encode()) % 10 != 0], held


def encode(word: str, m: ModuleType) -> list[int]:
    """[EOS, letters..., EOS...]: T + 1 tokens."""
    return [m.EOS] + [m.LETTER + ord(c) - 97 for c in word] + [m.EOS] * (m.T - len(word))


def decode(ids: list[int], m: ModuleType) -> str:
    """The letters of `ids` up to the first EOS."""
    end = ids.index(m.EOS) if m.EOS in ids else len(ids)
    return "".join(chr(97 + i - m.LETTER) for i in ids[:end])


def batch(words: list[str], m: ModuleType) -> dict[str, list[Any]]:
    """tokens, targets and the normalized mask (letters and the end) for `words`."""
    tokens: list[int] = []
    targets: list[int] = []
    mask: list[float] = []
    for w in words:
        seq = encode(w, m)
        tokens += seq[:m.T]
        targets += seq[1:]
        mask += [1.0 if t <= len(w) else 0.0 for t in range(m.T)]
    total = sum(mask)
    return {"tokens": tokens, "targets": targets, "mask": [v / total for v in mask]}


def unigram_loss(train: list[str], held: list[str], m: ModuleType) -> float:
    """Cross-entropy on the held-out targets of the train set's character frequencies: what
    a model that ignores context reaches."""
    counts = [1.0] * m.VOCAB
    for w in train:
        for c in encode(w, m)[1:len(w) + 2]:
            counts[c] += 1
    total = sum(counts)
    seq = [c for w in held for c in encode(w, m)[1:len(w) + 2]]
    return -sum(math.log(counts[c] / total) for c in seq) / len(seq)


async def sample(sampler: Any, n: int, rng: random.Random, m: ModuleType, host: bool,
                 temperature: float = 1.0) -> list[str]:
    """n names, one character per run of `sampler`: softmax sampling with `rng` on the host
    from its logits (`host`), or the characters it draws in the graph."""
    rows = [[m.EOS] * m.T for _ in range(n)]
    done = [False] * n
    for pos in range(m.T - 1):
        feeds: dict[str, Any] = {"tokens": [t for r in rows for t in r]}
        if not host:
            feeds["temperature"] = [temperature]
        out = dc.completed(await sampler.run(**feeds), "sample").output
        values = dc.floats(out) if host else dc.ints(out)
        for i in range(n):
            if done[i]:
                continue
            if host:
                z = values[(i * m.T + pos) * m.VOCAB:(i * m.T + pos + 1) * m.VOCAB]
                top = max(z)
                c = rng.choices(range(m.VOCAB), [math.exp((v - top) / temperature) for v in z])[0]
            else:
                c = values[i * m.T + pos]
            done[i] = c == m.EOS
            rows[i][pos + 1] = c
        if all(done):
            break
    return [decode(row[1:], m) for row in rows]


async def evaluate(D: dc.Script, settings: Settings) -> dict[str, Any]:
    """The loss on the first cfg["val"] held-out names, and cfg["samples"] sampled names."""
    m, state = D.state["module:model"], D.state
    res = await state["val"].run(**batch(state["held"][:int(D.cfg["val"])], m))
    names = await sample(state["sampler"], int(D.cfg["samples"]), random.Random(D.step), m,
                         settings.sampler == "host")
    return {"val_loss": dc.floats(dc.completed(res, "validation loss").output)[0],
            "unigram": state["unigram"], "samples": names}


async def main(D: dc.Script, settings: Settings) -> dict[str, Any]:
    """Load the names, compile the demo's model, train it, evaluating on the schedule."""
    m, state = await D.start(), D.state
    if "words" not in state:
        words = clean((await D.data(settings.data)).decode().split(), m)
        train, held = split(words)
        state.update(words=train, held=held, unigram=unigram_loss(train, held, m))
        D.log(f"{len(words):,} {settings.what}: {len(train):,} train / {len(held):,} held "
              f"out; unigram baseline {state['unigram']:.4f} nats/char")
    await D.compile(model=getattr(m, settings.model)(), loss=m.loss_fn, inputs=m.INPUTS,
                    optimizer=m.optimizer())
    await D.attach("val", forward=m.loss_fn, inputs=m.VAL_INPUTS)
    if settings.sampler == "host":
        await D.attach("sampler", forward=m.logits_fn, inputs=m.LOGITS_INPUTS)
    else:
        await D.attach("sampler", forward=m.sample_fn, inputs=m.SAMPLE_INPUTS, output="i32")

    async def check() -> dict[str, Any]:
        return await evaluate(D, settings)

    return await D.run(lambda: batch([D.rng.choice(state["words"]) for _ in range(m.BATCH)], m),
                       evaluate=check, max_pending=20,
                       line="held-out {val_loss:.4f} (unigram {unigram:.4f})",
                       figures=lambda ev: {"val_loss": ev["val_loss"],
                                           "unigram_loss": ev["unigram"],
                                           "samples": " ".join(ev["samples"])})
