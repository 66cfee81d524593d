"""Graph -> Graph passes."""

from .dce import eliminate_dead_code

__all__ = ["eliminate_dead_code"]
