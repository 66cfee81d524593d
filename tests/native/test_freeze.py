"""Frozen params (`Module.freeze`) on a native device: a training step leaves them bit-identical
whatever the optimizer (AdamW's decay, SGD's momentum and L2, Adam's per-param
normalize_grads path without arenas), compiles fewer kernels than the unfrozen model, trains
the rest as PyTorch does with those params' requires_grad off, and still reads the values
uploaded to them (the transfer-learning case: pretrained features, a new head)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import tensorgrad as tg

B, SIDE, CLASSES = 8, 6, 3


class ConvNet(tg.Module):
    def __init__(self) -> None:
        self.features = tg.Conv2d(1, 4, 3, padding=1, init=tg.init.kaiming())
        self.head = tg.Linear(4 * SIDE * SIDE, CLASSES)

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        h = tg.relu(self.features(x))
        return self.head(tg.reshape(h, (x.shape[0], -1)))


def loss_fn(m: ConvNet, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
    return tg.cross_entropy(m(x), y)


INPUTS = {"x": (B, 1, SIDE, SIDE), "y": ((B,), "i32")}


def batches(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [{"x": rng.normal(size=(B, 1, SIDE, SIDE)).astype(np.float32),
             "y": rng.integers(0, CLASSES, B).astype(np.int32)} for _ in range(n)]


def frozen_net() -> ConvNet:
    net = ConvNet()
    net.features.freeze()
    return net


async def train(device: Any, model: ConvNet, optimizer: Any, steps: list[dict[str, Any]],
                upload: dict[str, np.ndarray] | None = None
                ) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray], list[float]]:
    """(handle, params before, params after, losses) of `steps` training steps."""
    train = await tg.compile(model=model, loss=loss_fn, inputs=INPUTS, optimizer=optimizer,
                             seed=0, device=device)
    if upload is not None:
        await train.upload_params(upload, partial=True)
    before = {k: np.array(v) for k, v in (await train.download_params()).items()}
    losses = []
    for feeds in steps:
        result = await train.step(**feeds)
        assert result.kind == "completed", result
        losses.append(result.loss)
    after = {k: np.array(v) for k, v in (await train.download_params()).items()}
    return train, before, after, losses


OPTIMIZERS = {
    "adamw_decay_clip": tg.optim.AdamW(lr=0.05, weight_decay=0.1, clip_grad_norm=0.5),
    "sgd_momentum_l2": tg.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.1),
    "adam_normalized": tg.optim.Adam(lr=0.05, normalize_grads=True),  # no arena
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_frozen_params_stay_bit_identical_while_the_head_trains(gpu_device, name) -> None:
    async def go() -> None:
        one = batches(1) * 12  # one batch again and again: its loss falls
        handle, before, after, losses = await train(gpu_device, frozen_net(),
                                                    OPTIMIZERS[name], one)
        assert np.array_equal(before["features.W"], after["features.W"])
        assert np.array_equal(before["features.b"], after["features.b"])
        assert not np.array_equal(before["head.W"], after["head.W"])
        assert losses[-1] < losses[0], losses
        assert sorted(await handle.download_param_grads()) == ["head.W", "head.b"]
        assert handle.param_names == ["features.W", "features.b", "head.W", "head.b"]
        full = await tg.compile(model=ConvNet(), loss=loss_fn, inputs=INPUTS,
                                optimizer=OPTIMIZERS[name], seed=0, device=gpu_device)
        print(f"\n{name}: {handle.kernel_count} kernels frozen, {full.kernel_count} not")
        assert handle.kernel_count < full.kernel_count
    asyncio.run(go())


def torch_steps(params: dict[str, np.ndarray], steps: list[dict[str, np.ndarray]]
                ) -> tuple[list[float], dict[str, np.ndarray]]:
    """The same model in PyTorch, features.requires_grad off, AdamW with clipping (decay on
    head.W: tensorgrad does not decay params initialised to zeros)."""
    import torch
    import torch.nn.functional as F

    p = {k: torch.tensor(v, requires_grad=k.startswith("head.")) for k, v in params.items()}
    head = [p["head.W"], p["head.b"]]
    opt = torch.optim.AdamW([{"params": [p["head.W"]]},  # a zero-init bias does not decay
                             {"params": [p["head.b"]], "weight_decay": 0.0}],
                            lr=0.05, weight_decay=0.1)
    losses = []
    for feeds in steps:
        x = torch.from_numpy(feeds["x"])
        h = F.relu(F.conv2d(x, p["features.W"], p["features.b"], padding=1))
        loss = F.cross_entropy(h.reshape(B, -1) @ p["head.W"] + p["head.b"],
                               torch.from_numpy(feeds["y"]).long())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head, 0.5)
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().numpy() for k, v in p.items()}


def test_a_frozen_extractor_with_uploaded_weights_trains_like_torch(gpu_device) -> None:
    """Pretrained values uploaded to the frozen params are what the step and an attached
    forward read; the head follows PyTorch's AdamW (decay on the head only: the frozen
    params are not decayed either)."""
    rng = np.random.default_rng(7)
    pretrained = {"features.W": rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32),
                  "features.b": rng.normal(0, 0.1, (4,)).astype(np.float32)}
    steps = batches(10)

    async def go() -> None:
        handle, before, after, losses = await train(
            gpu_device, frozen_net(), OPTIMIZERS["adamw_decay_clip"], steps, pretrained)
        for k, v in pretrained.items():
            assert np.array_equal(before[k], v) and np.array_equal(after[k], v), k
        want_losses, want = torch_steps(before, steps)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
        for k in want:  # 10 Adam steps of up to 0.05 each: within 1% of one step (1.1e-4 seen)
            np.testing.assert_allclose(after[k], want[k], rtol=1e-4, atol=5e-4, err_msg=k)
        forward = await handle.attach(forward=lambda m, x: m(x), inputs={"x": (None, 1, SIDE,
                                                                              SIDE)})
        x = steps[0]["x"][:3]
        out = (await forward.run(x=x)).output
        import torch
        import torch.nn.functional as F
        t = {k: torch.from_numpy(v) for k, v in after.items()}
        h = F.relu(F.conv2d(torch.from_numpy(x), t["features.W"], t["features.b"], padding=1))
        np.testing.assert_allclose(out, (h.reshape(3, -1) @ t["head.W"] + t["head.b"]).numpy(),
                                   rtol=1e-4, atol=1e-5)
    asyncio.run(go())


def test_compiling_with_every_param_frozen_names_them(gpu_device) -> None:
    async def go() -> None:
        await tg.compile(model=ConvNet().freeze(), loss=loss_fn, inputs=INPUTS,
                         optimizer=tg.optim.Adam(lr=1e-3), seed=0, device=gpu_device)
    with pytest.raises(tg.TraceError, match=r"every f32 param of the model is frozen "
                       r"\(Module.freeze\)"):
        asyncio.run(go())


def test_frozen_params_stay_f32_masters_under_mixed_precision(gpu_device) -> None:
    """precision="mixed" (scaled gradients, f16 activations) over a frozen extractor: the
    uploaded pretrained values (not f16-representable) come back bit-identical as f32, only
    the head gets gradients and moves, and the losses follow the f32 run's."""
    rng = np.random.default_rng(7)
    pretrained = {"features.W": rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32),
                  "features.b": rng.normal(0, 0.1, (4,)).astype(np.float32)}
    assert not np.array_equal(pretrained["features.W"].astype(np.float16), pretrained["features.W"])
    steps = batches(1) * 12

    async def go(precision: str) -> tuple[dict[str, np.ndarray], list[float], list[str]]:
        handle = await tg.compile(model=frozen_net(), loss=loss_fn, inputs=INPUTS,
                                  optimizer=tg.optim.AdamW(lr=0.05, weight_decay=0.1),
                                  seed=0, device=gpu_device, precision=precision)
        await handle.upload_params(pretrained, partial=True)
        before = {k: np.array(v) for k, v in (await handle.download_params()).items()}
        losses = []
        for feeds in steps:
            result = await handle.step(**feeds)
            assert result.kind == "completed" and not result.skipped, result
            losses.append(result.loss)
        after = {k: np.array(v) for k, v in (await handle.download_params()).items()}
        for k, v in pretrained.items():
            assert after[k].dtype == np.float32 and np.array_equal(after[k], v), k
        assert not np.array_equal(before["head.W"], after["head.W"])
        grads = sorted(await handle.download_param_grads())
        handle.destroy()
        return after, losses, grads

    after, losses, grads = asyncio.run(go("mixed"))
    f32_after, f32_losses, f32_grads = asyncio.run(go("f32"))
    assert grads == f32_grads == ["head.W", "head.b"]
    assert losses[-1] < 0.5 * losses[0], losses
    np.testing.assert_allclose(losses, f32_losses, rtol=0.02)
    np.testing.assert_allclose(after["head.W"], f32_after["head.W"], atol=0.02)
