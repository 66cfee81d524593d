"""Every op case of every family (tests/unit/test_ops_*.py CASES), forward and backward, with
its tensors stored as f16 (mixed precision: `half_graph`), kernel by kernel on a real WebGPU
device against the reference interpreter (which rounds what an f16 node stores to f16), as a
GPU target and as a software target. The device needs `shader-f16` (lavapipe has it)."""

from __future__ import annotations

import pytest

from tensorgrad.codegen.kernel import Target
from tests.harness import Case
from tests.kernel_check import check_case
from tests.unit.op_tests import all_cases, params_for


@pytest.mark.parametrize("software", [False, True], ids=["gpu", "software"])
@pytest.mark.parametrize("case", params_for(all_cases()))
def test_case_kernels_f16(gpu_device, case: Case, software: bool) -> None:
    assert "shader-f16" in gpu_device.info.features, gpu_device.info
    check_case(gpu_device, case, half=True,
               target=Target(limits=gpu_device.limits, software=software))
