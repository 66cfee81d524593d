"""Every Python code block of the README and of docs/ runs, natively, as written.

The blocks of one page run in order in one namespace (a page is one session, like a notebook),
top-level ``await`` allowed, in a fresh working folder, on the suite's native WebGPU device.
Blocks fenced ``{.python .no-run}`` are fragments that cannot run (tests/unit/test_docs.py
keeps them few); ``{.python .worker}`` blocks are worker scripts, run in the browser by
tests/browser/test_docs_examples.py."""

from __future__ import annotations

import ast
import asyncio
import inspect
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import docsite
from tensorgrad import api


def native_blocks(path: Path) -> list[docsite.Block]:
    return [b for b in docsite.code_blocks(path) if b.lang == "python" and not b.classes]


PAGES = [p for p in docsite.guide_files() if native_blocks(p)]


def run_page(path: Path, folder: Path) -> None:
    """Run the page's Python blocks in order, in one module namespace whose source file
    mirrors the page (each block at its own line numbers), so tracebacks name the page's
    lines and `inspect` finds the classes the blocks define."""
    blocks = native_blocks(path)
    lines = [""] * (len(path.read_text().splitlines()) + 1)
    for b in blocks:
        for k, line in enumerate(b.code.splitlines()):
            lines[b.line - 1 + k] = line
    name = f"docs_{path.stem.replace('-', '_')}"
    source = folder / f"{name}.py"
    source.write_text("\n".join(lines) + "\n")
    module = types.ModuleType(name)
    module.__file__ = str(source)
    sys.modules[name] = module
    loop = asyncio.new_event_loop()
    try:
        for b in blocks:
            tree = ast.parse(b.code, str(source))
            ast.increment_lineno(tree, b.line - 1)
            code = compile(tree, str(source), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            try:
                if code.co_flags & inspect.CO_COROUTINE:
                    loop.run_until_complete(eval(code, module.__dict__))
                else:
                    exec(code, module.__dict__)  # noqa: S102
            except BaseException as err:
                err.add_note(f"in the code block at {b.where}")
                raise
    finally:
        loop.close()
        sys.modules.pop(name, None)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path: Path, gpu_device, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(api, "_default_device", gpu_device)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_page(path, tmp_path)
