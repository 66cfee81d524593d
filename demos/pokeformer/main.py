"""The pokeformer demo's script: train the Llama-style transformer of model.py on Pokémon
names (demos/data/pokemon.py: npm pokemon@3.3.1) and sample new ones in the graph.

Besides the shared messages (demos/common/) it posts, every `every` steps,

    {kind: "eval", step, val_loss, unigram, samples}   loss on the held-out names (10% by
                                                       hash), the unigram baseline, 12 names

Natively: ``python demos/pokeformer/main.py steps=100 every=50``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import demo_common as dc

D = dc.Script(globals(), "pokeformer",
              {"steps": 1500, "seed": 1, "every": 100, "val": 512, "samples": 12})
STATE = D.state
DATA_FILE, MODEL_CLASS = "pokemon.txt", "Pokeformer"


async def setup() -> None:
    m = await D.module("model")
    if "words" not in STATE:
        words = m.clean((await D.data(DATA_FILE)).decode().split())
        train_words, val_words = m.split(words)
        STATE.update(words=train_words, val_words=val_words,
                     unigram=m.unigram_loss(train_words, val_words))
        D.log(f"{len(words):,} Pokémon names: {len(train_words):,} train / "
              f"{len(val_words):,} held out; unigram baseline {STATE['unigram']:.4f} nats/char")
    train = await D.compile(model=getattr(m, MODEL_CLASS)(), loss=m.loss_fn, inputs=m.INPUTS,
                            optimizer=m.optimizer())
    if "val" not in STATE:
        STATE.update(val=await train.attach(forward=m.loss_fn, inputs=m.VAL_INPUTS),
                     logits=await train.attach(forward=m.sample_fn, inputs=m.SAMPLE_INPUTS,
                                              output=m.SAMPLE_OUTPUT),
                     rng=random.Random(D.cfg["seed"]), evals=[])


def next_batch() -> dict:
    m = STATE["module:model"]
    return m.batch([STATE["rng"].choice(STATE["words"]) for _ in range(m.BATCH)])


async def evaluate() -> dict:
    m = STATE["module:model"]
    held = STATE["val_words"][:int(D.cfg["val"])]
    res = dc.completed(await STATE["val"].run(**m.batch(held)), "validation loss")
    val_loss = dc.floats(res.output)[0]
    names = await m.sample(STATE["logits"].run, int(D.cfg["samples"]),
                           random.Random(STATE["step"]))
    ev = {"step": STATE["step"], "val_loss": val_loss, "unigram": STATE["unigram"],
          "samples": names}
    STATE["evals"].append(ev)
    D.post("eval", **ev)
    return ev


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
        D.log(f"step {step:5d}  loss {loss:.4f}  held-out {ev['val_loss']:.4f} (unigram "
              f"{ev['unigram']:.4f})  {rate:.2f} steps/s  samples: {' '.join(ev['samples'])}")

    run = await D.train(STATE["train"], next_batch, on_every=progress, max_pending=20)
    if STATE["evals"][-1]["step"] != STATE["step"]:
        await evaluate()
    last = STATE["evals"][-1]
    return D.figures(run, val_loss=last["val_loss"], unigram_loss=last["unigram"],
                     samples=" ".join(last["samples"]))


if __name__ == "__main__":
    dc.run_native(globals())
