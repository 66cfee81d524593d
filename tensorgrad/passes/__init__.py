"""Graph -> Graph passes."""

from .dce import eliminate_dead_code
from .fuse import fuse_elementwise

__all__ = ["eliminate_dead_code", "fuse_elementwise"]
