"""bench/report.py --matmul: TFLOP/s of tensorgrad's f32 matmul kernel per variant
(tensorgrad/ops/linalg.py: naive, reduce, blocked, tiled1/2/4, and 'auto' = choose_variant's
pick for this device), on square sizes and the GPT's training shapes — the forward
[B·T, D] @ [D, 4D] and [B·T, 4D] @ [4D, D], their input gradients (transposed weights) and
weight gradients (transposed activations, long K = B·T), and the attention products —
beside torch.matmul (TF32 off) when CUDA is available.

Each kernel is timed as R back-to-back dispatches in one program (R chosen from a first
run to fill ~0.2 s): from WebGPU timestamps when the adapter has them (GPU time per
dispatch), and by wall clock (submit to read-back, over R) always.
"""

from __future__ import annotations

import array
import time
from dataclasses import dataclass
from typing import Any

from gpu_timing import has_timestamps, profile_program
from models import GPT_FULL, GPT_TINY, GPTConfig

from tensorgrad.codegen.kernel import Target, dispatch_size, emit_node
from tensorgrad.gpu.interface import Dispatch
from tensorgrad.ops import OPS, linalg
from tensorgrad.ops.linalg import VARIANTS, MatmulSpec, choose_variant, mm
from tensorgrad.tensor import leaf, tracing


@dataclass(frozen=True)
class Shape:
    """out[batch, m, n] = A @ B with K = k; `ta` / `tb`: the operand is stored transposed
    (as the backward rules store weights and activations); `zeros_a` / `zeros_b`: a zero
    triangle of the logical operand that the kernel skips (causal attention; its TFLOP/s
    count the dense product's FLOP, as torch.matmul does the dense product)."""

    name: str
    m: int
    k: int
    n: int
    batch: int = 1
    ta: bool = False
    tb: bool = False
    zeros_a: str | None = None
    zeros_b: str | None = None

    @property
    def flop(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n

    @property
    def a_shape(self) -> tuple[int, ...]:
        rows = (self.k, self.m) if self.ta else (self.m, self.k)
        return (self.batch, *rows) if self.batch > 1 else rows

    @property
    def b_shape(self) -> tuple[int, ...]:
        rows = (self.n, self.k) if self.tb else (self.k, self.n)
        return (self.batch, *rows) if self.batch > 1 else rows

    @property
    def spec(self) -> MatmulSpec:
        return MatmulSpec(self.batch, self.m, self.k, self.n, self.ta, self.tb,
                          b_batched=self.batch > 1, zeros_a=self.zeros_a, zeros_b=self.zeros_b)

    def describe(self) -> str:
        a = "Aᵀ" if self.ta else "A"
        b = "Bᵀ" if self.tb else "B"
        lead = f"{self.batch}x" if self.batch > 1 else ""
        return f"{lead}{self.m}x{self.k}x{self.n} {a}{b}"


def shapes(quick: bool) -> list[Shape]:
    """Square sizes, then the GPT's training shapes (rows R = B·T)."""
    squares = (64, 128) if quick else (1024, 2048, 4096)
    c: GPTConfig = GPT_TINY if quick else GPT_FULL
    r, d, h, hd = c.batch * c.t, c.d, c.hidden, c.d // c.heads
    bh = c.batch * c.heads
    return [*(Shape(f"square {n}", n, n, n) for n in squares),
            Shape("fwd up [BT,D]@[D,4D]", r, d, h),
            Shape("fwd down [BT,4D]@[4D,D]", r, h, d),
            Shape("dX up dY@Wᵀ", r, h, d, tb=True),
            Shape("dX down dY@Wᵀ", r, d, h, tb=True),
            Shape("dW up Xᵀ@dY (K=BT)", d, r, h, ta=True),
            Shape("dW down Xᵀ@dY (K=BT)", h, r, d, ta=True),
            Shape("attn q@kᵀ", c.t, hd, c.t, batch=bh, tb=True),
            Shape("attn p@v", c.t, c.t, hd, batch=bh),
            *([] if quick else gpt2_shapes())]


def gpt2_shapes() -> list[Shape]:
    """GPT-2 small's matmuls (R = B·T = 8,192 rows, D = 768, vocabulary V = 50,304)."""
    r, d, v = 32 * 256, 768, 50_304
    t, hd, bh = 256, 64, 32 * 12
    return [Shape("gpt2 head fwd", r, d, v), Shape("gpt2 head dX", r, v, d, tb=True),
            Shape("gpt2 head dW (K=BT)", d, r, v, ta=True),
            Shape("gpt2 qkv fwd", r, d, 3 * d),
            Shape("gpt2 fwd up", r, d, 4 * d), Shape("gpt2 fwd down", r, 4 * d, d),
            Shape("gpt2 dW up (K=BT)", d, r, 4 * d, ta=True),
            *(Shape(f"gpt2 dW up split-K {s}", d, r // s, 4 * d, ta=True, batch=s)
              for s in (2, 4, 8)),
            Shape("gpt2 attn q@kᵀ", t, hd, t, batch=bh, tb=True),
            Shape("gpt2 attn p@v", t, t, hd, batch=bh),
            Shape("gpt2 attn p@v causal", t, t, hd, batch=bh, zeros_a="above"),
            Shape("gpt2 attn pᵀ@dO causal", t, t, hd, batch=bh, ta=True, zeros_a="below")]


def _kernel(device: Any, s: Shape, variant: str) -> tuple[Any, Any, str]:
    """(kernel record, pipeline, variant used) of one matmul; 'auto' = the device's pick."""
    with tracing() as st:
        a = leaf("input", "a", s.a_shape)
        b = leaf("input", "b", s.b_shape)
        out = mm(a, b, s.ta, s.tb)
    graph = st.graph
    graph[out.id].attrs.update({k: z for k, z in (("zeros_a", s.zeros_a),
                                                  ("zeros_b", s.zeros_b)) if z})
    target = Target.for_device(device.limits, device.info)
    storage = target.limits.max_compute_workgroup_storage_size
    used = choose_variant(s.spec, not target.software, storage,
                          target.costly_compiles) if variant == "auto" \
        else variant
    saved = linalg.FORCE_VARIANT
    linalg.FORCE_VARIANT = used
    try:
        kernel = emit_node(graph, graph[out.id], target, OPS)
    finally:
        linalg.FORCE_VARIANT = saved
    return kernel, device.create_kernel(kernel.wgsl, f"matmul-{used}"), used


def _fill(nbytes: int) -> bytes:
    pattern = array.array("f", [((i * 7919) % 1000) / 1000.0 - 0.5 for i in range(4096)])
    block = pattern.tobytes()
    return (block * (nbytes // len(block) + 1))[:nbytes]


async def _time_kernel(device: Any, kernel: Any, pipeline: Any, bufs: tuple[Any, ...],
                       target_s: float, timestamps: bool) -> dict[str, Any]:
    groups = dispatch_size(kernel.threads, kernel.workgroup_size)
    one = device.create_program([Dispatch(pipeline, bufs, groups, "matmul")], 0)
    out = bufs[-1]
    await device.execute(one, [], [(out, 4)])     # first use
    t0 = time.perf_counter()
    await device.execute(one, [], [(out, 4)])
    first = time.perf_counter() - t0
    reps = max(2, min(50, int(target_s / max(first, 1e-6))))
    prog = device.create_program([Dispatch(pipeline, bufs, groups, "matmul")] * reps, 0)
    t0 = time.perf_counter()
    await device.execute(prog, [], [(out, 4)])
    res: dict[str, Any] = {"reps": reps, "wall_ms": (time.perf_counter() - t0) / reps * 1e3}
    if timestamps:
        profile, why = profile_program(device, prog, replays=1)
        if profile is not None:
            res["gpu_ms"] = profile.busy_ms / reps
        else:
            res["gpu_note"] = why
    return res


def _torch_matmul(torch: Any, s: Shape, target_s: float) -> dict[str, Any]:
    dev = torch.device("cuda")
    a = torch.randn(s.a_shape, device=dev)
    b = torch.randn(s.b_shape, device=dev)
    la = a.transpose(-1, -2) if s.ta else a
    lb = b.transpose(-1, -2) if s.tb else b
    torch.matmul(la, lb)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.matmul(la, lb)
    torch.cuda.synchronize()
    reps = max(3, min(200, int(target_s / max(time.perf_counter() - t0, 1e-6))))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        torch.matmul(la, lb)
    end.record()
    torch.cuda.synchronize()
    return {"reps": reps, "gpu_ms": start.elapsed_time(end) / reps}


def tflops(s: Shape, ms: float | None) -> float | None:
    return s.flop / (ms * 1e-3) / 1e12 if ms else None


async def run_matmul(args: Any, device: Any, torch: Any) -> dict[str, Any]:
    """Every shape x variant: {shape, variant, auto pick, times, TFLOP/s}; torch beside."""
    variants = ["auto", *VARIANTS] if not args.variants else \
        [v.strip() for v in args.variants.split(",") if v.strip()]
    timestamps = has_timestamps(device)
    cuda = torch is not None and torch.cuda.is_available()
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
    target_s = 0.02 if args.quick else 0.2
    print(f"tensorgrad device: {device.description} (timestamps: "
          f"{'yes' if timestamps else 'n/a: wall clock'})", flush=True)
    where = f"CUDA {torch.cuda.get_device_name(0)}, TF32 off" if cuda else "n/a (no CUDA)"
    print(f"torch.matmul: {where}", flush=True)
    rows = []
    wanted = [w.strip() for w in (args.shapes or "").split(",") if w.strip()]
    for s in shapes(args.quick):
        if wanted and not any(w in s.name for w in wanted):
            continue
        row: dict[str, Any] = {"shape": s.name, "mkn": s.describe(), "flop": s.flop,
                               "auto": choose_variant(
                                   s.spec, not device.info.software,
                                   device.limits.max_compute_workgroup_storage_size),
                               "variants": {}}
        bufs = []
        try:
            for shape in (s.a_shape, s.b_shape, (s.batch * s.m * s.n,)):
                nbytes = 4
                for v in shape:
                    nbytes *= v
                buf = device.create_buffer(nbytes, "matmul-bench")
                bufs.append(buf)
                if len(bufs) < 3:
                    device.write_buffer(buf, _fill(nbytes))
            for variant in variants:
                try:
                    kernel, pipeline, used = _kernel(device, s, variant)
                    res = await _time_kernel(device, kernel, pipeline, tuple(bufs), target_s,
                                             timestamps)
                    res["variant"] = used
                except Exception as err:  # noqa: BLE001 - a variant failing: say so, go on
                    res = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"}
                ms = res.get("gpu_ms", res.get("wall_ms"))
                res["tflops"] = tflops(s, ms)
                res["tflops_wall"] = tflops(s, res.get("wall_ms"))
                row["variants"][variant] = res
        finally:
            for buf in bufs:
                device.destroy_buffer(buf)
        if cuda:
            try:
                t = _torch_matmul(torch, s, target_s)
                t["tflops"] = tflops(s, t["gpu_ms"])
                row["torch"] = t
            except Exception as err:  # noqa: BLE001
                row["torch"] = {"error": f"{type(err).__name__}: {err}"}
        rows.append(row)
        print(f"  {s.name}: " + ", ".join(
            f"{v} {_fmt(r.get('tflops'))}" for v, r in row["variants"].items()), flush=True)
    return {"device": device.description, "timestamps": timestamps, "variants": variants,
            "torch": "cuda, tf32 off" if cuda else None, "matmul": rows}


def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.2f}" if x >= 1 else f"{x:.3g}"


def print_matmul(report: dict[str, Any], table: Any) -> None:
    """Print `report` (from :func:`run_matmul`) with `table(header, rows)`."""
    variants = report["variants"]
    unit = "GPU timestamps" if report["timestamps"] else "wall clock"
    header = ["shape", "MxKxN", *variants, "auto =", "torch"]
    rows = []
    for r in report["matmul"]:
        cells = [_fmt(r["variants"][v].get("tflops")) if "error" not in r["variants"][v]
                 else "err" for v in variants]
        torch_cell = _fmt(r["torch"].get("tflops")) if "torch" in r else "n/a"
        rows.append([r["shape"], r["mkn"], *cells, r["auto"], torch_cell])
    print(f"\nf32 matmul TFLOP/s ({unit}; torch.matmul with TF32 off)")
    print(table(header, rows))
    errors = [(r["shape"], v, res["error"]) for r in report["matmul"]
              for v, res in r["variants"].items() if "error" in res]
    for shape, v, err in errors:
        print(f"  {shape} {v}: {err}")
