"""Graph → Graph passes, registered in one list that the compiler runs in order.

A pass takes a graph and its roots (node ids that must survive and stay materialised: the
output, param gradients, writeback sources) and returns the new graph and the map old id →
new id of every surviving node; the compiler re-points its ids through that map. Each pass
runs at one phase of the pipeline: right after autograd (before the optimizer is appended),
or after the optimizer (on the whole step). Forward graphs run both phases too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from ..ir import Graph
from .dce import eliminate_dead_code
from .fuse import fuse_elementwise
from .packs import separate_pack_members
from .precision import store_half
from .split_k import split_long_contractions
from .split_reduce import split_column_sums
from .stitch import stitch_kernels
from .triangles import mark_zero_triangles

Phase = Literal["after_autograd", "after_optimizer"]
PassFn = Callable[[Graph, Iterable[int]], tuple[Graph, dict[int, int]]]


@dataclass(frozen=True)
class Pass:
    """One registered pass: `run(graph, roots)` at `phase`; `option` names the boolean compile
    option (or property of the options) that turns it on (None: always on)."""

    name: str
    phase: Phase
    run: PassFn
    option: str | None = None


PASSES: list[Pass] = [
    # Gradients nobody reads (frozen inputs) are dropped before the optimizer sees them.
    Pass("eliminate dead code", "after_autograd", eliminate_dead_code),
    # Mixed precision: which activations are stored as f16 (before the optimizer: params,
    # gradients and optimizer state stay f32; later passes keep each node's dtype).
    Pass("store activations as f16", "after_autograd", store_half, option="mixed"),
    Pass("split long contractions", "after_optimizer", split_long_contractions,
         option="parallel_gpu"),
    Pass("split column sums", "after_optimizer", split_column_sums, option="parallel_gpu"),
    # After the splits (a split contraction is no longer triangular), before fusion.
    Pass("mark zero triangles of matmul operands", "after_optimizer", mark_zero_triangles),
    Pass("fuse elementwise chains", "after_optimizer", fuse_elementwise, option="fuse"),
    Pass("stitch prologues and epilogues into kernels", "after_optimizer", stitch_kernels,
         option="stitch_for_gpu"),
    Pass("stitch prologues and epilogues into kernels, for a CPU-emulated GPU",
         "after_optimizer", partial(stitch_kernels, software=True),
         option="stitch_for_software"),
    # Last: the buffer plan must be able to place every arena member.
    Pass("copy arena members the plan cannot place", "after_optimizer", separate_pack_members),
]

__all__ = ["PASSES", "Pass", "Phase", "eliminate_dead_code", "fuse_elementwise",
           "mark_zero_triangles", "separate_pack_members", "split_column_sums",
           "split_long_contractions", "stitch_kernels", "store_half"]
