"""Errors raised while building or running a graph."""

from __future__ import annotations

import os
import sys
import sysconfig

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Frames from the standard library (asyncio's event loop, ...) are never the user's line;
# installed packages (site-packages, under the stdlib folder) can be.
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def _is_internal(filename: str) -> bool:
    if filename.startswith(("<frozen", _PACKAGE_DIR + os.sep)):
        return True
    return filename.startswith(_STDLIB_DIR) and "-packages" + os.sep not in filename


def user_call_site(limit: int = 3) -> str:
    """The innermost frames outside the tensorgrad package, as 'file:line in func' lines."""
    frame = sys._getframe(1)
    lines: list[str] = []
    while frame is not None and len(lines) < limit:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not _is_internal(filename) and not frame.f_code.co_filename.startswith("<frozen"):
            lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return "\n".join(lines)


class ShapeError(ValueError):
    """A shape, dtype or argument mistake found while tracing.

    The message names the op, the shapes/dtypes involved and what was expected; `site` holds
    the user's own call site (the innermost frames outside tensorgrad)."""

    def __init__(self, op: str, message: str, site: str | None = None):
        self.op = op
        self.site = user_call_site() if site is None else site
        text = f"{op}: {message}"
        if self.site:
            text += "\n  at " + "\n  at ".join(self.site.splitlines())
        super().__init__(text)


class TraceError(RuntimeError):
    """Misuse of the tracer: an op outside a trace, nested traces, duplicate names."""
