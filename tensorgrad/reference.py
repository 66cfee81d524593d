"""The NumPy reference interpreter: what every op computes. The oracle for GPU kernels.

Floats run in float32 by default; `float_dtype=np.float64` gives a high-precision twin for
finite-difference checks. i32 stays int32 and bool stays bool. An f16 node (mixed precision)
holds np.float16 values, and ops read them as the float type: a kernel computes in f32 and
rounds what it stores to f16, and so does the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .ir import DType, Graph
from .ops.registry import OPS

NP_DTYPES = {"i32": np.int32, "bool": np.bool_, "f16": np.float16}


def np_dtype(dtype: DType, float_dtype: Any = np.float32) -> Any:
    """The NumPy dtype that holds values of `dtype` (f32 as `float_dtype`)."""
    return float_dtype if dtype == "f32" else NP_DTYPES[dtype]


def computed(value: Any, float_dtype: Any = np.float32) -> Any:
    """`value` as an op reads it: an f16 array as `float_dtype` (kernels compute f16 values
    in f32), anything else as it is."""
    if isinstance(value, np.ndarray) and value.dtype == np.float16:
        return value.astype(float_dtype)
    return value


def evaluate(graph: Graph, feeds: Mapping[str, Any], *, float_dtype: Any = np.float32,
             keep: bool = True) -> list[Any]:
    """Values of every node of `graph`.

    `feeds` maps names of params, inputs and states to arrays (states default to their init
    value). With `keep=False` only outputs, captures and leaves are guaranteed to be kept."""
    import tensorgrad.ops  # noqa: F401  (fills the op table)

    values: list[Any] = [None] * len(graph.nodes)
    for n in graph.nodes:
        if n.op in ("param", "input", "state"):
            name = n.attrs["name"]
            if name in feeds:
                v = np.asarray(feeds[name])
            elif n.op == "state":
                v = np.full(n.shape, n.attrs.get("init", 0.0))
            else:
                raise KeyError(f"evaluate: no value fed for {n.op} '{name}' "
                               f"({n.dtype}{list(n.shape)})")
            if v.size != n.size:
                raise ValueError(f"evaluate: {n.op} '{name}' expects shape {list(n.shape)}, "
                                 f"got {list(v.shape)}")
            values[n.id] = v.reshape(n.shape).astype(np_dtype(n.dtype, float_dtype))
            continue
        args = [computed(values[i], float_dtype) for i in n.inputs]
        out = np.asarray(OPS[n.op].ref(args, n))
        want = np_dtype(n.dtype, float_dtype)
        if out.dtype != want:
            out = out.astype(want)
        if out.shape != n.shape:
            raise AssertionError(f"reference of {n.op} gave shape {out.shape}, "
                                 f"expected {n.shape}")
        values[n.id] = out
    return values
