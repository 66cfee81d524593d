#!/usr/bin/env python3
"""A long fuzzer run over the op table on the native GPU (the CI test runs 60 fixed ones).

    python bench/fuzz.py [--examples 2000] [--seed N] [--steps 8]

Random programs (tests/fuzz_graphs.py) must trace with a clear ShapeError / TraceError or
match the NumPy reference on the GPU (output, loss and gradients). Prints how many did
which, the ops the matched ones used, and every failure found (shrunk by hypothesis).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings

from tensorgrad.gpu.native import request_native_device
from tests.fuzz_graphs import programs
from tests.native.test_fuzz import check_program


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--steps", type=int, default=8, help="most ops per program")
    parser.add_argument("--kernels", choices=("device", "hardware", "software"),
                        default="device", help="kernel variants: the device's own kind, or "
                        "those of a hardware / software adapter whatever this one is")
    args = parser.parse_args()
    device = asyncio.run(request_native_device())
    if args.kernels != "device":
        device = copy.copy(device)  # the same device, reporting the other kind
        device.info = dataclasses.replace(device.info, software=args.kernels == "software")
    print(f"device: {device.description}; {'software' if device.info.software else 'hardware'} "
          "kernel variants")
    outcomes: collections.Counter[str] = collections.Counter()
    ops: collections.Counter[str] = collections.Counter()
    t0 = time.perf_counter()

    @settings(max_examples=args.examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(program=programs(args.steps))
    def run(program):  # type: ignore[no-untyped-def]
        outcome = asyncio.run(check_program(device, program))
        outcomes[outcome] += 1
        if outcome == "matched":
            ops.update(op for op, _ in program.steps)

    if args.seed is not None:
        from hypothesis import seed
        run = seed(args.seed)(run)
    failed = False
    try:
        run()
    except Exception as err:  # noqa: BLE001 - the finding is the report
        failed = True
        print(f"FOUND: {type(err).__name__}: {err}")
        for sub in getattr(err, "exceptions", [err]):  # each distinct failure, with its program
            notes = "\n".join(getattr(sub, "__notes__", []))
            print(f"--- {type(sub).__name__}: {str(sub)[:2000]}\n{notes[:3000]}")
    seconds = time.perf_counter() - t0
    print(f"{sum(outcomes.values())} programs in {seconds:.0f} s: {outcomes['matched']} matched "
          f"the reference, {outcomes['rejected']} rejected with a clear trace error")
    print("ops in matched programs:", ", ".join(f"{k} {v}" for k, v in ops.most_common()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
