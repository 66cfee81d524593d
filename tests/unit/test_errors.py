"""Trace-time mistakes raise with the op, the shapes/dtypes and what was expected."""

from __future__ import annotations

import pytest

import tensorgrad as tg
from tensorgrad.errors import ShapeError, TraceError


class Lin(tg.Module):
    def __init__(self):
        self.l = tg.Linear(4, 2)

    def forward(self, x):
        return self.l(x)


XY = {"x": (3, 4), "y": (3, 2)}


def mse(m, x, y):
    return tg.mean((m(x) - y) * (m(x) - y))


# ---- the loss / forward result ---------------------------------------------------------

def test_loss_not_scalar():
    with pytest.raises(ShapeError, match=r"loss: the loss function must return a scalar \(0-d\) "
                       r"tensor, got f32\[3, 2\]; reduce it with tg.mean or tg.sum") as e:
        tg.trace(Lin(), lambda m, x, y: m(x) - y, XY, seed=0)
    assert "test_errors.py" in str(e.value)  # blames the user's line


def test_loss_not_f32():
    with pytest.raises(ShapeError, match=r"loss: the loss must be f32, got i32\[\]"):
        tg.trace(Lin(), lambda m, x, y: tg.argmax(m(x)), XY, seed=0)


@pytest.mark.parametrize("bad, what", [(1.5, "float"), (None, "NoneType")])
def test_loss_returns_non_tensor(bad, what):
    with pytest.raises(TraceError, match=f"the loss function must return one tg.Tensor, "
                       f"got {what}"):
        tg.trace(Lin(), lambda m, x, y: bad, XY, seed=0)


def test_forward_returns_tuple():
    with pytest.raises(TraceError, match=r"the forward function must return one tg.Tensor, got "
                       r"tuple \(return a single tensor; captures carry extra values\)"):
        tg.trace_forward(Lin(), lambda m, x: (m(x), x), {"x": (3, 4)})


# ---- inputs ----------------------------------------------------------------------------

def test_declared_input_not_a_parameter():
    def loss(m, x):
        return tg.mean(m(x))

    with pytest.raises(TraceError, match=r"input name mismatch: the loss function loss\(m, x\) "
                       r"is called as \(model, x=..., y=...\), but the declared input\(s\) "
                       r"\['y'\] are not among its parameters"):
        tg.trace(Lin(), loss, XY, seed=0)


def test_parameter_not_declared():
    def fwd(m, x, mask):
        return m(x) * mask

    with pytest.raises(TraceError, match=r"it requires \['mask'\], which is not declared as "
                       r"input\(s\)"):
        tg.trace_forward(Lin(), fwd, {"x": (3, 4)})


def test_function_without_model_argument():
    with pytest.raises(TraceError, match="must take the model as its first positional argument"):
        tg.trace_forward(Lin(), lambda *, x: x, {"x": (3, 4)})


def test_not_callable_and_not_a_module():
    with pytest.raises(TraceError, match="the loss function must be callable, got int"):
        tg.trace(Lin(), 3, XY, seed=0)
    with pytest.raises(TraceError, match="the model must be a tg.Module instance, got dict"):
        tg.trace({}, mse, XY, seed=0)


def test_training_input_with_none_dim():
    with pytest.raises(ShapeError, match=r"trace: input 'x' has an unresolved None dim in "
                       r"\[None, 4\]: training inputs must be fully concrete"):
        tg.trace(Lin(), mse, {"x": (None, 4), "y": (3, 2)}, seed=0)


def test_forward_input_with_none_dim_names_the_public_calls_that_take_one():
    """trace_forward traces one shape; the message names the public calls that take a None
    dim (it named the private resolve_shapes before)."""
    with pytest.raises(ShapeError, match=r"trace_forward: input 'x' has an unresolved None dim "
                       r"in \[None, 4\]: trace_forward traces one concrete shape: give every "
                       r"dim\. None dims are for inference graphs, .* train\.attach\(forward="
                       r"\.\.\., inputs=\{'x': \(None, 4\)\}\) .* tg\.compile_forward\("
                       r"model=\.\.\., forward=\.\.\., inputs=\{'x': \(None, 4\)\}\)"):
        tg.trace_forward(Lin(), lambda m, x: m(x), {"x": (None, 4)})
    with pytest.raises(ShapeError, match=r"input 'y' has an unresolved None dim in \[None\]: "
                       r"training inputs must be fully concrete .* inputs=\{'y': \(\(None,\), "
                       r"'i32'\)\}"):
        tg.trace(Lin(), mse, {"x": (3, 4), "y": ((None,), "i32")}, seed=0)


@pytest.mark.parametrize("decl, message", [
    ((3, 0), r"input 'x': dims must be positive ints, got \[3, 0\]"),
    ((3, 4.0), r"input 'x': dims must be positive ints, got \[3, 4.0\]"),
    (((3, 4), "f16"), r"input 'x': dtype must be 'f32' or 'i32', got 'f16'"),
    (((3, 4), "bool"), r"input 'x': dtype must be 'f32' or 'i32', got 'bool'"),
    ("3x4", r"input 'x': expected a shape \(a tuple of dims\) or \(shape, dtype\), got '3x4'"),
    ({"shape": (3, 4), "type": "i32"}, r"input 'x': a dict declaration needs the keys 'shape'"),
])
def test_bad_input_declarations(decl, message):
    with pytest.raises(ShapeError, match="trace: " + message):
        tg.trace(Lin(), mse, {"x": decl, "y": (3, 2)}, seed=0)


def test_bad_input_names():
    with pytest.raises(ShapeError, match=r"input name '__x' must be a Python identifier not "
                       r"starting with '__'"):
        tg.trace_forward(Lin(), lambda m, **kw: m(kw["__x"]), {"__x": (3, 4)})
    with pytest.raises(ShapeError, match=r"input name 'x-1' must be a Python identifier"):
        tg.trace_forward(Lin(), lambda m, **kw: m(kw["x-1"]), {"x-1": (3, 4)})


def test_input_named_like_a_param():
    class Raw(tg.Module):
        def __init__(self):
            self.w = self.param((4,))

    with pytest.raises(TraceError, match="input 'w' has the same name as a param"):
        tg.trace_forward(Raw(), lambda m, w: m.w * w, {"w": (4,)})


def test_i32_where_f32_needed():
    with pytest.raises(ShapeError, match=r"exp: input must be f32, got i32 \(shape \[3\]\)"):
        tg.trace_forward(Lin(), lambda m, t: tg.exp(t), {"t": ((3,), "i32")})
    with pytest.raises(ShapeError, match=r"matmul: lhs must be f32, got i32 \(shape \[3, 4\]\)"):
        tg.trace_forward(Lin(), lambda m, x: m(x), {"x": ((3, 4), "i32")})


def test_bad_seed():
    with pytest.raises(TypeError, match=r"seed must be an int \(32-bit\), got 1.5 \(float\)"):
        tg.trace(Lin(), mse, XY, seed=1.5)


# ---- params ----------------------------------------------------------------------------

def test_param_created_inside_forward():
    class Lazy(tg.Module):
        def forward(self, x):
            self.bias = self.param((2,))
            return x + self.bias

    with pytest.raises(TraceError, match=r"Lazy.param\(\[2\]\) was called while tracing: params "
                       r"must be declared in __init__, not created inside forward/loss") as e:
        tg.trace_forward(Lazy(), lambda m, x: m(x), {"x": (3, 2)})
    assert "test_errors.py" in str(e.value)


# ---- representative op-level errors, surfaced through a trace --------------------------

def test_matmul_inner_dims():
    with pytest.raises(ShapeError, match=r"matmul: inner dims differ: lhs \[3, 5\] has 5, "
                       r"rhs \[4, 2\] has 4") as e:
        tg.trace_forward(Lin(), lambda m, x: m(x), {"x": (3, 5)})
    assert "test_errors.py" in str(e.value)


def test_reshape_sizes():
    with pytest.raises(ShapeError, match=r"reshape: cannot reshape \[3, 4\] \(12 elements\) "
                       r"to \[5, -1\]"):
        tg.trace_forward(Lin(), lambda m, x: tg.reshape(x, (5, -1)), {"x": (3, 4)})


def test_axis_out_of_range():
    with pytest.raises(ShapeError, match=r"mean: axis 2 is out of range for a tensor of rank 2"):
        tg.trace_forward(Lin(), lambda m, x: tg.mean(x, 2), {"x": (3, 4)})


def test_broadcast_mismatch_names_shapes():
    with pytest.raises(ShapeError, match=r"add: shapes \[3, 2\] and \[3\] do not broadcast"):
        tg.trace_forward(Lin(), lambda m, x, b: m(x) + b, {"x": (3, 4), "b": (3,)})


def test_op_outside_trace():
    with pytest.raises(TraceError, match="'relu' was called outside a trace"):
        tg.relu(None)


# ---- tracebacks as the worker reports them -------------------------------------------------

def test_user_traceback_ends_at_the_users_line() -> None:
    """user_traceback (what the worker sends the page) keeps the user's frames only: the
    event loop's and tensorgrad's are cut, in chained exceptions too."""
    import asyncio

    from tensorgrad.errors import user_traceback

    def users_loss(m, x, y):
        return tg.mean(m(x) - tg.reshape(y, (2, 3)))   # the user's mistake

    async def main():
        try:
            tg.trace(Lin(), users_loss, XY, seed=0)
        except ShapeError as err:
            raise RuntimeError("training setup failed") from err

    with pytest.raises(RuntimeError) as info:
        asyncio.run(main())
    text = user_traceback(info.value)
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith('File "')]
    assert frames and all("test_errors.py" in f for f in frames), text
    assert [f.rsplit(" in ", 1)[1] for f in frames] == [
        "main", "users_loss",                                        # the ShapeError's
        "test_user_traceback_ends_at_the_users_line", "main"], text  # the RuntimeError's
    assert "ShapeError: sub: shapes" in text and "RuntimeError: training setup failed" in text


def test_user_traceback_of_a_data_error_ends_at_the_users_call() -> None:
    from tensorgrad.errors import user_traceback
    from tensorgrad.hostdata import to_bytes

    with pytest.raises(ShapeError) as info:
        to_bytes("input 'x'", [1.0, 2.0], (3,), "f32")
    text = user_traceback(info.value)
    assert 'test_errors.py", line' in text.splitlines()[1], text  # the user's call first
    assert "hostdata.py" not in text  # then nothing internal after it
