"""The package version (one place: pyproject.toml must say the same, tests check it)."""

__version__ = "0.1.0"
