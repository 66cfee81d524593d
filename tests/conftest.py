"""Fixtures shared by the test layers: the documentation site, built once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def docs_site() -> Path:
    """dist/docs/ built from this tree by `python build.py docs` (mkdocs build --strict): a
    broken cross-reference or link fails it."""
    sys.path.insert(0, str(ROOT))
    import build

    try:
        return build.build_docs()
    except SystemExit as exc:
        pytest.fail(f"python build.py docs failed: {exc}")
