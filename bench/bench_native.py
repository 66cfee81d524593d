#!/usr/bin/env python3
"""Native-backend benchmark: compile ms, kernel count, peak buffer bytes and steps/s for the
MLP (sin fit) and the addition transformer; optionally train each to its target loss.

    python bench/bench_native.py                         # both models, 50 timed steps each
    python bench/bench_native.py --model transformer --train --max-steps 3000
    python bench/bench_native.py --model transformer --train --full --max-steps 1500
    python bench/bench_native.py --chunk-sizes 0,32      # chunked vs one submission
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from models import load_demo

import tensorgrad as tg
from tensorgrad.gpu.native import request_native_device

TARGETS = {"mlp_sin": 0.01, "addition_transformer": 0.1}
ALIASES = {"mlp": "mlp_sin", "transformer": "addition_transformer"}


async def bench_model(device: tg.gpu.GPUDevice, name: str, steps: int, chunk_size: int,
                      train_to_target: bool, max_steps: int, seed: int,
                      fuse: bool = True, full: bool = False) -> dict:
    demo = load_demo(name)
    model = demo.AdditionTransformer() if name == "addition_transformer" else demo.MLP()
    t0 = time.perf_counter()
    train = await tg.compile(model=model, loss=demo.loss_fn, inputs=demo.INPUTS,
                             optimizer=demo.optimizer(), device=device, seed=seed,
                             chunk_size=chunk_size, fuse=fuse)
    compile_ms = (time.perf_counter() - t0) * 1e3
    rng = random.Random(seed)
    batches = [demo.batch(rng) for _ in range(16)]
    for b in batches[:3]:  # warm-up
        await train.step(**b)
    await train.reset()
    t0 = time.perf_counter()
    for i in range(steps):
        r = await train.step(**batches[i % len(batches)])
        if r.kind != "completed":
            raise RuntimeError(f"{name}: step {i}: {r}")
    steps_per_s = steps / (time.perf_counter() - t0)
    out = {"model": name, "chunk_size": chunk_size, "fuse": fuse, "compile_ms": round(compile_ms, 1),
           "kernels": train.kernel_count, "peak_bytes": train.peak_bytes,
           "steps_per_s": round(steps_per_s, 2)}
    if train_to_target:
        await train.reset()
        target = TARGETS[name]
        t0 = time.perf_counter()
        loss, step, reached = float("inf"), 0, None
        for step in range(1, max_steps + 1):
            r = await train.step(**demo.batch(rng))
            if r.kind != "completed":
                raise RuntimeError(f"{name}: step {step}: {r}")
            loss = r.loss
            if step % 100 == 0:
                print(f"  {name} step {step}: loss {loss:.4f}", flush=True)
            if loss < target and reached is None:
                reached = step
                if not full:
                    break
        out.update(target=target, steps_to_target=reached, steps_trained=step,
                   final_loss=round(loss, 5), train_seconds=round(time.perf_counter() - t0, 1))
        if name == "addition_transformer":
            predict = await train.attach(forward=demo.predict_fn, inputs=demo.PREDICT_INPUTS,
                                         output="i32")
            out["test_accuracy"] = round(await demo.accuracy(predict, demo.TEST_PAIRS), 4)
            out["train_accuracy"] = round(
                await demo.accuracy(predict, demo.TRAIN_PAIRS[:2000]), 4)
    train.destroy()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="all", help="mlp | transformer | all")
    parser.add_argument("--steps", type=int, default=50, help="timed steps")
    parser.add_argument("--chunk-sizes", default="32", help="comma-separated, 0 = one submit")
    parser.add_argument("--train", action="store_true", help="train to the target loss")
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--full", action="store_true",
                        help="with --train: keep training to --max-steps past the target")
    parser.add_argument("--compare-fusion", action="store_true",
                        help="also time each model with fusion off")
    args = parser.parse_args()
    names = list(TARGETS) if args.model == "all" else [ALIASES.get(args.model, args.model)]
    device = await request_native_device()
    print(f"device: {device.description}")
    for name in names:
        for k, chunk in enumerate(int(c) for c in args.chunk_sizes.split(",")):
            res = await bench_model(device, name, args.steps, chunk, args.train and k == 0,
                                    args.max_steps, args.seed, full=args.full)
            print(" ".join(f"{k}={v}" for k, v in res.items()), flush=True)
        if args.compare_fusion:
            res = await bench_model(device, name, args.steps, int(args.chunk_sizes.split(",")[0]),
                                    False, args.max_steps, args.seed, fuse=False)
            print(" ".join(f"{k}={v}" for k, v in res.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
