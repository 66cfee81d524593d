#!/usr/bin/env python3
"""Planned GPU memory of a training step, without a device: where the peak goes.

    python bench/memory.py                 # GPT-2 small (T 256, batch 32), f32 and mixed
    python bench/memory.py mlp cnn         # other models of bench/models.py
    python bench/memory.py --top 20        # more of the biggest tensors alive at the peak

Each model is compiled up to the plan stage for an H200-like device's limits (2 GiB buffers
and bindings) in f32 and in precision="mixed". Per plan: the peak (all buffers together),
the buffers by kind, the pooled intermediates' bytes against the largest set of them alive
at one node (what a perfect packing would need), the optimizer's buffers, the planning time,
and the biggest tensors alive at that node, by node label.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import make_bench
from tensorgrad.codegen.kernel import Target
from tensorgrad.compiler import Options, Request, compile_graph
from tensorgrad.gpu.interface import DeviceLimits
from tensorgrad.ir import Graph
from tensorgrad.plan import BufferPlan, plan_buffers

H200_LIKE = DeviceLimits(max_storage_buffer_binding_size=2147483644, max_buffer_size=2147483644,
                         max_storage_buffers_per_shader_stage=16,
                         max_compute_workgroup_storage_size=32768)
GIB = 2 ** 30


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= 2 ** 26 else f"{n / 2**20:.2f} MiB"


def live_pooled(graph: Graph, plan: BufferPlan) -> tuple[int, int, list[int]]:
    """(the largest bytes of pooled nodes alive at one node, that node, the nodes alive
    there): a node lives from its own step to its last reader's (a view's reads count for
    its source), one that outlives the step (plan.persistent) to the end; an arena counts
    whole from the first node it holds."""
    persistent = getattr(plan, "persistent", frozenset())  # (main before the packed pool)
    last = [len(graph.nodes) - 1 if n.id in persistent else n.id for n in graph.nodes]
    for n in graph.nodes:
        for i in n.inputs:
            src = plan.views.get(i, i)
            while src in plan.views:
                src = plan.views[src]
            last[src] = max(last[src], n.id)
    pooled = [n.id for n in graph.nodes if n.id not in plan.views
              and plan.buffers[plan.node_buffer[n.id]].pooled]
    held = {x for p in plan.packed for x in graph[p].inputs}
    for p in plan.packed:
        if p in pooled:
            first = min(graph[p].inputs)
            last[first] = max(last[first], *(last[x] for x in (p, *graph[p].inputs)))
    pooled = [i for i in pooled if i not in held]
    first_of = {p: min(graph[p].inputs) for p in plan.packed}
    delta = [0] * (len(graph.nodes) + 1)
    for i in pooled:
        start = first_of.get(i, i)
        end = last[start] if i in first_of else last[i]
        delta[start] += graph[i].buffer_bytes
        delta[end + 1] -= graph[i].buffer_bytes
    best, at, run = 0, 0, 0
    for k in range(len(graph.nodes)):
        run += delta[k]
        if run > best:
            best, at = run, k
    alive = [i for i in pooled if first_of.get(i, i) <= at <= last[first_of.get(i, i)]]
    return best, at, alive


def report(name: str, precision: str, top: int) -> int:
    """Print the figures of `name`'s training step in `precision`; return the peak."""
    b = make_bench(name)
    c = compile_graph(Request("training", b.model, b.loss, b.inputs, b.optimizer, seed=0),
                      Options(limits=H200_LIKE, target=Target(limits=H200_LIKE),
                              precision=precision), until="emit")
    graph = c.graph
    from tensorgrad.compiler import LAYOUT_OPS
    t0 = time.perf_counter()
    plan = plan_buffers(graph, grads=c.grads, writebacks=c.writebacks, limits=H200_LIKE,
                   layout_ops=LAYOUT_OPS)
    seconds = time.perf_counter() - t0
    by_kind: Counter[str] = Counter()
    for buf in plan.buffers:
        by_kind["pool" if buf.pooled else buf.kind] += buf.size
    live, at, alive = live_pooled(graph, plan)
    sources = {wb.source for wb in plan.writebacks}
    opt = sum(plan.buffers[plan.node_buffer[s]].size for s in sources
              if not plan.buffers[plan.node_buffer[s]].pooled)
    kernels = sum(1 for k in c.kernels if k.threads > 0)
    print(f"{name} {precision}: peak {_gib(plan.peak_bytes)} in {len(plan.buffers)} buffers, "
          f"{kernels} kernels ({len(graph.nodes)} nodes, planned in {seconds:.2f} s)")
    print("  by kind: " + ", ".join(f"{k} {_gib(v)}" for k, v in by_kind.most_common()))
    print(f"  pool {_gib(by_kind['pool'])} for at most {_gib(live)} alive (at %{at} "
          f"{graph[at].label}); optimizer writeback sources outside the pool {_gib(opt)}")
    print(f"  biggest alive at %{at}:")
    for i in sorted(alive, key=lambda i: -graph[i].buffer_bytes)[:top]:
        n = graph[i]
        print(f"    %{i:<6} {n.label:<28} {n.dtype}{list(n.shape)}  {_gib(n.buffer_bytes)}")
    return plan.peak_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["gpt2"])
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    for name in args.models:
        peaks = {p: report(name, p, args.top) for p in ("f32", "mixed")}
        print(f"{name}: f32 {_gib(peaks['f32'])}, mixed {_gib(peaks['mixed'])} "
              f"({1 - peaks['mixed'] / peaks['f32']:.2%} less)\n")


if __name__ == "__main__":
    main()
