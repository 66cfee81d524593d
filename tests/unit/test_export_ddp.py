"""The exported model trains under torchrun: DistributedDataParallel on CPU, 2 processes, gloo.

The worker (tests/unit/torch_ddp_worker.py) trains the exported MLP with SGD on sin(x), each
rank on its own half of every batch; rank 0 checks the result against an undistributed
replica trained on the whole batches (DDP averages the two halves' gradients, so both must
end with the same weights)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import tensorgrad as tg
from tests.models import mlp_sin

WORKER = Path(__file__).with_name("torch_ddp_worker.py")


def test_torchrun_ddp_trains_the_export(tmp_path: Path) -> None:
    m = mlp_sin()
    ex = tg.export.torch(m.MLP(), inputs=m.PREDICT_INPUTS, seed=1, path=tmp_path / "mlp_torch.py")
    assert ex.weights_path == tmp_path / "mlp_torch.safetensors"
    # loopback only: gloo pairs connect over lo (a host name resolving elsewhere can abort)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(WORKER), str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    result = json.loads((tmp_path / "ddp_result.json").read_text())
    print(f"\ntorchrun DDP (gloo, 2 CPU processes): {result}")
    assert result["world"] == 2 and result["backend"] == "gloo", result
    assert result["ranks_max_diff"] == 0.0, result          # DDP keeps the ranks in sync
    assert result["replica_max_diff"] < 1e-4, result        # = full-batch training
    assert result["first_loss"] > 0.1 and result["last_loss"] < 0.02, result
