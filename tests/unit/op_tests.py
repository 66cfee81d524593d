"""Parametrized checks every op family test file runs over its CASES list."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from types import ModuleType

import numpy as np
import pytest

from tests.harness import (
    Case,
    assert_close,
    build,
    fd_grads,
    run_reference,
    torch_forward_and_grads,
)


def forward_check(case: Case) -> None:
    b = build(case, with_grad=False)
    got = run_reference(b)[b.out]
    if case.torch_fn is not None:
        want, _ = torch_forward_and_grads(Case(**{**case.__dict__, "grad": False}), b)
    elif case.np_fn is not None:
        want = case.np_fn(*[b.values[f"a{k}"] for k in range(len(case.args))])
    else:
        pytest.fail(f"{case.id} has neither torch_fn nor np_fn")
    if np.asarray(got).dtype.kind in "biu":
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(got.dtype))
    else:
        assert_close(got, want, case.rtol, case.atol, f"{case.id} forward")


def grad_torch_check(case: Case) -> None:
    b = build(case)
    vals = run_reference(b)
    _, want = torch_forward_and_grads(case, b)
    assert set(want) == set(b.grads), f"{case.id}: grads for {set(b.grads)} vs {set(want)}"
    for name, gid in b.grads.items():
        assert_close(vals[gid], want[name], max(case.rtol, 1e-4), max(case.atol, 1e-4),
                     f"{case.id} d/d{name} vs torch")


def grad_fd_check(case: Case) -> None:
    b = build(case)
    vals = run_reference(b, float_dtype=np.float64)
    fd = fd_grads(case, b)
    for name, gid in b.grads.items():
        assert_close(vals[gid], fd[name], 5e-3, 5e-3, f"{case.id} d/d{name} vs finite diff")


def family_modules() -> list[ModuleType]:
    """The op family test modules: tests/unit/test_ops_*.py (each exports CASES)."""
    import tests.unit as unit_tests

    return [importlib.import_module(f"tests.unit.{info.name}")
            for info in pkgutil.iter_modules(unit_tests.__path__)
            if info.name.startswith("test_ops_")]


def all_cases() -> list[Case]:
    """Every family's CASES, in module order."""
    return [case for mod in family_modules() for case in mod.CASES]


def params_for(cases: Sequence[Case], grad: bool = False, fd: bool = False) -> list:
    out = []
    for c in cases:
        if grad and not c.grad:
            continue
        if fd and not (c.grad and c.fd):
            continue
        out.append(pytest.param(c, id=c.id))
    return out
