"""Every demo's script (demos/NAME/main.py, the same file the page runs in the worker) run
natively to its target: each test trains the demo's own model, loss and optimizer with the
smallest budget that shows the target, on the session's native device, and prints the
figures reached. Data comes from demos/data (pinned packages, converted and cached)."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tensorgrad.web import script as web_script

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "demos" / "common"))


def load_script(name: str) -> ModuleType:
    """A fresh module of demos/NAME/main.py (its own STATE)."""
    path = ROOT / "demos" / name / "main.py"
    spec = importlib.util.spec_from_file_location(f"tensorgrad_demo_main_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_script(mod: ModuleType, device: Any, monkeypatch: Any, **cfg: Any
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run `mod.main()` with DEMO_CONFIG = cfg on `device`; (figures, posted messages)."""
    posts: list[dict[str, Any]] = []
    monkeypatch.setattr(web_script, "_sink", posts.append)
    mod.DEMO_CONFIG = {**cfg, "device": device}
    t0 = time.perf_counter()
    figures = asyncio.run(mod.main())
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    logs = [p["text"] for p in posts if p.get("kind") == "log"]
    print(f"\n{mod.D.name}: " + "\n  ".join(logs[-6:]) + f"\n  figures: {figures}")
    return figures, posts


def kinds(posts: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [p for p in posts if p.get("kind") == kind]


def test_mnist_cnn_reaches_97_percent_on_held_out_digits(gpu_device, monkeypatch) -> None:
    mod = load_script("mnist_cnn")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=1200, every=150,
                                until=0.97, seed=1)
    evals = kinds(posts, "eval")
    assert evals[-1]["n"] == 2000 and evals[0]["step"] == 0
    assert evals[0]["acc"] < 0.3, evals[0]     # an untrained net guesses
    assert figures["test_acc"] >= 0.97, figures
    assert figures["steps"] <= 1200 and figures["params"] == 16 * 9 + 16 + 32 * 16 * 9 + 32 + \
        1568 * 64 + 64 + 64 * 10 + 10


def test_digit_canvas_mlp_reaches_95_percent_and_swaps_models(gpu_device, monkeypatch
                                                              ) -> None:
    mod = load_script("digit_canvas")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=3000, every=250,
                                until=0.95, seed=1)
    assert figures["test_acc"] >= 0.95 and figures["hidden"] == 128, figures

    async def canvas_and_params() -> None:
        test = await mod.D.mnist("test")
        one, labels = [float(v) for v in test.images[:784]], test.labels
        first, second = await asyncio.gather(mod.canvas_predict(one), mod.canvas_predict(one))
        # single-flight: of two calls at once the first either ran or was superseded
        assert second is not None and len(second) == 10
        assert abs(sum(second) - 1) < 1e-4 and second.index(max(second)) == labels[0]
        assert first is None or first == second
        await mod.export_params()
        saved = kinds(posts, "params")[-1]
        await mod.set_hidden(32)
        assert mod.STATE["params"] == 784 * 32 + 32 + 32 * 10 + 10 and mod.STATE["step"] == 0
        small = await mod.canvas_predict(one)
        assert small is not None and small != second
        import base64
        blobs = {n: base64.b64encode(memoryview(v).cast("B")).decode()
                 for n, v in zip(saved["names"], saved["values"])}
        await mod.import_params(saved["hidden"], blobs)
        assert mod.STATE["hidden"] == 128
        again = await mod.canvas_predict(one)
        assert again is not None and max(abs(a - b) for a, b in zip(again, second)) < 1e-5

    asyncio.run(canvas_and_params())
    # the page's drawing asks canvas_predict on every stroke: MNIST loads (and says so) once
    logs = [p["text"] for p in posts if p.get("kind") == "log"]
    assert sum(text.startswith("loading MNIST") for text in logs) == 1, logs


def test_cartpole_reaches_mean_episode_length_150(gpu_device, monkeypatch) -> None:
    mod = load_script("cartpole")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=300, every=20, until=150,
                                seed=1)
    episodes = kinds(posts, "episodes")
    assert episodes[0]["mean"] < 50, episodes[0]   # a random policy falls within ~20 steps
    assert figures["mean_length_avg10"] >= 150, figures
    assert all(1 <= n <= 200 for e in episodes for n in e["lengths"])
    trajectory = kinds(posts, "eval")[-1]
    assert len(trajectory["xs"]) == len(trajectory["thetas"]) > 1


def test_kan_fits_sin_below_1e_3_and_reports_its_splines(gpu_device, monkeypatch) -> None:
    mod = load_script("kan")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=400, every=200, seed=1)
    assert figures["fit_mse"] < 1e-3 and figures["loss_avg10"] < 1e-3, figures
    first, last = kinds(posts, "eval")[0], kinds(posts, "eval")[-1]
    assert len(last["layer1"]) == 4 and len(last["layer2"]) == 4
    assert all(len(c) == 101 for c in last["layer1"] + last["layer2"])
    assert last["layer1"] != first["layer1"]  # the edge functions moved


def test_tic_tac_toe_never_loses_after_training(gpu_device, monkeypatch) -> None:
    """Issue 9's target: after training the greedy policy never loses to a random player over
    200 games. Rollouts of 16 games as X + 16 as O against random moves with targets from the
    exact critic (demos/tic_tac_toe/model.py), an evaluation every 50, stopped (`until`) at
    the first at which the exact loss probability is 0 from both seats: rollout 650 with seed 1
    here. The untrained policy loses ~45%."""
    mod = load_script("tic_tac_toe")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=1000, every=50,
                                games=200, seed=1, until=1)
    evals = kinds(posts, "eval")
    assert evals[0]["losses"] > 40 and evals[0]["x_loss"] > 0.1, evals[0]   # untrained
    assert figures["stopped"] and figures["steps"] < 1000, figures
    assert figures["x_games"] == figures["o_games"] == 100, figures
    # it loses to no sequence of random moves at all from either seat, so none of its games
    assert figures["x_loss_prob"] == 0 and figures["o_loss_prob"] == 0, figures
    assert figures["losses_vs_random"] == 0 and figures["win_rate"] >= 0.8, figures
    m = mod.STATE["module:model"]
    extra = asyncio.run(m.versus_random(mod.STATE["greedy"], 200, random.Random(7)))
    assert extra["games"] == 200 and extra["losses"] == 0, extra
    # a policy move on an open board is a legal cell
    cell = asyncio.run(mod.policy_move([1, 0, 0, 0, 2, 0, 0, 0, 0], 1))
    assert cell in (1, 2, 3, 5, 6, 7, 8)


def test_vae_loss_falls_below_40(gpu_device, monkeypatch) -> None:
    mod = load_script("vae")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=300, every=150, seed=1)
    pictures = kinds(posts, "eval")
    assert pictures[0]["test_recon"] > 45, pictures[0]["test_recon"]
    assert figures["loss_avg10"] < 40 and figures["test_recon_error"] < 30, figures
    assert len(pictures[-1]["samples"]) == 16 * 784 and len(pictures[-1]["recons"]) == 16 * 784


def test_nerf_image_mse_falls_below_0_006(gpu_device, monkeypatch) -> None:
    mod = load_script("nerf")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=400, every=200, seed=1)
    renders = kinds(posts, "eval")
    assert renders[0]["mse"] > 0.03, renders[0]["mse"]   # the untrained field is far off
    assert figures["image_mse"] < 0.006 and figures["psnr"] > 22, figures
    assert len(renders[-1]["rgb"]) == 64 * 64 * 3


def test_flow_matching_loss_falls_below_1_3(gpu_device, monkeypatch) -> None:
    """Full-resolution 32-channel convs run at ~6 s/step on lavapipe: a short run shows the
    loss falling from ~2 (predicting 0 for x₁ − x₀) and the sampler producing digits."""
    mod = load_script("flow_matching")
    _, posts = run_script(mod, gpu_device, monkeypatch, steps=14, every=14, samples=2,
                                seed=1)
    losses = mod.STATE["losses"]
    assert losses[0] > 1.5 and sum(losses[-4:]) / 4 < 1.3, losses
    samples = kinds(posts, "eval")[-1]
    assert samples["n"] == 2 and len(samples["images"]) == 2 * 784
    assert all(abs(v) < 50 for v in samples["images"])


def test_makemore_beats_the_unigram_baseline_and_samples_names(gpu_device, monkeypatch
                                                               ) -> None:
    mod = load_script("makemore")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=60, every=60, seed=1)
    evals = kinds(posts, "eval")
    assert evals[0]["val_loss"] > evals[0]["unigram"] > 2.5, evals[0]   # ln 27 ≈ 3.30 at first
    assert figures["val_loss"] < figures["unigram_loss"] - 0.2, figures
    names = evals[-1]["samples"]
    assert len(names) == 12 and all(n.isalpha() or n == "" for n in names), names
    assert sum(len(n) for n in names) > 12, names


def test_pokeformer_beats_the_unigram_baseline_and_samples_in_graph(gpu_device, monkeypatch
                                                                    ) -> None:
    mod = load_script("pokeformer")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=60, every=60, seed=1)
    evals = kinds(posts, "eval")
    assert evals[0]["val_loss"] > evals[0]["unigram"], evals[0]
    assert figures["val_loss"] < figures["unigram_loss"] - 0.1, figures
    names = evals[-1]["samples"]
    assert len(names) == 12 and all(n.isalpha() or n == "" for n in names), names


def load_transfer_pretrain() -> ModuleType:
    """demos/transfer/pretrain.py as a module."""
    spec = importlib.util.spec_from_file_location("tensorgrad_demo_transfer_pretrain",
                                                  ROOT / "demos" / "transfer" / "pretrain.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_transfer_extractor_gives_its_stated_accuracy(gpu_device) -> None:
    """The committed extractor.safetensors (well under 1 MB) loads strictly and, with the
    pretraining classifier saved beside it, classifies the 1,371 held-out test digits 0-6 as
    well as its metadata says (98.7%)."""
    import tensorgrad as tg

    pre = load_transfer_pretrain()
    data = pre.WEIGHTS.read_bytes()
    meta = pre.read_metadata(data)
    weights = tg.load_safetensors(data)
    m = pre.load_model()
    net = m.PretrainNet()
    names = {n if n.startswith("features.") else f"pretrain.{n}": n for n in net.param_names()}
    assert len(data) < 500_000 and set(weights) == set(names), (len(data), sorted(weights))
    assert meta["made_by"] == "demos/transfer/pretrain.py" and meta["steps"] == "1000", meta

    async def check() -> float:
        test = await pre.dc.Script({}, "transfer_check", {"seed": 1}).mnist("test")
        rows = pre.rows_of(test, m.PRETRAIN_CLASSES)
        assert len(rows) == int(meta["held_out"]) == 1371
        forward = await tg.compile_forward(model=net, forward=m.classify_fn,
                                           inputs=m.PREDICT_INPUTS, output="i32",
                                           device=gpu_device, seed=0)
        await forward.upload_params({names[k]: v for k, v in weights.items()})
        return await pre.accuracy(forward, test, rows, [test.labels[r] for r in rows])

    acc = asyncio.run(check())
    print(f"\ntransfer extractor: held-out 0-6 accuracy {acc:.4f}, stated "
          f"{meta['held_out_acc']} ({meta['device']})")
    assert acc >= 0.985 and abs(acc - float(meta["held_out_acc"])) < 0.002, (acc, meta)


def test_transfer_pretrain_py_makes_the_committed_weights_again(gpu_device) -> None:
    """pretrain.py with its defaults (1,000 steps: about 1-1.5 minutes on lavapipe) writes
    the committed file byte for byte on the device it was made on; elsewhere (other float
    rounding) weights of the same names and shapes, as accurate within 1%."""
    import tensorgrad as tg

    pre = load_transfer_pretrain()
    data = pre.WEIGHTS.read_bytes()
    meta = pre.read_metadata(data)
    params, figures = asyncio.run(pre.pretrain(device=gpu_device))
    print(f"\ntransfer pretrain: {figures}")
    made = tg.save_safetensors(params, pre.metadata(figures))
    if figures["device"] == meta["device"]:
        assert made == data, "pretrain.py made other weights on the device of the file"
    committed = tg.load_safetensors(data)
    assert {k: v.shape for k, v in tg.load_safetensors(made).items()} == \
        {k: v.shape for k, v in committed.items()}
    assert abs(figures["held_out_acc"] - float(meta["held_out_acc"])) < 0.01, (figures, meta)


def test_transfer_head_learns_new_digits_from_few_examples_with_a_frozen_extractor(
        gpu_device, monkeypatch) -> None:
    """The demo's quick start: a new head on the frozen pretrained extractor, trained on the
    first 8 training digits of each of 7, 8 and 9 (never seen in pretraining), reaches 90% on
    the 629 held-out 7-9s (93.0% measured; 5 examples each: 83.0%, stated 80%), while every
    extractor param stays bit-identical to the committed file. The same frozen extractor at
    its random init reaches less (88.7%). Then the user's own classes: set_examples, training,
    a live prediction."""
    import numpy as np

    import tensorgrad as tg

    mod = load_script("transfer")
    figures, posts = run_script(mod, gpu_device, monkeypatch, steps=100, every=50, seed=1,
                                shots=8)
    evals = kinds(posts, "eval")
    assert evals[0]["step"] == 0 and evals[-1]["n"] == 629, evals[0]
    assert figures["held_out_acc"] >= 0.90 and figures["train_acc"] == 1, figures
    assert all(e["unchanged"] for e in evals) and figures["extractor_unchanged"], evals
    train = mod.STATE["train"]
    params = asyncio.run(train.download_params())
    committed = tg.load_safetensors((ROOT / "demos" / "transfer" /
                                     "extractor.safetensors").read_bytes())
    frozen = [n for n in params if n.startswith("features.")]
    assert len(frozen) == 4
    for name in frozen:
        assert np.array_equal(np.asarray(params[name]), committed[name]), name
    assert sorted(asyncio.run(train.download_param_grads())) == ["head.W", "head.b"]

    few, _ = run_script(load_script("transfer"), gpu_device, monkeypatch, steps=100,
                        every=100, seed=1, shots=5)
    assert few["held_out_acc"] >= 0.80 and few["extractor_unchanged"], few
    rand, _ = run_script(load_script("transfer"), gpu_device, monkeypatch, steps=100,
                         every=100, seed=1, shots=8, features="random")
    assert rand["held_out_acc"] < figures["held_out_acc"] - 0.02, (rand, figures)
    assert rand["extractor_unchanged"], rand

    async def own_classes() -> tuple[list[float] | None, Any]:
        test = await mod.D.mnist("test")
        rows = {c: [i for i, label in enumerate(test.labels) if label == c] for c in (0, 1, 2)}
        drawings = [[test.pixels([r]).tolist() for r in rows[c][:4]] for c in (0, 1, 2)]
        with pytest.raises(ValueError, match=r"set_examples: class 'b' has no drawings"):
            await mod.set_examples(["a", "b", "c"], [drawings[0], [], drawings[2]])
        await mod.set_examples(["zero", "one", "two"], drawings)
        assert mod.D.step == 0 and not mod.STATE["builtin"]
        mod.DEMO_CONFIG = {"steps": 60, "every": 60, "seed": 1, "device": gpu_device}
        figures = await mod.main()
        probs = await mod.canvas_predict(test.pixels([rows[1][10]]).tolist())
        return probs, figures

    own_posts: list[dict[str, Any]] = []
    monkeypatch.setattr(web_script, "_sink", own_posts.append)
    probs, own = asyncio.run(own_classes())
    assert "held_out_acc" not in own and own["train_acc"] == 1, own
    assert own["classes"] == "zero, one, two", own
    assert own["extractor_unchanged"], own
    assert probs is not None and len(probs) == 3 and abs(sum(probs) - 1) < 1e-4, probs
    assert probs.index(max(probs)) == 1, probs
    assert len(kinds(own_posts, "examples")) == 1  # set_examples's: predictions post none
    shown = kinds(own_posts, "examples")[-1]
    assert shown["names"] == ["zero", "one", "two"] and shown["counts"] == [4, 4, 4], shown
    assert len(shown["images"][0]) == 4 * 784 and not shown["builtin"]
