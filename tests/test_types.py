"""The type checker runs clean on ``tensorgrad/``.

mypy (pinned in the `test` extra) with the configuration of pyproject.toml (``[tool.mypy]``:
strict, with the overrides it explains). Any error fails the test, listing mypy's report.
The run has its own cache directory under pytest's temporary folder, so a stale cache of a
working tree never hides an error; ``TENSORGRAD_MYPY_CACHE`` names a cache to reuse between
runs instead (a warm run takes seconds instead of about a minute).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MYPY_PIN = "2.4.1"


def _mypy(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(cache), *args],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for this module's runs (the planted check reuses the package's analysis)."""
    named = os.environ.get("TENSORGRAD_MYPY_CACHE")
    return Path(named) if named else tmp_path_factory.mktemp("mypy-cache")


def test_mypy_is_the_pinned_version() -> None:
    import mypy.version

    assert mypy.version.__version__ == MYPY_PIN, (
        f"mypy {mypy.version.__version__} is installed, the test extra pins {MYPY_PIN}: "
        f'pip install "mypy=={MYPY_PIN}"')
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"mypy=={MYPY_PIN}"' in pyproject


def test_the_package_type_checks(cache: Path) -> None:
    result = _mypy(cache=cache)
    report = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and "Success: no issues found" in report, (
        f"mypy found type errors in tensorgrad/:\n{report}")


def test_the_checker_reports_a_planted_error(cache: Path, tmp_path: Path) -> None:
    """The same configuration fails on a module that passes a str where the IR wants a
    DType, and on one that hands a kernel where a buffer handle is expected: so a clean run
    above means something."""
    bad = tmp_path / "planted.py"
    bad.write_text(
        "from tensorgrad.gpu.interface import GPUDevice, KernelHandle\n"
        "from tensorgrad.ir import Graph\n\n\n"
        "def f(graph: Graph, device: GPUDevice, kernel: KernelHandle, name: str) -> None:\n"
        "    graph.add('input', (), {}, (1,), name)\n"
        "    device.destroy_buffer(kernel)\n")
    result = _mypy(str(bad), cache=cache)
    report = result.stdout
    assert result.returncode == 1, report
    assert 'Argument 5 to "add" of "Graph" has incompatible type "str"' in report, report
    assert 'Argument 1 to "destroy_buffer" of "GPUDevice" has incompatible type ' \
           '"KernelHandle"; expected "BufferHandle"' in report, report
