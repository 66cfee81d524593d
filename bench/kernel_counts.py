#!/usr/bin/env python3
"""Kernel counts of the demo and test models, without a device: one line per graph.

    python bench/kernel_counts.py                  # a table: graph, target, kernels, dispatch labels
    python bench/kernel_counts.py --json out.json  # the same as JSON (to compare two commits)

Each demo's training step (`demos/<name>/model.py`: its model, `loss_fn`, `INPUTS`,
`optimizer()`) and forward graphs (None dims at 4), and the small models of
`tests/models.py` under each optimizer kind, compiled up to the emit stage for two
targets: a GPU (``gpu``) and a CPU-emulated one (``software``: lavapipe, SwiftShader; no
split-K). Per graph: the kernel count, the dispatch labels counted by kind and a hash of
the final IR's text (the same graph node for node), so that a change to the compiler that
must keep the fused graphs as they were can be checked by comparing two runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tensorgrad as tg
from tensorgrad.codegen.kernel import Target
from tensorgrad.compiler import Options, Request, compile_graph
from tensorgrad.ops import OPS
from tensorgrad.runtime import dispatch_label
from tests.models import DeepMLP, TinyMLP, demo

# demo: (model class, [(forward function, its inputs)])
DEMOS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "addition_transformer": ("AdditionTransformer", [("predict_fn", "PREDICT_INPUTS")]),
    "cartpole": ("Policy", []),
    "digit_canvas": ("MLP", [("predict_fn", "PREDICT_INPUTS")]),
    "flow_matching": ("VelocityNet", [("velocity_fn", "VELOCITY_INPUTS")]),
    "kan": ("KAN", [("predict_fn", "PREDICT_INPUTS")]),
    "makemore": ("CharTransformer", [("loss_fn", "VAL_INPUTS"),
                                     ("logits_fn", "LOGITS_INPUTS")]),
    "mlp_sin": ("MLP", [("predict_fn", "PREDICT_INPUTS")]),
    "mnist_cnn": ("CNN", [("predict_fn", "PREDICT_INPUTS")]),
    "nerf": ("Field", [("render_fn", "RENDER_INPUTS")]),
    "pokeformer": ("Pokeformer", [("loss_fn", "VAL_INPUTS"),
                                  ("sample_fn", "SAMPLE_INPUTS")]),
    "tic_tac_toe": ("Policy", [("probs_fn", "PLAY_INPUTS"),
                               ("greedy_fn", "PLAY_INPUTS")]),
    "vae": ("VAE", [("reconstruct_fn", "RECON_INPUTS"),
                    ("decode_fn", "DECODE_INPUTS")]),
}
OPTIMIZERS: dict[str, Callable[[], Any]] = {
    "adam": lambda: tg.optim.Adam(lr=1e-3, clip_grad_norm=1.0),
    "adamw": lambda: tg.optim.AdamW(lr=1e-3, normalize_grads="*.W"),
    "sgd": lambda: tg.optim.SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
}
TARGETS = {"gpu": Target(), "software": Target(software=True)}


def _resolved(inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` with every None dim at 4."""
    def fix(decl: Any) -> Any:
        if isinstance(decl, tuple) and len(decl) == 2 and isinstance(decl[1], str):
            return (fix(decl[0]), decl[1])
        return tuple(4 if d is None else d for d in decl)
    return {n: fix(d) for n, d in inputs.items()}


def graphs() -> Iterator[tuple[str, Request]]:
    """(name, request) of every graph counted."""
    for name, (cls, forwards) in DEMOS.items():
        mod = demo(name)
        model = getattr(mod, cls)()
        yield f"{name}: step", Request("training", model, mod.loss_fn, mod.INPUTS,
                                       optimizer=mod.optimizer(), seed=0)
        for fn, inputs in forwards:
            yield f"{name}: {fn}", Request("forward", model, getattr(mod, fn),
                                           _resolved(getattr(mod, inputs)))
    for kind, make in OPTIMIZERS.items():
        yield f"TinyMLP: step, {kind}", Request(
            "training", TinyMLP(), lambda m, x, y: tg.mean(tg.square(m(x) - y)),
            {"x": (16, 2), "y": (16, 1)}, optimizer=make(), seed=0)
        yield f"DeepMLP: step, {kind}", Request(
            "training", DeepMLP(), lambda m, x: tg.mean(tg.square(m(x))), {"x": (16, 8)},
            optimizer=make(), seed=0)


def count(request: Request, target: Target) -> dict[str, Any]:
    """The kernel count and the dispatch labels (by kind) of `request` compiled for `target`."""
    c = compile_graph(request, Options(target=target), until="emit")
    labels = [dispatch_label(n, OPS) for n, k in zip(c.graph.nodes, c.kernels) if k.threads > 0]
    return {"kernels": len(labels), "labels": dict(sorted(Counter(labels).items())),
            "ir_sha1": hashlib.sha1(str(c.graph).encode()).hexdigest()[:12]}


def main() -> None:
    """Print the table (or write it as JSON with --json)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write {graph: {target: counts}} here")
    args = ap.parse_args()
    out: dict[str, dict[str, Any]] = {}
    for name, request in graphs():
        out[name] = {t: count(request, target) for t, target in TARGETS.items()}
        print(f"{name:44s} " + "  ".join(f"{t} {v['kernels']:4d}"
                                         for t, v in out[name].items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
