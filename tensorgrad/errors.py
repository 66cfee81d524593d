"""Errors raised while building or running a graph."""

from __future__ import annotations

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def user_call_site(limit: int = 3) -> str:
    """The innermost frames outside the tensorgrad package, as 'file:line in func' lines."""
    frame = sys._getframe(1)
    lines: list[str] = []
    while frame is not None and len(lines) < limit:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_PACKAGE_DIR) and not filename.startswith("<frozen"):
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
