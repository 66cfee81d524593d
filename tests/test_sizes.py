"""The size rule: no module of ``tensorgrad/`` over MAX_FILE_LINES lines, no function (or
method) over MAX_FUNCTION_LINES lines, so each reads in one sitting.

A function's length runs from its ``def`` (decorators included) to its last line; a nested
function counts in its own right and inside the function that holds it. Run this file as a
script to list every offender: ``python tests/test_sizes.py``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tensorgrad"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60


def _functions(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(qualified name, first line, line count) of every function and method of `tree`."""
    found: list[tuple[str, int, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                end = child.end_lineno or child.lineno
                found.append((prefix + child.name, start, end - start + 1))
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def oversized(package: Path = PACKAGE) -> list[str]:
    """Every file over MAX_FILE_LINES and function over MAX_FUNCTION_LINES under `package`,
    one line each ("path: N lines" / "path:line name: N lines")."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            out.append(f"{rel}: {lines} lines (at most {MAX_FILE_LINES})")
        for name, start, count in _functions(ast.parse(text, rel)):
            if count > MAX_FUNCTION_LINES:
                out.append(f"{rel}:{start} {name}: {count} lines (at most "
                           f"{MAX_FUNCTION_LINES})")
    return out


def test_the_walker_measures_files_and_functions(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"        x{k} = {k}" for k in range(MAX_FUNCTION_LINES))
    (pkg / "long.py").write_text(f"class A:\n    @staticmethod\n    def f():\n{body}\n"
                                 + "\n" * MAX_FILE_LINES)
    (pkg / "short.py").write_text("def g():\n    return 1\n")
    found = oversized(pkg)
    file_lines = MAX_FUNCTION_LINES + 3 + MAX_FILE_LINES
    assert found == [f"pkg/long.py: {file_lines} lines (at most {MAX_FILE_LINES})",
                     (f"pkg/long.py:2 A.f: {MAX_FUNCTION_LINES + 2} lines (at most "
                      f"{MAX_FUNCTION_LINES})")], found


def test_no_file_or_function_is_too_long() -> None:
    found = oversized()
    assert not found, "over the size rule (split along a real seam):\n  " + "\n  ".join(found)


if __name__ == "__main__":
    found = oversized()
    print("\n".join(found) or "all within the size rule")
    sys.exit(1 if found else 0)
