"""The wheel as a user gets it: built by setuptools, installed with its `native` extra into a
fresh virtual environment (pip resolves wgpu and its dependencies from the configured index,
reusing pip's cache), `pip check` clean, and the README's first model trained from there on
the native device (lavapipe unless a Vulkan driver variable says otherwise).

47-56 s measured on the project's 2-core machine while other work loaded it (load 8-12),
13 s of it CPU time: the build, pip's install (most of the wait: index look-ups and
unpacking numpy) and about 6 s of training."""

from __future__ import annotations

import fnmatch
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from tensorgrad.gpu.vulkan import vulkan_driver_manifests
from tests.packaging import ROOT, build_dists

DRIVER_VARS = ("VK_ICD_FILENAMES", "VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES")


def readme_first_model() -> str:
    """The README's first ```python block (the model a newcomer runs first)."""
    match = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert match, "README.md has no ```python block"
    return match[1]


def _pip(venv_python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter's pip acting on the venv (`--python`): the venv needs no pip."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(venv_python), *args],
                          capture_output=True, text=True, check=False, timeout=480)


def _lavapipe_env() -> dict[str, str]:
    env = dict(os.environ)
    if not any(env.get(v) for v in DRIVER_VARS):
        lavapipe = [m for m in vulkan_driver_manifests()
                    if fnmatch.fnmatch(os.path.basename(m), "lvp_icd*.json")]
        assert lavapipe, "no lavapipe Vulkan driver (apt-get install mesa-vulkan-drivers)"
        env["VK_ICD_FILENAMES"] = lavapipe[0]
    return env


def test_wheel_installs_in_a_fresh_venv_and_trains_the_readme_model(tmp_path: Path) -> None:
    wheel, _ = build_dists(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    done = _pip(python, "install", "-q", "--no-compile", f"{wheel}[native]")
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    check = _pip(python, "check")
    assert check.returncode == 0 and "No broken requirements" in check.stdout, check.stdout
    listed = _pip(python, "list", "--format=freeze").stdout
    assert re.search(r"^tensorgrad-webgpu==0\.1\.0$", listed, re.MULTILINE), listed
    assert re.search(r"^wgpu==0\.32\.0$", listed, re.MULTILINE), listed

    run_dir = tmp_path / "run"  # -I: no cwd, PYTHONPATH or user site on sys.path
    run_dir.mkdir()
    env = _lavapipe_env()
    where = subprocess.run(
        [str(python), "-I", "-c", ("import asyncio, tensorgrad as tg; print(tg.__file__); "
         "print(asyncio.run(tg.default_device()).description)")],
        cwd=run_dir, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert where.returncode == 0, where.stderr
    module, device = where.stdout.splitlines()[:2]
    assert Path(module).is_relative_to(venv), f"tensorgrad imported from {module}, not the venv"
    print(f"\nthe README model in a fresh venv on {device}")

    script = run_dir / "first_model.py"
    script.write_text(readme_first_model())
    out = subprocess.run([str(python), "-I", str(script)], cwd=run_dir, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, f"the README model failed:\n{out.stdout}\n{out.stderr}"
    losses = [float(v) for v in re.findall(r"loss ([0-9.eE+-]+)", out.stdout)]
    assert losses and losses[-1] < 0.01, out.stdout
    prediction = [float(v) for v in re.findall(r"-?\d+\.\d+(?:[eE][+-]?\d+)?",
                                               out.stdout.strip().splitlines()[-1])]
    assert len(prediction) == 1 and abs(prediction[0] - math.sin(0.5)) < 0.15, out.stdout
    print(out.stdout.strip())
