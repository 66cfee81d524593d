"""Shared machinery for op tests: a case table format and the checks run over it.

A :class:`Case` describes one call of a public op on concrete argument shapes. The checks:
forward against PyTorch/NumPy, gradients against PyTorch autograd, gradients against float64
finite differences through the reference interpreter, and (native layer) every kernel of
the forward+backward graph against the reference interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorgrad.autograd import append_grad
from tensorgrad.ir import Graph
from tensorgrad.reference import evaluate
from tensorgrad.tensor import Tensor, leaf, tracing


@dataclass
class Arg:
    """One argument: a param (differentiated) or an input (not), with a value generator.

    gen: 'normal' | 'positive' (0.5..2) | 'unit' (-0.9..0.9) | 'int:LO:HI' | a fixed array."""

    shape: tuple[int, ...]
    dtype: str = "f32"
    gen: Any = "normal"
    param: bool = True

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if not isinstance(self.gen, str):
            return np.asarray(self.gen).reshape(self.shape)
        if self.gen == "normal":
            return rng.standard_normal(self.shape).astype(np.float32)
        if self.gen == "positive":
            return rng.uniform(0.5, 2.0, self.shape).astype(np.float32)
        if self.gen == "unit":
            return rng.uniform(-0.9, 0.9, self.shape).astype(np.float32)
        if self.gen.startswith("int:"):
            _, lo, hi = self.gen.split(":")
            return rng.integers(int(lo), int(hi), self.shape).astype(np.int32)
        if self.gen == "bool":
            return rng.integers(0, 2, self.shape).astype(bool)
        raise ValueError(self.gen)


@dataclass
class Case:
    """One test call of public op `op`.

    `fn(*tensors)` builds the tensorgrad graph; `torch_fn(*torch_tensors)` is the twin
    (None: compare with `np_fn`; a case with neither fails the forward check). Gradients
    flow to f32 args with `param=True`."""

    op: str
    fn: Callable[..., Any]
    args: Sequence[Arg]
    torch_fn: Callable[..., Any] | None = None
    np_fn: Callable[..., Any] | None = None
    grad: bool = True
    fd: bool = True
    rtol: float = 1e-4
    atol: float = 1e-5
    fd_eps: float = 1e-3
    seed: int = 0
    name: str = ""
    feeds: dict[str, Any] = field(default_factory=dict)  # extra hidden inputs, e.g. prng seed

    @property
    def id(self) -> str:
        shapes = ",".join("x".join(map(str, a.shape)) or "0d" for a in self.args)
        return f"{self.op}[{self.name or shapes}]"


@dataclass
class Built:
    graph: Graph
    out: int
    loss: int | None
    grads: dict[str, int]
    values: dict[str, np.ndarray]
    weights: np.ndarray | None


def build(case: Case, with_grad: bool | None = None) -> Built:
    """Trace the case; with gradients, the loss is sum(out * fixed random weights)."""
    rng = np.random.default_rng(case.seed)
    values = {f"a{k}": a.make(rng) for k, a in enumerate(case.args)}
    with_grad = case.grad if with_grad is None else with_grad
    with tracing() as st:
        tensors = [leaf("param" if (a.param and a.dtype == "f32") else "input", f"a{k}",
                        a.shape, a.dtype) for k, a in enumerate(case.args)]
        out = case.fn(*tensors)
        if isinstance(out, (tuple, list)):
            from tensorgrad import ops
            out = ops.concat([ops.reshape(o, (-1,)) for o in out], 0) if len(out) > 1 else out[0]
        loss_t = None
        weights = None
        if with_grad:
            weights = rng.standard_normal(out.shape).astype(np.float32)
            wt = leaf("input", "__weights", out.shape, "f32")
            from tensorgrad import ops
            loss_t = ops.sum_to_shape(ops.mul(out, wt), ())
            values["__weights"] = weights
    g = st.graph
    g.outputs = [out.id] if loss_t is None else [loss_t.id]
    grads = append_grad(g, loss_t.id) if loss_t is not None else {}
    values.update(case.feeds)
    return Built(g, out.id, None if loss_t is None else loss_t.id, grads, values, weights)


def run_reference(b: Built, float_dtype: Any = np.float32,
                  values: dict[str, np.ndarray] | None = None) -> list[Any]:
    return evaluate(b.graph, values if values is not None else b.values,
                    float_dtype=float_dtype)


def torch_forward_and_grads(case: Case, b: Built) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    import torch

    ts = []
    for k, a in enumerate(case.args):
        v = torch.from_numpy(np.array(b.values[f"a{k}"]))
        if a.dtype == "i32":
            v = v.long()
        if a.dtype == "f32" and a.param and case.grad:
            v = v.double().requires_grad_(True)
        elif a.dtype == "f32":
            v = v.double()
        ts.append(v)
    out = case.torch_fn(*ts)  # type: ignore[misc]
    if isinstance(out, (tuple, list)):
        out = torch.cat([o.reshape(-1) for o in out]) if len(out) > 1 else out[0]
    grads = {}
    if case.grad and b.weights is not None:
        (out.double() * torch.from_numpy(b.weights).double()).sum().backward()
        for k, a in enumerate(case.args):
            if a.dtype == "f32" and a.param:
                grads[f"a{k}"] = ts[k].grad.numpy() if ts[k].grad is not None else \
                    np.zeros(a.shape)
    return out.detach().numpy(), grads


def fd_grads(case: Case, b: Built) -> dict[str, np.ndarray]:
    """Central finite differences of the loss, in float64, through the reference."""
    out = {}
    base = {k: np.array(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f" else v
            for k, v in b.values.items()}
    for name in b.grads:
        p = base[name]
        g = np.zeros(p.shape)
        for idx in np.ndindex(p.shape):
            orig = p[idx]
            p[idx] = orig + case.fd_eps
            hi = evaluate(b.graph, base, float_dtype=np.float64)[b.loss]
            p[idx] = orig - case.fd_eps
            lo = evaluate(b.graph, base, float_dtype=np.float64)[b.loss]
            p[idx] = orig
            g[idx] = (hi - lo) / (2 * case.fd_eps)
        out[name] = g
    return out


def assert_close(actual: Any, expected: Any, rtol: float, atol: float, what: str) -> None:
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def graph_ops(b: Built) -> set[str]:
    return {n.op for n in b.graph.nodes}


def tensors_of(graph: Graph, ids: Sequence[int]) -> list[Tensor]:
    return [Tensor(graph, i) for i in ids]
