"""What one matmul kernel computes (:class:`MatmulSpec`) and the WGSL index helpers its
kernel variants share (`tensorgrad/ops/linalg.py` for GPUs, `linalg_cpu.py` for CPU
rasterisers)."""

from __future__ import annotations

from dataclasses import dataclass

import tensorgrad.codegen.wgsl as w

MAX_PADDING = 1.25      # most output area (with a kernel's blocks' padding) per real output


@dataclass(frozen=True)
class MatmulSpec:
    """out[bt, m, n] = sum_k A[bt, m, k] * B[bt, k, n] over `batch` slices (rows of a rank-2-rhs
    matmul are flattened into m, batch 1). `ta`/`tb`: operand stored transposed;
    `b_batched`: B has a batch axis (else it is shared); `zeros_a` / `zeros_b`: a triangle
    of the logical operand that is exactly zero ("above": column > row, "below": column <
    row; see passes/triangles.py), which the K loops skip. `a_swapped` / `b_swapped`: the
    operand is read through a stitched permute from storage whose other trailing axis is
    the contiguous one (:attr:`EmitContext.swapped_reads`): the tiled kernels coalesce its
    tile loads along that axis."""

    batch: int
    m: int
    k: int
    n: int
    ta: bool = False
    tb: bool = False
    b_batched: bool = True
    zeros_a: str | None = None
    zeros_b: str | None = None
    a_swapped: bool = False
    b_swapped: bool = False

    @property
    def outputs(self) -> int:
        return self.batch * self.m * self.n

    def k_band(self, row0: str, rows: int, col0: str, cols: int) -> tuple[str, str]:
        """(first k, end k) as WGSL u32 expressions: the part of the contraction that can be
        nonzero for outputs in rows row0.. row0 + rows - 1 and cols col0.. col0 + cols - 1
        (all of K without zero triangles). Row and col starts are multiples of any K chunk
        the tiled kernels stage, so their chunks stay aligned."""
        starts, ends = [], []
        if self.zeros_a == "above":      # A[m, k] = 0 for k > m
            ends.append(f"{row0} + {w.u(rows)}")
        elif self.zeros_a == "below":    # A[m, k] = 0 for k < m
            starts.append(row0)
        if self.zeros_b == "above":      # B[k, n] = 0 for n > k
            starts.append(col0)
        elif self.zeros_b == "below":    # B[k, n] = 0 for n < k
            ends.append(f"{col0} + {w.u(cols)}")
        start = starts[0] if len(starts) == 1 else \
            f"max({starts[0]}, {starts[1]})" if starts else "0u"
        end = w.u(self.k)
        for e in ends:
            end = f"min({e}, {end})"
        return start, end

    def a_base(self, bt: str, row: str) -> tuple[str, str]:
        """(offset of A[bt, row, 0], step per k) as WGSL expressions."""
        off = f"{bt} * {w.u(self.m * self.k)} + " if self.batch > 1 else ""
        if self.ta:
            return f"{off}{row}", w.u(self.m)
        return f"{off}{row} * {w.u(self.k)}", "1u"

    def b_base(self, bt: str, col: str) -> tuple[str, str]:
        """(offset of B[bt, 0, col], step per k) as WGSL expressions."""
        off = f"{bt} * {w.u(self.k * self.n)} + " if self.batch > 1 and self.b_batched else ""
        if self.tb:
            return f"{off}{col} * {w.u(self.k)}", "1u"
        return f"{off}{col}", w.u(self.n)


def at(base: str, step: str, k: str) -> str:
    """WGSL: the flat index `base + k * step` (no multiply for a unit step)."""
    return f"{base} + {k}" if step == "1u" else f"{base} + {k} * {step}"


def split_batch(spec: MatmulSpec, var: str, inner: int, name: str) -> str:
    """WGSL lines splitting `var` into `name` (in [0, inner)) and the batch index `bt`."""
    if spec.batch == 1:
        return f"  let {name} = {var};\n  let bt = 0u;"
    return f"  let {name} = {var} % {w.u(inner)};\n  let bt = {var} / {w.u(inner)};"


__all__ = ["MAX_PADDING", "MatmulSpec", "at", "split_batch"]
