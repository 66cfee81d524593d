"""Failures of real training in the browser come back to the page, never as a hang or a silent
NaN: step() and run() resolve to {kind: "failed", error} with the Python error's name and
message; a script's error rejects runScript with its traceback."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .conftest import Page

MODELS = """
import tensorgrad as tg
import tensorgrad.optim

class ErrNet(tg.Module):
    def __init__(self):
        self.l1 = tg.Linear(2, 8)
        self.l2 = tg.Linear(8, 1)

    def forward(self, x):
        return self.l2(tg.relu(self.l1(x)))

def err_mse(model, x, y):
    return tg.mean(tg.square(model(x) - y))

def err_log_negative(model, x, y):
    # log of a negative number: NaN whatever the params (in the reference and natively)
    return tg.mean(tg.log(-1.0 - tg.square(model(x) - y)))

def err_sqrt_negative(model, x, y):
    return tg.mean(tg.sqrt(-1.0 - tg.square(model(x) - y)))

def err_broadcast(model, x, y):
    return tg.mean(tg.square(model(x) - tg.reshape(y, (2, 2))))

def err_forward_raises(model, x):
    if x.shape[0] > 3:
        raise ValueError(f"err_forward_raises: batch {x.shape[0]} is too large for this forward")
    return model(x)

"ok"
"""

# Compile `loss` with `optimizer`, run `steps` steps on fixed data; the results of each.
STEPS = """async ({ loss, optimizer, steps, x, y }) => {
  const train = await session.compile({ model: "ErrNet()", loss, optimizer, seed: 3,
                                        inputs: { x: [4, 2], y: [4, 1] } });
  const results = [];
  for (let i = 0; i < steps; i++) {
    const r = await train.step({ x: Float32Array.from(x ?? [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]),
                                 y: Float32Array.from(y ?? [1, 2, 3, 4]) });
    results.push(r.kind === "completed" ? { kind: r.kind, loss: r.loss } :
                 { kind: r.kind, name: r.error?.name, message: r.error?.message,
                   traceback: r.error?.traceback });
    if (r.kind !== "completed") break;
  }
  await train.destroy();
  return results;
}"""


@pytest.fixture(scope="module")
def models(tg_page: Page) -> Page:
    assert tg_page.exec(MODELS) == "'ok'"
    return tg_page


def _failed(results: list[dict[str, Any]]) -> dict[str, Any]:
    assert results and results[-1]["kind"] == "failed", results
    return results[-1]


def test_nan_loss_fails_the_step(models: Page) -> None:
    """A NaN in the data makes a NaN loss: the step fails, it does not train on garbage."""
    results = models.js(STEPS, {"loss": "err_mse", "optimizer": "tg.optim.Adam(lr=1e-2)",
                                "steps": 3, "y": [1, float("nan"), 3, 4]})
    fail = _failed(results)
    assert len(results) == 1, results  # the first step already
    assert fail["name"] == "FloatingPointError", fail
    assert fail["message"].startswith(
        "loss is nan at step 1: the update was skipped, params and optimizer state are "
        "unchanged; input 'y' holds nan at flat index 1"), fail


# WGSL leaves log/sqrt of a negative number indeterminate (SwiftShader's log returns
# log|x|); tensorgrad's kernels select NaN there, as the reference does.
@pytest.mark.parametrize("loss", ["err_log_negative", "err_sqrt_negative"])
def test_log_or_sqrt_of_a_negative_is_a_nan_loss(models: Page, loss: str) -> None:
    results = models.js(STEPS, {"loss": loss, "optimizer": "tg.optim.Adam(lr=1e-2)",
                                "steps": 1})
    fail = _failed(results)
    assert "loss is nan at step 1" in fail["message"], fail


def test_huge_learning_rate_fails_when_the_loss_overflows(models: Page) -> None:
    results = models.js(STEPS, {"loss": "err_mse", "optimizer": "tg.optim.Adam(lr=1e30)",
                                "steps": 10})
    fail = _failed(results)
    assert results[0]["kind"] == "completed" and len(results) >= 2, results
    assert fail["name"] == "FloatingPointError", fail
    assert f"at step {len(results)}" in fail["message"], fail
    assert any(w in fail["message"] for w in ("loss is inf", "loss is nan")), fail


def test_wrong_input_size_fails_the_step(models: Page) -> None:
    out = models.js("""async () => {
      const train = await session.compile({ model: "ErrNet()", loss: "err_mse", seed: 3,
        optimizer: "tg.optim.Adam(lr=1e-2)", inputs: { x: [4, 2], y: [4, 1] } });
      const short = await train.step({ x: new Float32Array(7), y: new Float32Array(4) });
      const missing = await train.step({ x: new Float32Array(8) });
      const ok = await train.step({ x: new Float32Array(8), y: new Float32Array(4) });
      await train.destroy();
      const e = (r) => ({ kind: r.kind, name: r.error?.name, message: r.error?.message });
      return { short: e(short), missing: e(missing), ok: ok.kind };
    }""")
    short, missing = out["short"], out["missing"]
    assert short["kind"] == "failed" and short["name"] == "ShapeError", out
    assert "input 'x'" in short["message"] and "expected 8 elements" in short["message"], out
    assert "7" in short["message"], out
    assert missing["kind"] == "failed" and "missing ['y']" in missing["message"], out
    assert out["ok"] == "completed", "a failed step must leave the graph usable"


def test_python_error_in_a_forward_fails_the_run(models: Page) -> None:
    """A forward with a None batch dim is traced on first use: its Python error is the run's."""
    out = models.js("""async () => {
      const train = await session.compile({ model: "ErrNet()", loss: "err_mse", seed: 3,
        optimizer: "tg.optim.Adam(lr=1e-2)", inputs: { x: [4, 2], y: [4, 1] } });
      const fwd = await train.attach({ forward: "err_forward_raises", inputs: { x: [null, 2] } });
      const small = await fwd.run({ x: new Float32Array(6) });
      const big = await fwd.run({ x: new Float32Array(10) });
      await train.destroy();
      return { small: small.kind, shape: small.outputShape, big: big.kind,
               name: big.error?.name, message: big.error?.message,
               traceback: big.error?.traceback };
    }""")
    assert out["small"] == "completed" and out["shape"] == [3, 1], out
    assert out["big"] == "failed" and out["name"] == "ValueError", out
    assert "batch 5 is too large" in out["message"], out
    assert "err_forward_raises" in out["traceback"], out


def test_python_error_in_a_script_rejects_run_script(models: Page) -> None:
    out = models.js("""async () => {
      const src = [
        "import tensorgrad as tg",
        "from tensorgrad.web import post",
        "async def main():",
        "    post({'kind': 'log', 'text': 'about to fail'})",
        "    train = await tg.compile(model=ErrNet(), loss=err_mse, seed=1,",
        "                             optimizer=tg.optim.Adam(lr=1e-2),",
        "                             inputs={'x': [4, 2], 'y': [4, 1]})",
        "    r = await train.step(x=[0.0] * 8, y=[0.0] * 4)",
        "    assert r.kind == 'completed', r",
        "    raise KeyError('no such column: ' + str(round(r.loss, 3)))",
      ].join("\\n");
      const posts = [];
      try {
        await session.runScript(src, { onPost: (d) => posts.push(d) });
        return { resolved: true };
      } catch (e) {
        return { name: e.name, message: e.message, traceback: e.traceback, posts };
      }
    }""")
    assert out.get("name") == "KeyError", out
    assert "no such column" in out["message"], out
    assert "raise KeyError" in out["traceback"] and "line 10" in out["traceback"], out
    assert out["posts"] == [{"kind": "log", "text": "about to fail"}], out


def test_compile_error_rejects_with_the_shape_error(models: Page) -> None:
    """Mistakes in the model raise at compile: the page's compile() rejects with them."""
    out = models.js("""() => session.compile({ model: "ErrNet()", loss: "err_mse", seed: 1,
                      optimizer: "tg.optim.Adam(lr=1e-2)", inputs: { x: [4, 3], y: [4, 1] } })
                    .then(() => ({ compiled: true }), (e) => ({ name: e.name, message: e.message }))""")
    assert out.get("name") == "ShapeError", out
    assert "3" in out["message"] and "2" in out["message"], out


INTERNAL = ("asyncio", "webloop", "pyodide", "tensorgrad/", "python314.zip", "<frozen")


def _last_frame(traceback: str) -> str:
    return [line for line in traceback.splitlines() if line.lstrip().startswith('File "')][-1]


def test_errors_end_at_the_users_line_not_in_pyodide(models: Page) -> None:
    """A mistake in the user's loss (at compile) and one in a script's own call: the message's
    call site and the traceback end at the user's line; the worker loop's, tensorgrad's,
    asyncio's and Pyodide's frames (webloop.py) are trimmed."""
    out = models.js("""async () => {
      const info = (e) => ({ name: e.name, message: e.message, traceback: e.traceback });
      const compiled = await session.compile({ model: "ErrNet()", loss: "err_broadcast",
          seed: 1, optimizer: "tg.optim.SGD(lr=0.1)", inputs: { x: [4, 2], y: [4, 1] } })
        .then(() => null, info);
      const script = await session.runScript([
        "import tensorgrad as tg",
        "async def main():",
        "    await tg.compile(model=ErrNet(), loss=err_mse, inputs='x',",
        "                     optimizer=tg.optim.SGD(lr=0.1))"].join("\\n")).then(() => null, info);
      return { compiled, script };
    }""")
    compiled, script = out["compiled"], out["script"]
    assert compiled["name"] == "ShapeError", out
    assert compiled["message"].startswith("sub: shapes [4, 1] and [2, 2] do not broadcast"), out
    assert re.search(r"\n  at <exec-\d+>:\d+ in err_broadcast$", compiled["message"]), out
    assert re.search(r'File "<exec-\d+>", line \d+, in err_broadcast', _last_frame(
        compiled["traceback"])), compiled["traceback"]
    assert script["name"] == "ShapeError", out
    assert re.search(r"^compile: inputs must be a dict .*; got str 'x'\n  at <exec-\d+>:3 in "
                     r"main$", script["message"]), out
    assert re.search(r'File "<exec-\d+>", line 3, in main', _last_frame(script["traceback"])), \
        script["traceback"]
    for err in (compiled, script):
        assert not any(word in err["message"] for word in INTERNAL), err["message"]
        frames = [line for line in err["traceback"].splitlines() if 'File "' in line]
        assert not any(word in line for line in frames for word in INTERNAL), err["traceback"]


def test_mixed_precision_without_shader_f16_rejects_with_feature_error(models: Page) -> None:
    """SwiftShader has no shader-f16: compiling with precision="mixed" raises FeatureError
    naming the feature and the adapter (no silent fallback to f32)."""
    out = models.js("""async () => {
      const src = [
        "import tensorgrad as tg",
        "async def main():",
        "    device = await tg.default_device()",
        "    assert 'shader-f16' not in device.info.features, device.info",
        "    await tg.compile(model=ErrNet(), loss=err_mse, seed=1, precision='mixed',",
        "                     optimizer=tg.optim.Adam(lr=1e-2), inputs={'x': [4, 2], 'y': [4, 1]})",
      ].join("\\n");
      try {
        await session.runScript(src);
        return { resolved: true };
      } catch (e) {
        return { name: e.name, message: e.message };
      }
    }""")
    assert out.get("name") == "FeatureError", out
    assert re.search(r"precision='mixed' needs the WebGPU feature 'shader-f16' .* the device "
                     r"on .*SwiftShader.* does not have", out["message"], re.IGNORECASE), out
