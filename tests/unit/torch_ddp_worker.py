"""One rank of the DDP test (tests/unit/test_export_ddp.py), started by torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node 2 torch_ddp_worker.py DIR

Loads the exported model DIR/mlp_torch.py with its weights, wraps it in DistributedDataParallel
(gloo, CPU) and trains it with SGD on sin(x): each rank draws its own half of every batch.
Rank 0 also trains an undistributed replica on the whole batch (the concatenation of both
halves), which DDP's gradient averaging must reproduce, and writes DIR/ddp_result.json.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.nn.parallel import DistributedDataParallel

STEPS, HALF, LR = 300, 64, 0.1


def load(folder: Path) -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("mlp_torch", folder / "mlp_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.MLP()
    model.load_state_dict(load_file(str(folder / "mlp_torch.safetensors")))
    return model


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = (torch.rand(HALF, 1, generator=gen) * 2 - 1) * math.pi
    return x, torch.sin(x)


def main() -> None:
    folder = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(load(folder))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    replica = load(folder) if rank == 0 else None
    ropt = torch.optim.SGD(replica.parameters(), lr=LR, momentum=0.9) if replica else None
    t0 = time.perf_counter()
    losses = []
    for step in range(STEPS):
        x, y = batch(step, rank)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        losses.append(avg.item() / world)
        if replica is not None:
            parts = [batch(step, r) for r in range(world)]
            xs, ys = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            rloss = ((replica(xs) - ys) ** 2).mean()
            ropt.zero_grad()
            rloss.backward()
            ropt.step()
    seconds = time.perf_counter() - t0
    flat = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        rflat = torch.cat([p.detach().reshape(-1) for p in replica.parameters()])
        result = {
            "world": world, "steps": STEPS, "batch_per_rank": HALF, "seconds": seconds,
            "first_loss": losses[0], "last_loss": sum(losses[-10:]) / 10,
            "ranks_max_diff": max(float((g - gathered[0]).abs().max()) for g in gathered),
            "replica_max_diff": float((rflat - flat).abs().max()),
            "backend": dist.get_backend(),
        }
        (folder / "ddp_result.json").write_text(json.dumps(result))
    dist.barrier()  # both ranks leave together (a rank that exits early can abort gloo's peer)
    # Leave without running gloo's and the TCP store's C++ destructors: their threads can still
    # be joinable at exit, and std::terminate then aborts a rank that has finished its work
    # ("terminate called without an active exception", seen in CI after the result was written).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
