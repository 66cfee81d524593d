"""The handles explain themselves: ``repr()`` of a training, an attached and a standalone
forward, an executable and an export says what a user needs (params, inputs and their
shapes, optimizer, kernels, steps, device, live or destroyed) in one line, never the weights."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import tensorgrad as tg
from tests.native.api_helpers import run


class Wide(tg.Module):
    """Linear(8, 512) -> relu -> Linear(512, 2): 5,634 params, 22.5 KB of weights."""

    def __init__(self) -> None:
        self.l1, self.l2 = tg.Linear(8, 512), tg.Linear(512, 2)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l2(tg.relu(self.l1(x)))


def loss_fn(model: Wide, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.mean(tg.square(model(x) - y))


def one_line(text: str, limit: int) -> str:
    assert "\n" not in text and len(text) < limit, (len(text), text)
    return text


def test_training_and_forward_reprs_say_what_they_hold(gpu_device, tmp_path: Path) -> None:
    async def go() -> dict[str, str]:
        train = await tg.compile(model=Wide(), loss=loss_fn, device=gpu_device, seed=0,
                                 inputs={"x": (16, 8), "y": (16, 2)},
                                 optimizer=tg.optim.Adam(lr=1e-3))
        out = {"fresh": repr(train)}
        predict = await train.attach(forward=lambda m, x: m(x), inputs={"x": (None, 8)})
        out["forward_new"] = repr(predict)
        await train.step(x=np.zeros((16, 8), np.float32), y=np.zeros((16, 2), np.float32))
        await train.set_lr(5e-4)
        await predict.run(x=np.zeros((3, 8), np.float32))
        await predict.run(x=np.zeros((1, 8), np.float32))
        out["trained"], out["forward"] = repr(train), repr(predict)
        out["executable"] = repr(predict.graph_for(x=np.zeros((3, 8), np.float32)))
        ex = await tg.export.torch(predict, path=tmp_path / "wide.py")
        out["export"], out["weights"] = repr(ex), str(len(ex.weights))
        alone = await tg.compile_forward(model=Wide(), forward=lambda m, x: m(x), seed=1,
                                         inputs={"x": (4, 8)}, device=gpu_device)
        out["alone"] = repr(alone)
        alone.destroy()
        out["alone_gone"] = repr(alone)
        train.destroy()
        out["gone"], out["forward_gone"] = repr(train), repr(predict)
        return out

    r = run(go())
    device = gpu_device.description
    limit = 300 + len(device)
    fresh = one_line(r["fresh"], limit)
    assert fresh.startswith("<tg.Training of Wide: 5,634 params in 4 tensors, inputs "
                            "{x: f32[16, 8], y: f32[16, 2]}, Adam(lr=0.001), "), fresh
    assert re.search(rf"\d+ kernels, peak [\d.]+ KB, 0 steps done, on {re.escape(device)}, "
                     r"0 attached forwards>$", fresh), fresh
    trained = one_line(r["trained"], limit)
    assert "Adam(lr=0.0005)" in trained and "1 step done" in trained, trained
    assert trained.endswith("1 attached forward>"), trained
    assert one_line(r["forward_new"], limit) == (
        f"<tg.Forward of Wide: 5,634 params, inputs {{x: f32[None, 8]}} -> f32, no shape "
        f"compiled yet, on {device}, attached to a tg.Training>")
    forward = one_line(r["forward"], limit)
    assert re.search(r"2 shapes compiled \(x: \[3, 8\]; \d+ kernels \| x: \[1, 8\]; \d+ "
                     r"kernels\)", forward), forward
    executable = one_line(r["executable"], limit)
    assert executable.startswith("<Executable: inputs {x: f32[3, 8]}, ") and "live>" in executable
    export = one_line(r["export"], 300)
    assert int(r["weights"]) > 22_000 and "\\x" not in export, export
    assert export == ("<TorchExport Wide: inputs {x: f32[B, 8]} -> f32[B, 2], 4 param tensors, "
                      + re.search(r"source \d+ lines, ", export)[0]
                      + f"weights {int(r['weights']) / 1000:.1f} KB (safetensors), written to "
                      f"'{tmp_path / 'wide.py'}'>")
    assert one_line(r["alone"], limit).endswith(", standalone>")
    assert "5,634 params, inputs {x: f32[4, 8]} -> f32" in r["alone"]
    assert r["alone_gone"] == "<tg.Forward of Wide: destroyed, inputs {x: f32[4, 8]}, standalone>"
    assert r["gone"] == ("<tg.Training of Wide: destroyed after 1 step, inputs "
                         "{x: f32[16, 8], y: f32[16, 2]}>")
    assert r["forward_gone"] == ("<tg.Forward of Wide: destroyed, inputs {x: f32[None, 8]}, "
                                 "attached to a tg.Training>")
