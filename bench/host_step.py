#!/usr/bin/env python3
"""The host side of a training step of a small model, natively: per-step wall time and the
Python side of it.

    python bench/host_step.py                       # mlp_sin (B=256, Adam), 2,000 steps
    python bench/host_step.py --steps 5000 --data list --batch 4096

Per step: ``step ms`` (wall clock, each step's result awaited), ``host ms`` (the step minus
the adapter's GPU waits and submits, as ``bench/report.py`` measures it: input checks and
copies, writes, encoding, read-backs, the event loop) and ``call us`` (the synchronous part
of ``train.step(...)``: the call-time validation and copy of the inputs, before it is
awaited). The best of `--rounds` rounds is reported (the machine is shared: the minimum is
the steadiest figure). `--data` picks the host data the steps get: ``array`` (array.array,
as the demo gives), ``numpy`` or ``list`` (flat Python lists, the dearest to convert).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for p in (str(HERE.parent), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from gpu_timing import HostTimer

import tensorgrad as tg


class MLP(tg.Module):
    """mlp_sin's model: 1-64-64-1."""

    def __init__(self) -> None:
        self.l1, self.l2, self.l3 = tg.Linear(1, 64), tg.Linear(64, 64), tg.Linear(64, 1)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l3(tg.relu(self.l2(tg.relu(self.l1(x)))))


def loss_fn(model: MLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(model(x) - y))


def batches(kind: str, size: int, count: int = 8) -> list[dict[str, Any]]:
    """`count` batches of sin data as `kind` host data."""
    rng = random.Random(0)
    out = []
    for _ in range(count):
        xs = [rng.uniform(-math.pi, math.pi) for _ in range(size)]
        ys = [math.sin(x) for x in xs]
        if kind == "list":
            out.append({"x": xs, "y": ys})
        elif kind == "numpy":
            import numpy as np
            out.append({"x": np.asarray(xs, np.float32).reshape(size, 1),
                        "y": np.asarray(ys, np.float32).reshape(size, 1)})
        else:
            out.append({"x": array.array("f", xs), "y": array.array("f", ys)})
    return out


async def measure(steps: int, rounds: int, kind: str, size: int) -> dict[str, float]:
    """The best round's per-step figures."""
    device = await tg.default_device()
    train = await tg.compile(model=MLP(), loss=loss_fn, inputs={"x": (size, 1), "y": (size, 1)},
                             optimizer=tg.optim.Adam(lr=1e-3), device=device, seed=0)
    data = batches(kind, size)
    best: dict[str, float] = {}
    try:
        for _ in range(20):  # warm up
            await train.step(**data[0])
        for _ in range(rounds):
            timer = HostTimer()
            call = 0.0
            with timer.attach(device):
                t0 = time.perf_counter()
                for i in range(steps):
                    c0 = time.perf_counter()
                    pending = train.step(**data[i % len(data)])
                    call += time.perf_counter() - c0
                    result = await pending
                    if result.kind != "completed":
                        raise RuntimeError(f"step {i}: {result}")
                wall = time.perf_counter() - t0
            row = {"step_ms": wall / steps * 1e3, "call_us": call / steps * 1e6}
            if timer.active:
                waits = timer.seconds.get("wait", 0.0) + timer.seconds.get("submit", 0.0)
                row["host_ms"] = (wall - waits) / steps * 1e3
            for key, value in row.items():
                best[key] = min(best.get(key, math.inf), value)
    finally:
        train.destroy()
    return best


def main() -> None:
    """Print one line of figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", choices=("array", "numpy", "list"), default="array")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    best = asyncio.run(measure(args.steps, args.rounds, args.data, args.batch))
    print(f"mlp B={args.batch} {args.data}: " + ", ".join(
        f"{k.replace('_', ' ')} {v:.4f}" for k, v in sorted(best.items())), flush=True)


if __name__ == "__main__":
    main()
