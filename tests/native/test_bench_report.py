"""Smoke tests of bench/report.py (no speed asserts): the CLI runs --quick on the MLP and
prints one table with every column filled, and the same numbers in --json; --matmul
prints TFLOP/s per variant; the timing helpers fail soft and leave the device as it was."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
_spec = importlib.util.spec_from_file_location("bench_gpu_timing", BENCH / "gpu_timing.py")
assert _spec and _spec.loader
gpu_timing = sys.modules["bench_gpu_timing"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_timing)
HostTimer, profile_program = gpu_timing.HostTimer, gpu_timing.profile_program

COLUMNS = ["model", "kernels", "encode ms", "submit ms", "host ms", "gpu ms", "steps/s",
           "torch eager", "torch.compile", "tg/eager", "tg/compile"]
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def run_report(tmp_path: Path, *args: str) -> tuple[str, dict]:
    """Run bench/report.py in a subprocess (the fixture's Vulkan driver choice is in the
    environment); (stdout, the --json report)."""
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(BENCH / "report.py"), *args, "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout)
    return proc.stdout, json.loads(out.read_text())


def table_rows(stdout: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    lines = stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(header_start))
    header = re.split(r"\s{2,}", lines[i].strip())
    assert set(lines[i + 1].replace(" ", "")) == {"-"}
    rows = []
    for line in lines[i + 2:]:
        if not line.strip() or line.startswith(("sizes:", " ")):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return header, rows


def is_number(cell: str) -> bool:
    return re.fullmatch(r"-?\d+(\.\d+)?(e-?\d+)?", cell) is not None


def test_report_quick_mlp_prints_the_table(gpu_device, tmp_path) -> None:
    stdout, report = run_report(tmp_path, "--quick", "--models", "mlp")
    header, rows = table_rows(stdout, "model ")
    assert header == COLUMNS
    assert len(rows) == 1 and rows[0][0] == "mlp" and len(rows[0]) == len(COLUMNS)
    cells = dict(zip(header, rows[0]))
    assert int(cells["kernels"]) > 0
    for col in ("encode ms", "submit ms", "host ms", "steps/s"):
        assert is_number(cells[col]), (col, cells)
    (mlp,) = report["models"]
    tgr = mlp["tensorgrad"]
    assert tgr["kernels"] == int(cells["kernels"]) and tgr["steps"] == 3
    assert tgr["steps_per_s"] > 0 and tgr["encode_ms"] > 0 and tgr["submits_per_step"] >= 1
    if report["device"]["timestamps"]:   # the replay ran: busy time and its op kinds
        assert is_number(cells["gpu ms"]) and tgr["gpu_ms"] > 0
        assert {"matmul", "matmul+fused"} & set(tgr["gpu_by_kind_ms"]), tgr["gpu_by_kind_ms"]
        assert abs(sum(tgr["gpu_by_kind_ms"].values()) - tgr["gpu_ms"]) < 1e-6 * tgr["gpu_ms"] + 1e-9
        assert re.search(r"^  mlp: .*\bmatmul(\+fused)? x\d+ ", stdout, re.MULTILINE), stdout
    else:
        assert cells["gpu ms"] == "n/a" and tgr["gpu_note"]
    assert cells["torch.compile"] == "n/a"         # --quick leaves torch.compile out
    if HAVE_TORCH:
        assert is_number(cells["torch eager"]) and is_number(cells["tg/eager"])
        assert mlp["torch_eager"]["steps_per_s"] > 0
    else:
        assert cells["torch eager"] == "n/a"


def test_report_quick_in_mixed_precision(gpu_device, tmp_path) -> None:
    """--precision mixed: tensorgrad compiles in mixed precision (lavapipe has shader-f16),
    the torch twin trains under torch.autocast (bfloat16 on a CPU, float16 on CUDA)."""
    _, report = run_report(tmp_path, "--quick", "--models", "gpt", "--precision", "mixed")
    (gpt,) = report["models"]
    tgr = gpt["tensorgrad"]
    assert tgr["precision"] == "mixed" and tgr["loss_scale"] > 0 and tgr["steps"] == 3, tgr
    assert tgr["skipped_steps"] >= 0 and tgr["steps_per_s"] > 0
    if HAVE_TORCH:
        eager = gpt["torch_eager"]
        assert eager["steps_per_s"] > 0 and eager["autocast"] in ("bfloat16", "float16"), eager


def test_report_matmul_quick(gpu_device, tmp_path) -> None:
    stdout, report = run_report(tmp_path, "--matmul", "--quick", "--variants", "auto,naive",
                                "--shapes", "square 64,dW up")
    header, rows = table_rows(stdout, "shape ")
    assert header == ["shape", "MxKxN", "auto", "naive", "auto =", "torch"]
    assert [r[0] for r in rows] == ["square 64", "dW up Xᵀ@dY (K=BT)"]
    assert rows[1][1].endswith("AᵀB")
    for row in report["matmul"]:
        for variant in ("auto", "naive"):
            res = row["variants"][variant]
            assert res["tflops"] > 0 and res["wall_ms"] > 0, res
        assert row["variants"]["auto"]["variant"] == row["auto"]


def test_timing_helpers_fail_soft_and_restore(gpu_device) -> None:
    none = SimpleNamespace(info=SimpleNamespace(features=frozenset()))
    profile, why = profile_program(none, SimpleNamespace(chunks=[], labels=[]))
    assert profile is None and "timestamp-query" in why
    assert profile_program(gpu_device, object())[0] is None
    with HostTimer().attach(object()) as timer:
        assert not timer.active and timer.note
    queue = gpu_device.queue
    timer = HostTimer()
    with timer.attach(gpu_device):
        buf = gpu_device.create_buffer(16, "t")
        gpu_device.write_buffer(buf, b"\0" * 16)
        asyncio.run(gpu_device.read_buffers([(buf, 16)]))
    gpu_device.destroy_buffer(buf)
    assert timer.calls["encode"] == 1 and timer.calls["submit"] == 1
    assert timer.calls["write"] == 1 and timer.calls["wait"] == 1
    assert gpu_device.queue is queue and "_encode" not in vars(gpu_device)
