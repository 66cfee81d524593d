"""The worker's event loop (tensorgrad/web/loop.py): ready callbacks run in batches, in order,
and neither a long run of callbacks nor a suspended one keeps the page's messages waiting."""

from __future__ import annotations

import ast

from .conftest import Page

ORDER = """
import asyncio
loop = asyncio.get_running_loop()
ran, batches = [], [0]
run_batch = loop._run_batch
def counted():
    batches[0] += 1
    run_batch()
loop._run_batch = counted  # the batches scheduled from here on are counted
def callback(i):
    ran.append(i)
    if i < 100 and i % 10 == 0:  # callbacks scheduled by callbacks queue behind those already ready
        loop.call_soon(callback, 1000 + i)
for i in range(100):
    loop.call_soon(callback, i)
await asyncio.sleep(0.05)
del loop._run_batch
(type(loop).__name__, ran, batches[0])
"""


def test_ready_callbacks_run_in_order_in_few_browser_tasks(tg: Page) -> None:
    """110 callbacks, 10 of them scheduled by others, run first come first served, in a few
    browser tasks (Pyodide's own loop gave each callback a browser task of its own)."""
    name, ran, batches = ast.literal_eval(tg.exec(ORDER))
    assert name == "BatchedWebLoop"
    assert ran == [*range(100), *(1000 + i for i in range(0, 100, 10))], ran
    assert 1 <= batches <= 5, batches


SPIN = """async ({ seconds, suspend }) => {
  // Python keeps the loop busy for `seconds`, either with a stream of ready callbacks
  // (asyncio.sleep(0) in a loop) or in one callback whose stack is suspended (time.sleep
  // waits through JSPI); a ping sent 100 ms in must be answered before that ends.
  const source = suspend
    ? `import time\\nt0 = time.time()\\ntime.sleep(${seconds})\\n(t0 * 1000, time.time() * 1000)`
    : `import asyncio, time\\nt0 = time.time()\\nn = 0\\n` +
      `while time.time() - t0 < ${seconds}:\\n    await asyncio.sleep(0)\\n    n += 1\\n` +
      `(t0 * 1000, time.time() * 1000, n)`;
  const busy = session.request("exec", { source });
  await new Promise((r) => setTimeout(r, 100));
  const late = new Promise((r) => setTimeout(() => r("late"), 5000));
  const pong = await Promise.race([session.request("ping", { value: 1 }), late]);
  const pinged = pong === "late" ? "no answer within 5 s" : Date.now();
  const stuck = new Promise((r) => setTimeout(() => r("no answer within 10 s"), 10000));
  return { pinged, busy: await Promise.race([busy, stuck]) };
}"""


def test_a_stream_of_ready_callbacks_lets_the_pages_messages_in(tg: Page) -> None:
    """A coroutine that never waits for anything but asyncio.sleep(0) for 1.5 s: the loop
    gives the browser its turn between batches, so a ping is answered meanwhile."""
    out = tg.js(SPIN, {"seconds": 1.5, "suspend": False})
    assert "no answer" not in str(out), out
    start, end, spins = ast.literal_eval(out["busy"])
    assert spins > 100, out  # it did spin through the loop
    assert start < out["pinged"] < end - 500, out


def test_a_suspended_callback_does_not_hold_the_others(tg: Page) -> None:
    """time.sleep in the worker suspends its callback's stack (JSPI): the callbacks queued
    behind it, here a ping's, run in another browser task meanwhile."""
    out = tg.js(SPIN, {"seconds": 1.5, "suspend": True})
    assert "no answer" not in str(out), out
    start, end = ast.literal_eval(out["busy"])
    assert end - start >= 1400, out  # it did sleep
    assert start < out["pinged"] < end - 500, out
