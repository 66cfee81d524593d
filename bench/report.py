#!/usr/bin/env python3
"""One table per run: for each model, tensorgrad's training step on the native WebGPU device
beside the same model in PyTorch on the same machine.

    python bench/report.py                          # mlp, transformer, gpt, cnn
    python bench/report.py --models gpt,cnn --steps 200 --json out.json
    python bench/report.py --quick                  # CI smoke: tiny GPT, a few steps
    python bench/report.py --matmul                 # matmul kernel TFLOP/s per variant
    python bench/report.py --precision mixed        # mixed precision; the twin under autocast

Columns (per training step):
  kernels      dispatches of one step (compute passes; the param writeback copies aside)
  encode ms    CPU time in the adapter building and finishing the command buffers
  submit ms    time in queue.submit (a CPU rasteriser may run the work right there)
  host ms      wall time of a step minus its GPU waits and submits: the Python side of a
               step (input checks and writes, encoding, read-back copies, the event loop)
  gpu ms       GPU busy time: the sum of the dispatches' durations, from WebGPU timestamp
               queries (each dispatch replayed in a pass of its own); n/a without the
               adapter's 'timestamp-query' feature
  steps/s      wall clock over --steps steps, each step's loss awaited (tensorgrad checks it
               is finite; the torch twin calls loss.item())
  torch eager, torch.compile   the PyTorch twin (bench/torch_models.py): eager, then torch.compile; on
               CUDA when available, else CPU; TF32 off; the batch uploaded from host memory
               each step as tensorgrad does
  tg/eager, tg/compile   tensorgrad steps/s over torch's (> 1: tensorgrad is faster)
GPU time by op kind follows the table (op kinds are the dispatch labels: the IR op, or
'fused' for an elementwise fusion group, 'matmul+fused' and the like for a kernel with
stitched prologues or epilogue).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from gpu_timing import HostTimer, has_timestamps, profile_program, timestamp_period
from models import ALIASES, BUILDERS, Bench, make_bench

import tensorgrad as tg

DEFAULT_MODELS = ("mlp", "transformer", "gpt", "cnn")  # gpt2 (GPT-2 small) on request

COLUMNS = ["model", "kernels", "encode ms", "submit ms", "host ms", "gpu ms", "steps/s",
           "torch eager", "torch.compile", "tg/eager", "tg/compile"]


def torch_or_none() -> Any:
    """torch, or None when it is not importable (its columns then say n/a)."""
    try:
        import torch
    except Exception:  # noqa: BLE001 - any import failure: no torch columns
        return None
    return torch


# ----------------------------------------------------------------------------- tensorgrad


async def bench_tensorgrad(device: Any, bench: Bench, steps: int, warmup: int,
                           replays: int, top: int = 12, precision: str = "f32"
                           ) -> dict[str, Any]:
    """Compile `bench` (in `precision`), step it `warmup` then `steps` times (timed, adapter
    calls timed), then profile one step's dispatches on the GPU."""
    t0 = time.perf_counter()
    train = await tg.compile(model=bench.model, loss=bench.loss, inputs=bench.inputs,
                             optimizer=bench.optimizer, device=device, seed=0,
                             precision=precision)
    out: dict[str, Any] = {"compile_ms": round((time.perf_counter() - t0) * 1e3, 1),
                           "precision": precision}
    try:
        program = train._exe.program
        out["kernels"] = getattr(program, "n_dispatches", train.kernel_count)
        out["copies"] = sum(1 for c in getattr(program, "chunks", ()) for op in c
                            if op[0] is None)
        out["chunks"] = len(getattr(program, "chunks", ()))
        out["params"] = train.param_count
        out["peak_bytes"] = train.peak_bytes
        batches = bench.batches

        async def run(n: int) -> float:
            loss = float("nan")
            for i in range(n):
                r = await train.step(**batches[i % len(batches)])
                if r.kind != "completed":
                    raise RuntimeError(f"{bench.name}: step {i}: {r}")
                loss = r.loss
            return loss

        await run(warmup)
        out["skipped_steps"], out["loss_scale"] = train.skipped_steps, train.loss_scale
        timer = HostTimer()
        with timer.attach(device):
            t0 = time.perf_counter()
            out["loss"] = await run(steps)
            wall = time.perf_counter() - t0
        out["steps"] = steps
        out["steps_per_s"] = steps / wall
        out["step_ms"] = wall / steps * 1e3
        if timer.active:
            per = {k: v / steps * 1e3 for k, v in timer.seconds.items()}
            out["encode_ms"] = per.get("encode", 0.0)
            out["submit_ms"] = per.get("submit", 0.0)
            out["write_ms"] = per.get("write", 0.0)
            out["wait_ms"] = per.get("wait", 0.0)
            out["host_ms"] = out["step_ms"] - out["wait_ms"] - out["submit_ms"]
            out["submits_per_step"] = timer.calls.get("submit", 0) / steps
        else:
            out["host_note"] = timer.note
        profile, why = profile_program(device, program, replays)
        if profile is None:
            out["gpu_note"] = why
        else:
            out["gpu_ms"] = profile.busy_ms
            out["gpu_span_ms"] = profile.span_ms
            out["gpu_by_kind_ms"] = profile.by_kind_ms
            out["gpu_by_kind_count"] = profile.by_kind_count
            out["gpu_replays"] = profile.replays
            out["gpu_top"] = slowest_dispatches(train._exe, profile.per_dispatch_ms, top)
    finally:
        train.destroy()
    return out


def slowest_dispatches(exe: Any, times_ms: list[float], top: int = 12
                       ) -> list[dict[str, Any]]:
    """The `top` slowest dispatches of one step: ms, op label, output and input shapes, and
    for a fused kernel its program (dispatch k runs the k-th node that has a kernel)."""
    from tensorgrad.ops import OPS
    from tensorgrad.runtime import dispatch_label

    graph = exe.graph
    nodes = [n for n, k in zip(graph.nodes, exe.kernels) if k.threads > 0]
    rows = []
    for ms, node in sorted(zip(times_ms, nodes), key=lambda t: -t[0])[:top]:
        row = {"ms": round(ms, 4), "op": dispatch_label(node, OPS), "shape": list(node.shape),
               "inputs": [list(graph[i].shape) for i in node.inputs]}
        if node.op == "fused":
            row["program"] = repr(node.attrs["program"])[:160]
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- torch


def torch_device(torch: Any) -> Any:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def torch_setup(torch: Any, threads: int | None) -> dict[str, Any]:
    """TF32 off (tensorgrad computes in f32), `threads` for CPU ops if given; what the run
    uses, for the header."""
    if threads:
        torch.set_num_threads(threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch_device(torch)
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else platform.processor() or "cpu"
    return {"version": torch.__version__, "device": f"{dev.type}: {name}",
            "threads": torch.get_num_threads(), "tf32": False}


def bench_torch(torch: Any, bench: Bench, steps: int, warmup: int,
                compiled: bool, precision: str = "f32") -> dict[str, Any]:
    """steps/s of the torch twin, eager or through torch.compile; `precision="mixed"`: under
    torch.autocast (float16 with a GradScaler on CUDA, bfloat16 on a CPU)."""
    from torch_models import host_tensors, make_torch_bench, train_step

    torch.manual_seed(0)
    dev = torch_device(torch)
    tb = make_torch_bench(bench.name, bench.config, dev, amp=precision == "mixed")
    model = torch.compile(tb.model) if compiled else tb.model
    batches = [host_tensors(tb, b) for b in bench.batches]
    t0 = time.perf_counter()
    for i in range(max(warmup, 2 if compiled else 1)):
        train_step(tb, model, batches[i % len(batches)], dev)
    first_ms = (time.perf_counter() - t0) * 1e3
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = float("nan")
    for i in range(steps):
        loss = train_step(tb, model, batches[i % len(batches)], dev)
    wall = time.perf_counter() - t0
    return {"steps_per_s": steps / wall, "step_ms": wall / steps * 1e3, "loss": loss,
            "warmup_ms": round(first_ms, 1),
            "autocast": str(tb.amp[1]).removeprefix("torch.") if tb.amp else None}


def try_torch(torch: Any, bench: Bench, steps: int, warmup: int, compiled: bool,
              precision: str = "f32") -> dict[str, Any]:
    try:
        return bench_torch(torch, bench, steps, warmup, compiled, precision)
    except Exception as err:  # noqa: BLE001 - fail soft: say why in the JSON, n/a in the table
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}


# ----------------------------------------------------------------------------- table


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.{digits}f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def model_row(r: dict[str, Any]) -> list[str]:
    tgr, eager, comp = r.get("tensorgrad", {}), r.get("torch_eager", {}), r.get(
        "torch_compile", {})
    sps = tgr.get("steps_per_s")

    def ratio(other: dict[str, Any]) -> str:
        o = other.get("steps_per_s")
        return fmt(sps / o) if sps and o else "n/a"

    return [r["model"], fmt(tgr.get("kernels")), fmt(tgr.get("encode_ms"), 3),
            fmt(tgr.get("submit_ms"), 3), fmt(tgr.get("host_ms")), fmt(tgr.get("gpu_ms")), fmt(sps),
            fmt(eager.get("steps_per_s")), fmt(comp.get("steps_per_s")),
            ratio(eager), ratio(comp)]


def kind_lines(r: dict[str, Any], top: int = 8) -> list[str]:
    kinds = r.get("tensorgrad", {}).get("gpu_by_kind_ms")
    counts = r.get("tensorgrad", {}).get("gpu_by_kind_count", {})
    if not kinds:
        why = r.get("tensorgrad", {}).get("gpu_note") or r.get("tensorgrad", {}).get("error")
        return [f"  {r['model']}: n/a ({why})"]
    busy = sum(kinds.values()) or 1.0
    items = list(kinds.items())
    shown = [f"{k} x{counts.get(k, '?')} {v:.3f} ({100 * v / busy:.0f}%)"
             for k, v in items[:top]]
    if len(items) > top:
        rest = sum(v for _, v in items[top:])
        shown.append(f"{len(items) - top} more {rest:.3f} ({100 * rest / busy:.0f}%)")
    return [f"  {r['model']}: " + ", ".join(shown)]


def notes(results: list[dict[str, Any]]) -> list[str]:
    """Errors, skips and n/a reasons, one line per (column, message) naming its models."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for r in results:
        for side in ("tensorgrad", "torch_eager", "torch_compile"):
            d = r.get(side, {})
            for key in ("error", "skipped", "host_note", "gpu_note"):
                if d.get(key):
                    grouped.setdefault((side, key.replace("_note", ""), str(d[key])),
                                       []).append(r["model"])
    return [f"  {side} {key} ({', '.join(models)}): {msg}"
            for (side, key, msg), models in grouped.items()]


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated, from {','.join(BUILDERS)} (default: "
                             f"{','.join(DEFAULT_MODELS)}; gpt2 is GPT-2 small's shape)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per model (default 50; --quick: 3)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps first (default 5; --quick: 1)")
    parser.add_argument("--replays", type=int, default=None,
                        help="timestamp replays of one step, median taken (default 3; "
                             "--quick: 1)")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    parser.add_argument("--quick", action="store_true",
                        help="CI smoke: tiny GPT and matmul sizes, a few steps, no torch.compile")
    parser.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True,
                        help="the PyTorch columns (default on when torch imports)")
    parser.add_argument("--torch-compile", action=argparse.BooleanOptionalAction,
                        default=None, help="the torch.compile column (default on; off with "
                                           "--quick)")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch.set_num_threads for a CPU twin (default: torch's own; "
                             "1 helps on a loaded machine, where spinning threads stall)")
    parser.add_argument("--top", type=int, default=12,
                        help="slowest dispatches kept in the JSON per model (default 12)")
    parser.add_argument("--precision", choices=("f32", "mixed"), default="f32",
                        help="tensorgrad's precision (mixed: f16 activations, loss scaling); "
                             "the torch twin then runs under torch.autocast")
    parser.add_argument("--matmul", action="store_true",
                        help="matmul kernel TFLOP/s per variant instead of the models")
    parser.add_argument("--shapes", default=None,
                        help="with --matmul: only shapes whose name contains one of these "
                             "comma-separated strings")
    parser.add_argument("--variants", default=None,
                        help="with --matmul: comma-separated kernel variants (default: auto "
                             "and every variant)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",")
               if m.strip() and ALIASES.get(m.strip(), m.strip()) not in BUILDERS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}: choose from {','.join(BUILDERS)}")
    args.steps = args.steps if args.steps is not None else (3 if args.quick else 50)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 5)
    args.replays = args.replays if args.replays is not None else (1 if args.quick else 3)
    if args.torch_compile is None:
        args.torch_compile = not args.quick
    return args


async def device_header(device: Any) -> dict[str, Any]:
    ts = has_timestamps(device)
    return {"description": device.description,
            "wait_mode": getattr(device, "wait_mode", "?"),
            "software": device.info.software, "features": sorted(device.info.features),
            "timestamps": ts, "timestamp_period_ns": timestamp_period(device) if ts else None}


async def run_models(args: argparse.Namespace, device: Any) -> dict[str, Any]:
    torch = torch_or_none() if args.torch else None
    report: dict[str, Any] = {"device": await device_header(device),
                              "python": platform.python_version(),
                              "tensorgrad": tg.__version__ if hasattr(tg, "__version__") else "",
                              "torch": torch_setup(torch, args.torch_threads) if torch else None,
                              "args": vars(args), "models": []}
    d = report["device"]
    print(f"tensorgrad device: {d['description']} (wait: {d['wait_mode']}, timestamps: "
          f"{'yes' if d['timestamps'] else 'n/a'})", flush=True)
    t = report["torch"]
    print(f"torch: {t['version']} on {t['device']} ({t['threads']} CPU threads), TF32 off"
          if t else
          "torch: n/a (not importable or --no-torch)", flush=True)
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        bench = make_bench(name, seed=0, quick=args.quick)
        row: dict[str, Any] = {"model": bench.name, "sizes": bench.sizes}
        print(f"[{bench.name}] {bench.sizes}: tensorgrad ...", flush=True)
        try:
            row["tensorgrad"] = await bench_tensorgrad(device, bench, args.steps, args.warmup,
                                                       args.replays, args.top, args.precision)
        except Exception as err:  # noqa: BLE001 - one model failing must not end the report
            row["tensorgrad"] = {"error": f"{type(err).__name__}: {err}"}
        if torch is not None:
            print(f"[{bench.name}] torch eager ...", flush=True)
            row["torch_eager"] = try_torch(torch, bench, args.steps, args.warmup, False,
                                           args.precision)
            if args.torch_compile:
                print(f"[{bench.name}] torch.compile ...", flush=True)
                row["torch_compile"] = try_torch(torch, bench, args.steps, args.warmup, True,
                                                 args.precision)
            else:
                row["torch_compile"] = {"skipped": "torch.compile off (--quick or "
                                                   "--no-torch-compile)"}
        report["models"].append(row)
    return report


def print_report(report: dict[str, Any]) -> None:
    results = report["models"]
    print()
    print(table(COLUMNS, [model_row(r) for r in results]))
    print("\nsizes:")
    for r in results:
        print(f"  {r['model']}: {r['sizes']}")
    print("GPU time by op kind (kind xdispatches ms/step (share of the busy time)):")
    for r in results:
        for line in kind_lines(r):
            print(line)
    tops = [r for r in results if r.get("tensorgrad", {}).get("gpu_top")]
    if tops:
        print("slowest dispatches (ms, op, output shape <- input shapes):")
    for r in tops:
        print(f"  {r['model']}:")
        for d in r["tensorgrad"]["gpu_top"][:8]:
            ins = ", ".join(str(tuple(s)) for s in d["inputs"])
            print(f"    {d['ms']:8.3f}  {d['op']} {tuple(d['shape'])} <- {ins}")
    extra = notes(results)
    if extra:
        print("notes:")
        print("\n".join(extra))


async def amain(argv: list[str] | None = None, device: Any = None) -> dict[str, Any]:
    """Run the report (printing it); returns what --json writes. `device`: a NativeDevice
    to use (default: a new one, destroyed at the end)."""
    args = parse_args(argv)
    own = device is None
    if own:
        from tensorgrad.gpu.native import request_native_device
        device = await request_native_device()
    try:
        if args.matmul:
            from matmul_bench import print_matmul, run_matmul
            report = await run_matmul(args, device, torch_or_none() if args.torch else None)
            print_matmul(report, table)
        else:
            report = await run_models(args, device)
            print_report(report)
    finally:
        if own:
            device.destroy()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
        print(f"\nwrote {args.json}")
    return report


def main() -> None:
    asyncio.run(amain())


if __name__ == "__main__":
    main()
