"""Every op case of every family (the CASES lists of tests/unit/test_ops_*.py): forward
against PyTorch (or NumPy), gradients against PyTorch autograd and against float64 finite
differences through the reference interpreter."""

from __future__ import annotations

import pytest

from tests.harness import Case
from tests.unit.op_tests import (
    all_cases,
    forward_check,
    grad_fd_check,
    grad_torch_check,
    params_for,
)

CASES = all_cases()


@pytest.mark.parametrize("case", params_for(CASES))
def test_forward(case: Case) -> None:
    forward_check(case)


@pytest.mark.parametrize("case", params_for(CASES, grad=True))
def test_grad_vs_torch(case: Case) -> None:
    grad_torch_check(case)


@pytest.mark.parametrize("case", params_for(CASES, fd=True))
def test_grad_vs_finite_differences(case: Case) -> None:
    grad_fd_check(case)
