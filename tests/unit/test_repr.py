"""Objects that explain themselves: results, captures, compilations, graphs and arrays print
what a user needs (kind, loss, dtypes and shapes, counts) in a line, never a big array or
bytes; step and run results convert to the plain fields a page receives. The handles (they
need a device): tests/native/test_repr.py."""

from __future__ import annotations

import array
import re

import numpy as np

import tensorgrad as tg
from tensorgrad import describe
from tensorgrad.web.convert import plain, result_message


class Net(tg.Module):
    def __init__(self) -> None:
        self.l1, self.l2 = tg.Linear(4, 256), tg.Linear(256, 3)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l2(tg.relu(self.l1(x)))


def loss_fn(model: Net, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    logits = tg.capture("logits", model(x))
    return tg.mean(tg.square(logits - y))


def test_arrays_are_dtype_and_shape_with_values_only_when_tiny() -> None:
    assert describe.array(np.zeros((1000, 1000), np.float32)) == "f32[1000, 1000]"
    assert describe.array(np.array([[0.47942554]], np.float32)) == "f32[1, 1] [0.4794]"
    assert describe.array(np.arange(3, dtype=np.int32)) == "i32[3] [0, 1, 2]"
    assert describe.array(np.float32(2.5)) == "f32[] [2.5]"
    mv = memoryview(array.array("f", range(12))).cast("B").cast("f", [3, 4])
    assert describe.array(mv) == "f32[3, 4]"
    assert describe.array(memoryview(array.array("i", [7, 8]))) == "i32[2] [7, 8]"
    assert describe.array(b"\x00" * 50_000) == "<50,000 bytes>"


def test_completed_shows_loss_output_and_captures_as_shapes() -> None:
    big = np.ones((512, 1024), np.float32)
    step = tg.Completed(loss=0.0123456789, captures=tg.Captures(logits=big))
    assert repr(step) == "Completed(loss=0.0123457, captures={logits: f32[512, 1024]})"
    run = tg.Completed(output=np.array([[0.479]], np.float32))
    assert repr(run) == "Completed(output=f32[1, 1] [0.479])"
    assert repr(tg.Completed(output=big)) == "Completed(output=f32[512, 1024])"
    assert repr(tg.Captures(a=big, b=np.zeros(2, np.int32))) == (
        "Captures({a: f32[512, 1024], b: i32[2] [0, 0]})")
    assert str(step) == repr(step) and repr(tg.Aborted()) == "Aborted()"


def test_failed_names_the_error_and_cuts_a_huge_message() -> None:
    err = tg.ShapeError("step", "input 'x' has 3 elements but its declared shape [8] needs 8",
                        site="")
    assert repr(tg.Failed(err)) == ("Failed(error=ShapeError(\"step: input 'x' has 3 elements "
                                    "but its declared shape [8] needs 8\"))")
    long = repr(tg.Failed(ValueError("x" * 100_000)))
    assert len(long) < 400 and "(99,700 more characters)" in long, long[-80:]


def test_compilation_and_graph_summarise_in_a_line() -> None:
    c = tg.trace(Net(), loss_fn, {"x": (64, 4), "y": (64, 3)}, seed=0)
    text = repr(c)
    assert len(text) < 300 and "\n" not in text, text
    assert text.startswith("<Compilation of a training step of Net, after 'passes after "
                           "autograd': "), text
    assert "4 params (2,051 values)" in text and "inputs {x: f32[64, 4], y: f32[64, 3]}" in text
    assert re.search(r"loss %\d+, 4 gradients>$", text), text
    assert str(c) == str(c.graph) and len(str(c)) > len(text)  # print() still shows the IR
    graph = repr(c.graph)
    assert re.fullmatch(r"<Graph: \d+ nodes, 2 inputs, 4 params, 0 states, outputs %\d+, "
                        r"captures logits=%\d+>", graph), graph
    fwd = tg.trace_forward(Net(), lambda m, x: m(x), {"x": (5, 4)})
    assert "a forward graph of Net" in repr(fwd) and "gradients" not in repr(fwd)


def test_results_convert_to_the_plain_fields_a_page_receives() -> None:
    step = tg.Completed(loss=np.float32(0.5), captures=tg.Captures(
        p=np.arange(6, dtype=np.float32).reshape(2, 3)))
    msg = result_message(step)
    assert set(msg) == {"kind", "loss", "captures", "captureShapes"}
    assert msg["kind"] == "completed" and msg["loss"] == 0.5 and type(msg["loss"]) is float
    assert msg["captureShapes"] == {"p": [2, 3]} and msg["captures"]["p"].tolist() == list(
        range(6))
    run = plain(tg.Completed(output=np.zeros((4, 2), np.int32)))
    assert set(run) == {"kind", "output", "outputShape", "captures", "captureShapes"}
    assert run["outputShape"] == [4, 2] and run["output"].format == "i"
    assert plain(tg.Aborted()) == {"kind": "aborted"}
    failed = plain([tg.Failed(ValueError("bad"))])[0]
    assert failed["kind"] == "failed" and failed["error"]["name"] == "ValueError"
    assert failed["error"]["message"] == "bad" and "ValueError: bad" in failed["error"][
        "traceback"]
