"""The browser GPU adapter (tensorgrad.gpu.browser) inside the worker: the same checks as the
native adapter's, run there through exec, and FFI calls per step independent of kernel count."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import Page

CHECKS_SOURCE = (Path(__file__).parent / "adapter_checks.py").read_text()


@pytest.fixture(scope="module")
def gpu(tg_page: Page) -> Page:
    """The shared worker with the checks defined and `dev`, a browser device."""
    tg_page.exec(CHECKS_SOURCE)
    tg_page.exec("from tensorgrad.gpu.browser import request_browser_device\n"
                 "dev = await request_browser_device()")
    return tg_page


def test_device_limits_and_description(gpu: Page) -> None:
    info = gpu.exec_json("{'description': dev.description, 'limits': vars(dev.limits)}")
    print("\nbrowser device:", info)
    assert "(browser)" in info["description"]
    limits = info["limits"]
    assert limits["max_compute_workgroups_per_dimension"] >= 65535
    assert limits["max_storage_buffer_binding_size"] >= 128 << 20
    assert limits["max_compute_invocations_per_workgroup"] >= 256


@pytest.mark.parametrize("name", ["add", "slices", "dispatch_2d", "chunking",
                                  "copies_in_order", "bad_wgsl", "kernel_batch", "release"])
def test_adapter_check(gpu: Page, name: str) -> None:
    facts = gpu.exec_json(f"await CHECKS[{name!r}](dev)")
    print(f"\n{name}:", facts)


def test_kernel_compile_is_checked_synchronously(gpu: Page) -> None:
    """JSPI lets create_kernel wait for WebGPU's asynchronous compile check."""
    assert gpu.exec("from pyodide.ffi import can_run_sync\ncan_run_sync()") == "True"
    assert gpu.exec("len(dev._unchecked)") == "0"


def test_ffi_calls_per_step_do_not_grow_with_kernels(gpu: Page) -> None:
    small = gpu.exec_json("await ffi_calls_per_step(dev, 10)")
    large = gpu.exec_json("await ffi_calls_per_step(dev, 200)")
    print(f"\nFFI calls per step: {small} / {large}")
    assert small["ffi_calls"] == large["ffi_calls"] <= 4


def test_execute_error_is_raised_in_python(gpu: Page) -> None:
    """A WebGPU validation error during a step becomes a Python exception (no silent NaNs)."""
    src = """
from tensorgrad.gpu.interface import Dispatch
small = dev.create_buffer(16, "small")
k = dev.create_kernel(ADD_WGSL, "add")
# three bindings wanted, one given: the bind group is invalid
p = dev.create_program([Dispatch(k, (small,), (1, 1, 1), "add")], 0)
try:
    await dev.execute(p, [], [(small, 16)])
    outcome = "no error"
except Exception as e:
    outcome = type(e).__name__ + ": " + str(e)
outcome
"""
    outcome = gpu.exec(src)
    assert "validation" in outcome.lower() and "create_program" in outcome, outcome
