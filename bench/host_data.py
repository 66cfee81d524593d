#!/usr/bin/env python3
"""The host-data path of one training step, without the GPU: CPU microseconds per step from
the user's arrays to the bytes the executable writes.

    python bench/host_data.py                    # array.array, numpy and list inputs
    python bench/host_data.py --data numpy --steps 5000

mlp_sin's model (1-64-64-1, B=256) under AdamW: two user inputs and two hidden inputs (the
optimizer's per-step scalars). The path timed is the tree's own: since the handles convert
host data once (the call-time check and copy, the hidden scalars packed directly), that is
``tensorgrad.handle._snapshot`` plus the packing; on a tree from before (where
``tensorgrad.api._feed_bytes`` exists) it is the three conversions that tree made: the
call-time snapshot, ``_feed_bytes`` over every feed, then ``to_bytes`` again per input in
``Executable.run``. CPU time (``time.process_time``), the best of `--rounds` rounds: the
steadiest figure on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for p in (str(HERE.parent), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from host_step import MLP, batches, loss_fn

import tensorgrad as tg
from tensorgrad import api
from tensorgrad.hostdata import to_bytes


def data_path(train: Any) -> Callable[[dict[str, Any], int], list[Any]]:
    """`path(inputs, t)`: the bytes of every graph input of step `t`, as this tree makes
    them."""
    exe = train._exe
    shapes = {n: d.shape for n, d in train._decls.items()}
    dtypes = {n: d.dtype for n, d in train._decls.items()}
    if hasattr(api, "_feed_bytes"):  # before: three conversions
        def before(inputs: dict[str, Any], t: int) -> list[Any]:
            feeds: dict[str, Any] = dict(api._snapshot("step", inputs, shapes, dtypes))
            feeds.update(train._opt.host_scalars(train._lr, t))
            checked = api._feed_bytes(exe, feeds)
            return [to_bytes(f"input '{n}'", checked[n], node.shape, node.dtype)
                    for n, node in exe.inputs.items()]
        return before
    from tensorgrad.handle import _snapshot
    from tensorgrad.hostdata import scalar_bytes

    def once(inputs: dict[str, Any], t: int) -> list[Any]:
        feeds = _snapshot("step", inputs, shapes, dtypes)
        for name, value in train._opt.host_scalars(train._lr, t).items():
            feeds[name] = scalar_bytes(value, "f32")
        return [feeds[n] for n in exe.inputs]
    return once


async def measure(kind: str, steps: int, rounds: int) -> float:
    """CPU microseconds per step of the data path (best round)."""
    device = await tg.default_device()
    train = await tg.compile(model=MLP(), loss=loss_fn, inputs={"x": (256, 1), "y": (256, 1)},
                             optimizer=tg.optim.AdamW(lr=1e-3), device=device, seed=0)
    try:
        path, data = data_path(train), batches(kind, 256)
        best = math.inf
        for _ in range(rounds):
            t0 = time.process_time()
            for i in range(steps):
                path(data[i % len(data)], i + 1)
            best = min(best, (time.process_time() - t0) / steps)
    finally:
        train.destroy()
    return best * 1e6


def main() -> None:
    """Print one line per kind of host data."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="array,numpy,list")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    how = "three conversions" if hasattr(api, "_feed_bytes") else "one conversion"
    for kind in args.data.split(","):
        us = asyncio.run(measure(kind, args.steps, args.rounds))
        print(f"{kind:6s} {us:7.1f} us per step ({how})", flush=True)


if __name__ == "__main__":
    main()
