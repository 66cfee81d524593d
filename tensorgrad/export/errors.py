"""The exporter's error."""

from __future__ import annotations


class ExportError(ValueError):
    """Something the exporter cannot write: names the op (``op``) and what is unsupported."""

    def __init__(self, message: str, op: str | None = None):
        self.op = op
        super().__init__(f"export.torch: {message}")
