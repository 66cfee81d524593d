"""The public namespace: everything `tg.__all__` lists exists, every public exception is
exported, and the version is the one in pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import tensorgrad as tg
from tensorgrad.errors import ERRORS


def test_all_names_exist() -> None:
    missing = [name for name in tg.__all__ if not hasattr(tg, name)]
    assert not missing, f"tg.__all__ lists names tensorgrad lacks: {missing}"


def test_every_public_exception_is_exported() -> None:
    assert set(ERRORS) <= set(tg.__all__)
    assert all(getattr(tg, name) is cls for name, cls in ERRORS.items())


def test_version_matches_pyproject() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml")
                              .read_text())
    assert tg.__version__ == pyproject["project"]["version"]
