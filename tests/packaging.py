"""Builds of the distribution for the packaging tests: setuptools' wheel and sdist of a copy of
the checkout (`python -m build`, the pinned `build` of the test extra), and readers for what
they hold. The copy keeps the build's egg-info and build/ folders out of the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What never goes into a build: VCS data, installed and built files, caches.
_NOT_COPIED = shutil.ignore_patterns(".git", "node_modules", "dist", "build", "__pycache__",
                                     "*.pyc", "*.egg-info", ".pytest_cache", ".ruff_cache")


def build_dists(workdir: Path) -> tuple[Path, Path]:
    """(wheel, sdist) built by setuptools from a copy of the checkout under `workdir`.

    `--no-isolation` uses the installed setuptools (the test extra pins setuptools>=77) rather
    than fetching one; `-P` keeps the copy's own build.py from shadowing the `build` module."""
    source, out = workdir / "source", workdir / "dists"
    shutil.copytree(ROOT, source, ignore=_NOT_COPIED)
    done = subprocess.run([sys.executable, "-P", "-m", "build", "--no-isolation", "--outdir",
                           str(out), str(source)], cwd=workdir, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, f"python -m build failed:\n{done.stdout}\n{done.stderr}"
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return wheels[0], sdists[0]


def wheel_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return sorted(zf.namelist())


def wheel_metadata(wheel: Path) -> tuple[list[tuple[str, str]], str]:
    """The METADATA headers of `wheel` as (field, value) pairs in order, and its body."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode()
    message = HeaderParser().parsestr(text)
    return [(k, str(v)) for k, v in message.items()], message.get_payload()


def sdist_files(sdist: Path) -> list[str]:
    """The sdist's files, relative to its top folder (name-version/)."""
    with tarfile.open(sdist) as tf:
        names = [m.name for m in tf.getmembers() if m.isfile()]
    return sorted(n.split("/", 1)[1] for n in names)
