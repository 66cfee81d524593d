"""A fuzzer over the op table: random small graphs (tests/fuzz_graphs.py) either fail to trace
with a clear ShapeError / TraceError, or compile and run on the native GPU with a forward
(the captured output and the loss) and gradients that match the NumPy reference. Never an
internal exception, a shader compile error or a hang. A bounded, deterministic set of
examples runs here; `python bench/fuzz.py` runs a longer random one."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings

import tensorgrad as tg
from tensorgrad.errors import ShapeError, TraceError
from tensorgrad.init import init_params
from tensorgrad.reference import evaluate
from tests.fuzz_graphs import FuzzModel, Program, fuzz_loss, programs

TOLERANCE = {"rtol": 2e-3, "atol": 2e-4}


def _close(name: str, got: Any, want: Any, program: Program) -> None:
    want = np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=TOLERANCE["rtol"],
                               atol=TOLERANCE["atol"] * scale,
                               err_msg=f"{name} differs from the reference for\n{program}")


async def check_program(device: Any, program: Program) -> str:
    """'rejected' (a clear trace error) or 'matched'; raises on anything else."""
    model = FuzzModel(program)
    try:
        traced = tg.trace(model, fuzz_loss, {}, seed=0)
    except (ShapeError, TraceError) as err:
        assert str(err).strip(), "an empty error message"
        return "rejected"
    feeds = {n: np.asarray(v, np.float32).reshape(traced.params[n].shape)
             for n, v in init_params(traced.params, 0).items()}
    values = evaluate(traced.graph, feeds)
    train = await tg.compile(model=model, loss=fuzz_loss, inputs={},
                             optimizer=tg.optim.SGD(lr=0.0), device=device, seed=0)
    try:
        result = await asyncio.wait_for(train.step(), 60)
        assert result.kind == "completed", f"{result} for\n{program}"
        _close("the output", result.captures["out"], values[traced.graph.captures["out"]],
               program)
        _close("the loss", result.loss, values[traced.loss], program)
        grads = await train.download_param_grads()
        for name, gid in traced.grads.items():
            _close(f"the gradient of {name}", grads[name], values[gid], program)
    finally:
        train.destroy()
    return "matched"


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(program=programs())
def test_random_graphs_trace_cleanly_or_match_the_reference(gpu_device, program) -> None:
    asyncio.run(check_program(gpu_device, program))


def test_the_fuzzer_reaches_both_outcomes(gpu_device) -> None:
    """A valid program matches, an invalid one is rejected: the check can tell them apart."""
    good = Program(((2, 3), (3,)), (("matmul", (0, 0, 0, 0)), ("relu", (2, 0, 0, 0)),
                                    ("add", (3, 1, 0, 0))))
    bad = Program(((2, 3), (4,)), (("add", (0, 1, 0, 0)),))
    assert asyncio.run(check_program(gpu_device, good)) == "rejected"  # [2,3]@[2,3]
    assert asyncio.run(check_program(gpu_device, bad)) == "rejected"
    fine = Program(((2, 3), (3, 4)), (("matmul", (0, 1, 0, 0)), ("tanh", (2, 0, 0, 0))))
    assert asyncio.run(check_program(gpu_device, fine)) == "matched"


# Found by `bench/fuzz.py --kernels hardware` (2026-12-03), both in the arena packing of the
# gradients: two params with one gradient node (packed twice), and a gradient computed from
# another one (its kernel would read and write the arena). Such a pack keeps its copy kernel.
FOUND = [
    Program(((), ()), (("add", (0, 1, 0, 0)),)),
    Program(((), (1,)), (("relu", (0, 0, 0, 0)), ("add", (0, 1, 0, 0)))),
]


def test_programs_the_fuzzer_found(gpu_device) -> None:
    for program in FOUND:
        assert asyncio.run(check_program(gpu_device, program)) == "matched", program
