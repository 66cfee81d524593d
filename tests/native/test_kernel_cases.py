"""Every op case of every family (tests/unit/test_ops_*.py CASES), forward and backward,
kernel by kernel on a real WebGPU device against the reference interpreter, once as a GPU
target and once as a software target (CPU rasterisers get other kernels)."""

from __future__ import annotations

import pytest

from tensorgrad.codegen.kernel import Target
from tests.harness import Case
from tests.kernel_check import check_case
from tests.unit.op_tests import all_cases, params_for


@pytest.mark.parametrize("software", [False, True], ids=["gpu", "software"])
@pytest.mark.parametrize("case", params_for(all_cases()))
def test_case_kernels(gpu_device, case: Case, software: bool) -> None:
    check_case(gpu_device, case, target=Target(limits=gpu_device.limits, software=software))
