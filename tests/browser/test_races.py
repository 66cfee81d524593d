"""Calls that meet in the middle of a compile, in the real worker.

In the browser a compile gives the event loop turns: Pyodide's ``run_sync`` (JSPI) waits for
the pipelines while other tasks run. A ``replace_model`` or ``destroy`` made then must not
leave an executable bound to a param store that is about to be destroyed (its next run failed
with 'Buffer "params" used in submit while destroyed'), nor a replaced model's new graph
alive on a destroyed handle.
"""

from __future__ import annotations

from tests.browser.conftest import Page

MODEL = r'''
import asyncio, random
from array import array
import tensorgrad as tg

class MLP(tg.Module):
    def __init__(self, hidden=128):
        self.fc1 = tg.Linear(784, hidden)
        self.fc2 = tg.Linear(hidden, 10)
    def forward(self, x, train=False):
        h = tg.relu(self.fc1(x))
        if train:
            h = tg.dropout(h, 0.1)
        return self.fc2(h)

def loss_fn(m, x, y):
    return tg.cross_entropy(m(x, train=True), y)

def predict_fn(m, x):
    return tg.softmax(m(x), -1)

async def compiled(hidden=128):
    train = await tg.compile(model=MLP(hidden), loss=loss_fn,
                             inputs={"x": (64, 784), "y": ((64,), "i32")},
                             optimizer=tg.optim.AdamW(lr=1e-3), seed=1)
    return train, await train.attach(predict_fn, inputs={"x": (None, 784)})

def rows(n, value=0.5):
    return array("f", [value] * (n * 784))
'''

REPLACE_DURING_COMPILE = MODEL + r'''
async def main():
    train, predict = await compiled()
    kinds = []
    for n in (3, 5, 9, 17):
        run = asyncio.ensure_future(predict.run(x=rows(n)))  # a new shape: it compiles
        await asyncio.sleep(0)  # the run takes its turn and its compile starts
        replaced = asyncio.ensure_future(train.replace_model(MLP(64 if n % 2 else 32), seed=2))
        kinds.append((await run).kind)
        await replaced
        after = await predict.run(x=rows(n))  # the same shape, for the new model
        kinds.append(after.kind if after.kind != "failed" else str(after.error))
    train.destroy()
    return kinds
'''

DESTROY_DURING_REPLACE = MODEL + r'''
async def main():
    train, _ = await compiled()
    device = train.device
    before = device.live_objects()["buffers"]
    replaced = asyncio.ensure_future(train.replace_model(MLP(256), seed=2))
    await asyncio.sleep(0)  # the rebuild takes its turn and compiles
    train.destroy()
    try:
        await replaced
        outcome = "replaced"
    except tg.AbortError as e:
        outcome = f"AbortError: {e}"
    return {"outcome": outcome, "before": before, "after": device.live_objects()["buffers"],
            "repr": repr(train)}
'''

STORM = MODEL + r'''
async def main():
    rng = random.Random(0)
    train, predict = await compiled()
    canvas = tg.single_flight(predict.run)
    calls = []
    x = array("f", [rng.random() for _ in range(64 * 784)])
    y = array("i", [rng.randrange(10) for _ in range(64)])
    for _ in range(60):
        for _ in range(rng.randrange(1, 6)):
            n = rng.choice([1, 1, 1, 7, 500])
            pixels = array("f", [rng.random() for _ in range(n * 784)])
            calls.append(asyncio.ensure_future(canvas(x=pixels)))
        if rng.random() < 0.3:
            calls.append(asyncio.ensure_future(predict.run(x=rows(500))))
        op = rng.random()
        if op < 0.35:
            calls.append(asyncio.ensure_future(
                train.replace_model(MLP(rng.choice([32, 64, 128, 256])), seed=1)))
        elif op < 0.6:
            calls.append(asyncio.ensure_future(train.step(x=x, y=y)))
        elif op < 0.7:
            calls.append(asyncio.ensure_future(
                train.upload_params(await train.download_params())))
        await asyncio.sleep(rng.choice([0, 0, 0.001, 0.005, 0.02]))
    kinds = {}
    for call in calls:
        result = await call
        kind = "none" if result is None else result.kind
        if kind == "failed":
            kind = f"failed: {result.error}"
        kinds[kind] = kinds.get(kind, 0) + 1
    train.destroy()
    return kinds
'''


def run(tg: Page, source: str) -> object:
    return tg.js("async (src) => session.runScript(src)", source)


def test_a_replace_during_a_forward_compile_leaves_no_stale_executable(tg: Page) -> None:
    kinds = run(tg, REPLACE_DURING_COMPILE)
    # each run made before its replace_model: Completed or Aborted; the run after: Completed
    assert kinds[0::2] and all(k in ("completed", "aborted") for k in kinds[0::2]), kinds
    assert kinds[1::2] == ["completed"] * 4, kinds


def test_destroy_during_replace_model_frees_the_new_graph(tg: Page) -> None:
    out = run(tg, DESTROY_DURING_REPLACE)
    assert out["outcome"].startswith("AbortError: replace_model: the training was destroyed"), out
    assert out["after"] < out["before"], out  # the old graph freed and no new one kept
    assert "destroyed" in out["repr"], out


def test_forward_runs_storming_across_replace_model_complete_or_abort(tg: Page) -> None:
    """Canvas predictions (single-flight) and batch runs of several shapes fired without
    waiting, across replace_model, steps and uploads: each ends Completed or Aborted."""
    kinds = run(tg, STORM)
    assert not [k for k in kinds if k.startswith("failed")], kinds
    assert kinds.get("completed", 0) >= 3, kinds
