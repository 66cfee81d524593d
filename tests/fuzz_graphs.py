"""Random small training graphs from the op table, for the fuzzer (tests/native/test_fuzz.py)
and its long run (bench/fuzz.py).

A :class:`Program` is plain data drawn by hypothesis: the shapes of 1–3 params and a list of
steps, each an op name and a few raw integers that choose its operands (among the tensors made
so far) and its arguments (axes, lengths, shapes) modulo what the operands allow. Most draws
are valid; some are not on purpose (shapes that do not broadcast, matmuls that do not fit):
tracing those must raise a clear ShapeError, never anything else. The loss is the mean of the
square of the last tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import strategies as st

import tensorgrad as tg

UNARY = {
    "relu": tg.relu, "tanh": tg.tanh, "sigmoid": tg.sigmoid, "sin": tg.sin, "cos": tg.cos,
    "abs": tg.abs, "neg": tg.neg, "square": tg.square, "gelu": tg.gelu, "silu": tg.silu,
    "softplus": tg.softplus, "erf": tg.erf,
    "exp": lambda x: tg.exp(tg.tanh(x)),                     # bounded, never overflows
    "log": lambda x: tg.log(tg.abs(x) + 0.5),
    "sqrt": lambda x: tg.sqrt(tg.abs(x) + 0.5),
    "rsqrt": lambda x: tg.rsqrt(tg.abs(x) + 0.5),
    "leaky_relu": lambda x: tg.leaky_relu(x, 0.1),
    "clamp": lambda x: tg.clamp(x, -0.5, 0.7),
    "scale": lambda x: x * 1.5 + 0.25,
    "stop_gradient": tg.stop_gradient,
}
BINARY = {
    "add": tg.add, "sub": tg.sub, "mul": tg.mul, "maximum": tg.maximum, "minimum": tg.minimum,
    "div": lambda a, b: a / (tg.abs(b) + 0.5),
    "where": lambda a, b: tg.where(a < b, a, b),
    "matmul": tg.matmul,
    "concat": lambda a, b: tg.concat([a, b], axis=-1),
    "stack": lambda a, b: tg.stack([a, b], axis=0),
}
SHAPED = ("sum", "mean", "softmax", "log_softmax", "reshape", "permute", "swap_axes", "narrow",
          "gram")
OPS = (*UNARY, *BINARY, *SHAPED)


@dataclass(frozen=True)
class Program:
    shapes: tuple[tuple[int, ...], ...]
    steps: tuple[tuple[str, tuple[int, ...]], ...]

    def __str__(self) -> str:
        lines = [f"params {list(map(list, self.shapes))}"]
        lines += [f"  {op}{list(args)}" for op, args in self.steps]
        return "\n".join(lines)


# Small dims mostly, some past the kernels' variant thresholds (workgroup reductions from a
# row of 256, tiled matmuls from 1,024 outputs, 2-D dispatch grids never: too big here).
DIMS = (1, 2, 3, 4, 5, 8, 16, 31, 64, 130, 300)


def shapes() -> st.SearchStrategy[tuple[int, ...]]:
    return (st.lists(st.sampled_from(DIMS), min_size=0, max_size=3).map(tuple)
            .filter(lambda s: math.prod(s) <= 20_000))


def programs(max_steps: int = 6) -> st.SearchStrategy[Program]:
    step = st.tuples(st.sampled_from(OPS), st.tuples(*[st.integers(0, 11)] * 4))
    return st.builds(Program, st.lists(shapes(), min_size=1, max_size=3).map(tuple),
                     st.lists(step, min_size=1, max_size=max_steps).map(tuple))


class FuzzModel(tg.Module):
    def __init__(self, program: Program) -> None:
        self.ps = [self.param(s, init=tg.init.randn(1.0)) for s in program.shapes]
        self.program = program


def _apply(op: str, args: tuple[int, ...], made: list[tg.Tensor]) -> tg.Tensor:
    a = made[args[0] % len(made)]
    if op in UNARY:
        return UNARY[op](a)
    if op in BINARY:
        return BINARY[op](a, made[args[1] % len(made)])
    rank = a.ndim
    if op in ("sum", "mean"):
        fn = tg.sum if op == "sum" else tg.mean
        if rank == 0 or args[1] % 3 == 0:
            return fn(a)
        return fn(a, axis=args[1] % rank - rank, keepdims=bool(args[2] % 2))
    if op in ("softmax", "log_softmax"):
        return (tg.softmax if op == "softmax" else tg.log_softmax)(a, axis=-1)
    if op == "reshape":
        size = math.prod(a.shape)
        first = [d for d in range(1, size + 1) if size % d == 0][args[1] % max(1, _divisors(size))]
        return tg.reshape(a, (first, size // first) if args[2] % 2 else (size,))
    if op == "permute":
        perm = list(range(rank))
        for k in range(rank - 1, 0, -1):  # a permutation from the draws
            j = args[1 + k % 3] % (k + 1)
            perm[k], perm[j] = perm[j], perm[k]
        return tg.permute(a, perm)
    if op == "swap_axes":
        return tg.swap_axes(a, args[1] % max(rank, 1), args[2] % max(rank, 1))
    if op == "gram":  # a matmul that always fits: a @ aᵀ over the last two axes
        return tg.matmul(a, tg.swap_axes(a, -1, -2)) if rank >= 2 else a * a
    if op == "narrow":
        axis = args[1] % max(rank, 1)
        dim = a.shape[axis] if rank else 1
        start = args[2] % dim
        return tg.narrow(a, axis, start, 1 + args[3] % (dim - start))
    raise ValueError(op)


def _divisors(n: int) -> int:
    return sum(1 for d in range(1, n + 1) if n % d == 0)


def fuzz_loss(model: FuzzModel) -> tg.Tensor:
    made = list(model.ps)
    for op, args in model.program.steps:
        made.append(_apply(op, args, made))
    out = tg.capture("out", made[-1])
    return tg.mean(tg.square(out))
