"""Why the step guard skipped a step: looked up only after a skipped step, so a normal step
pays nothing.

The guard (``step_ok`` over the loss and ``update_partials`` trials, see
:mod:`tensorgrad.ops.update_check`) says only *that* a step must not update. After one, with a
finite loss, :func:`explain` reads back what the step left on the device (the gradients, the
params and optimizer state, which the skip left unchanged, the step's hidden inputs) and
finds the first non-finite value: a gradient, or a new param or state value the update would
have written (the trials' own formulas, evaluated with NumPy; without NumPy that part is
left out).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .hostdata import numpy_or_none
from .ir import LEAF_OPS, Graph

STATE_NAMES = {("adam", "m"): "Adam's first moment m", ("adam", "v"): "Adam's second moment v",
               ("sgd", "v"): "the SGD momentum (velocity)"}


def first_non_finite(values: Any) -> tuple[int, float] | None:
    """(flat index, value) of the first NaN or Inf of an array or buffer, else None."""
    np = numpy_or_none()
    if np is not None:
        flat = np.asarray(values, dtype=np.float64).reshape(-1)
        bad = np.flatnonzero(~np.isfinite(flat))
        return (int(bad[0]), float(flat[bad[0]])) if bad.size else None
    flat_view = memoryview(values).cast("B").cast("f")
    return next(((k, v) for k, v in enumerate(flat_view) if not math.isfinite(v)), None)


async def non_finite_grad(exe: Any, grads: Mapping[str, int]) -> str:
    """"the gradient of 'w' holds nan at flat index 3", or "" when every gradient is finite."""
    names = list(grads)
    for name, value in zip(names, await exe.read([grads[n] for n in names])):
        hit = first_non_finite(value)
        if hit is not None:
            return f"the gradient of '{name}' holds {hit[1]} at flat index {hit[0]}"
    return ""


async def non_finite_param(store: Any) -> str:
    """"param 'w' holds nan at flat index 3", or "" when every f32 param is finite."""
    for name, value in (await store.download()).items():
        if store.specs[name].dtype == "f32":
            hit = first_non_finite(value)
            if hit is not None:
                return f"param '{name}' holds {hit[1]} at flat index {hit[0]}"
    return ""


async def skip_reason(exe: Any, live_store: Callable[[], Any], grads: Mapping[str, int],
                      culprit: str, loss: float, t: int) -> str:
    """Why step `t` was skipped: `culprit` (a non-finite or sentinel-only input, named) or
    what the device holds now (a param, a gradient, the update: read back only after a
    skipped step, so a good step pays nothing). `live_store()`: the training's params."""
    skipped = "the update was skipped, params and optimizer state are unchanged"
    if culprit:
        what = f"loss is {loss}" if not math.isfinite(loss) else \
            f"the loss is finite ({loss:.6g}) but a gradient is not"
        return f"{what} at step {t}: {skipped}; {culprit}"
    if not math.isfinite(loss):
        param = await non_finite_param(live_store())
        return f"loss is {loss} at step {t}: {skipped}" + (
            f"; {param} (params must be finite: check what was uploaded)" if param else
            " (training diverged: lower the learning rate, clip gradients)")
    grad = await non_finite_grad(exe, grads)
    if grad:
        return (f"the loss is finite ({loss:.6g}) but a gradient is not at step {t}: "
                f"{skipped}; {grad} (training diverged: lower the learning rate, clip "
                "gradients)")
    what, where = await non_finite_update(exe, grads)
    return (f"the update would make {what} non-finite at step {t}"
            + (f" ({where})" if where else "") + f": {skipped}; lower the learning rate "
            "(or clip gradients with clip_grad_norm)")


def _ancestors(graph: Graph, roots: Iterable[int], boundary: set[int]) -> list[int]:
    """The nodes `roots` depend on, stopping at `boundary` (included), in graph order."""
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        if i not in boundary and graph[i].op not in LEAF_OPS:
            todo.extend(graph[i].inputs)
    return sorted(seen)


async def non_finite_update(exe: Any, grads: Mapping[str, int]) -> tuple[str, str]:
    """("params", "param 'w' would become inf at flat index 3") or ("optimizer state",
    "Adam's second moment v of param 'w' would become inf at ..."), from the update trials of
    `exe`'s graph evaluated on the host; ("params", "") without NumPy or a find."""
    if numpy_or_none() is None:
        return "params", ""
    from .ops.registry import OPS
    from .ops.update_check import new_values
    from .reference import np_dtype

    graph = exe.graph
    trials = [n for n in graph.nodes if n.op == "update_partials"]
    boundary = set(grads.values())
    needed = _ancestors(graph, [n.id for n in trials], boundary)
    read = [i for i in needed if i in boundary or graph[i].op in LEAF_OPS]
    values: dict[int, Any] = {}
    for i, v in zip(read, await exe.read(read)):
        node = graph[i]
        values[i] = numpy_or_none().asarray(v, dtype=np_dtype(node.dtype)).reshape(node.shape)
    for i in needed:
        if i not in values:
            node = graph[i]
            values[i] = OPS[node.op].ref([values[k] for k in node.inputs], node)
    for trial in trials:
        for kind, array in new_values([values[k] for k in trial.inputs], trial).items():
            hit = first_non_finite(array)
            if hit is None or kind == "g":
                continue
            return ("params" if kind == "p" else "the optimizer state",
                    _describe(trial.attrs["params"], trial.attrs["rule"], kind, *hit))
    return "params", ""


def _describe(spans: Iterable[tuple[str, int, int]], rule: str, kind: str, k: int,
              value: float) -> str:
    for name, start, size in spans:
        if start <= k < start + size:
            where = f"{value} at flat index {k - start}"
            if kind == "p":
                return f"param '{name}' would become {where}"
            return f"{STATE_NAMES[rule, kind]} of param '{name}' would become {where}"
    return ""


__all__ = ["first_non_finite", "non_finite_grad", "non_finite_param", "non_finite_update",
           "skip_reason"]
