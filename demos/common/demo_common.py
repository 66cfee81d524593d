"""What every demo's main.py shares: config, log, loading model.py and data, compiling with
a log line, the training loop with loss streaming and Stop, the figures of a run.

In the browser the page (demos/common/demo.js) imports this file as the module
``demo_common`` into the worker before it runs the demo's main.py (script mode); natively,
main.py puts demos/common on sys.path and imports it. A main.py holds only its own model
wiring, data and messages:

    D = demo_common.Script(globals(), "mlp_sin", DEFAULTS)
    async def main():
        cfg = D.config()
        m = await D.module("model")
        train = await D.compile(model=m.MLP(), loss=m.loss_fn, inputs=m.INPUTS, ...)
        run = await D.train(train, lambda: m.batch(rng), on_every=progress)
        return D.figures(run, fit_mse=...)

State (`D.state`, compiled handles, step count, losses) lives in the script's namespace, so
Start after Stop continues; the page's Stop sets ``CONTROL["stop"]`` there.
"""

from __future__ import annotations

import array
import asyncio
import importlib.util
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import tensorgrad as tg
from tensorgrad.web import TrainingRun, flat_buffer, import_source, in_pyodide, post, train_steps

DEMOS = Path(__file__).resolve().parents[1]


def log(text: str) -> None:
    """A progress line: the page's log and the console (natively: stdout)."""
    post({"kind": "log", "text": text})


def param_count(handle: Any) -> int:
    """Number of parameter values of a training or forward handle."""
    return int(handle.param_count)


def floats(output: Any) -> list[float]:
    """A forward's f32 output (numpy array or memoryview, any shape) as a flat list."""
    if hasattr(output, "reshape"):
        return [float(v) for v in output.reshape(-1).tolist()]
    return flat_buffer(output).tolist()


def ints(output: Any) -> list[int]:
    """A forward's i32 output as a flat list."""
    if hasattr(output, "reshape"):
        return [int(v) for v in output.reshape(-1).tolist()]
    return flat_buffer(output).tolist()


def shape_of(value: Any) -> tuple[int, ...]:
    """Shape of a downloaded param (numpy array or memoryview)."""
    return tuple(getattr(value, "shape", ()) or ())


def f32(value: Any) -> Any:
    """A downloaded param as a flat f32 buffer (becomes a Float32Array on the page)."""
    if hasattr(value, "reshape"):
        import numpy as np
        return np.ascontiguousarray(value, dtype=np.float32).reshape(-1)
    return flat_buffer(value)


def u8_to_f32(data: bytes, lo: float = 0.0, hi: float = 1.0) -> Any:
    """uint8 bytes as an f32 array (numpy when importable, else array.array) of
    lo + (hi - lo) * v / 255."""
    try:
        import numpy as np
    except ImportError:
        table = [lo + (hi - lo) * v / 255 for v in range(256)]
        return array.array("f", map(table.__getitem__, data))
    return (lo + (hi - lo) * np.frombuffer(data, np.uint8).astype(np.float32) / 255
            ).astype(np.float32)


def gather(flat: Any, rows: Sequence[int], size: int) -> Any:
    """Rows `rows` (each `size` values) of a flat array, concatenated into one flat f32
    array (numpy fancy indexing when `flat` is numpy, array slices otherwise)."""
    if hasattr(flat, "reshape"):
        return flat.reshape(-1, size)[list(rows)].reshape(-1)
    out = array.array("f")
    for r in rows:
        out += flat[r * size:(r + 1) * size]
    return out


def completed(result: Any, what: str) -> Any:
    """`result` when it completed, else RuntimeError naming `what`."""
    if result.kind != "completed":
        raise RuntimeError(f"{what}: {result.kind} {getattr(result, 'error', '')}")
    return result


def _local_data(name: str) -> Path:
    """A data file built natively from its pinned package (demos/data, cached in dist/)."""
    spec = importlib.util.spec_from_file_location("tensorgrad_demo_data", DEMOS / "data" /
                                                  "__init__.py")
    assert spec is not None and spec.loader is not None
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    for path in data.build_all(DEMOS.parent / "dist" / ".cache" / "data"):
        if path.name == name:
            return path
    raise FileNotFoundError(f"no demo data file {name!r} (demos/data/*.py build none)")


class Script:
    """One demo script's config and state, kept in the script's namespace `ns`."""

    def __init__(self, ns: dict[str, Any], name: str, defaults: Mapping[str, Any]):
        self.ns = ns
        self.name = name
        self.defaults = dict(defaults)
        self.state: dict[str, Any] = ns.setdefault("STATE", {})
        self.control: dict[str, Any] = ns.setdefault("CONTROL", {"stop": False})

    # -- config and messages --------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """DEFAULTS overridden by DEMO_CONFIG (the page's URL parameters, or the native
        command line); clears a pending Stop."""
        self.control["stop"] = False
        cfg = {**self.defaults, **(self.ns.get("DEMO_CONFIG") or {})}
        self.state["cfg"] = cfg
        return cfg

    @property
    def cfg(self) -> dict[str, Any]:
        return self.state.get("cfg") or self.config()

    log = staticmethod(log)

    def post(self, kind: str, **data: Any) -> None:
        post({"kind": kind, **data})

    def stopped(self) -> bool:
        return bool(self.control.get("stop"))

    # -- files ------------------------------------------------------------------------------
    async def module(self, stem: str = "model") -> ModuleType:
        """The demo's `stem`.py as module `{name}_{stem}` (once per worker)."""
        key = f"module:{stem}"
        if key not in self.state:
            base = self.cfg.get("base_url", "")
            here = Path(self.ns.get("__file__") or DEMOS / self.name / "main.py")
            self.state[key] = await import_source(f"{self.name}_{stem}",
                                                  f"{base}{stem}.py" if base else "",
                                                  here.with_name(f"{stem}.py"))
        return self.state[key]

    async def data(self, name: str) -> bytes:
        """A file of dist/web/data/ (fetched in the browser, built locally natively)."""
        key = f"data:{name}"
        if key not in self.state:
            t0 = time.perf_counter()
            if in_pyodide():
                from pyodide.http import pyfetch  # type: ignore[import-not-found]

                url = f"{self.cfg.get('data_url', '../../data/')}{name}"
                response = await pyfetch(url)
                if not response.ok:
                    raise OSError(f"GET {url}: HTTP {response.status}")
                blob = await response.bytes()
            else:
                blob = _local_data(name).read_bytes()
            self.state[key] = blob
            log(f"loaded {name}: {len(blob):,} bytes in "
                f"{1000 * (time.perf_counter() - t0):.0f} ms")
        return self.state[key]

    async def mnist(self, split: str, lo: float = 0.0, hi: float = 1.0
                    ) -> tuple[Any, bytes]:
        """MNIST `split` ("train": 8,000 digits, "test": 2,000): (pixels as a flat f32
        array of n·784 values scaled to lo..hi, labels as bytes)."""
        key = f"mnist:{split}:{lo}:{hi}"
        if key not in self.state:
            images = await self.data(f"mnist-{split}-images.u8")
            labels = await self.data(f"mnist-{split}-labels.u8")
            self.state[key] = (u8_to_f32(images, lo, hi), labels)
        return self.state[key]

    # -- compile and train ------------------------------------------------------------------
    async def compile(self, key: str = "train", **kwargs: Any) -> Any:
        """`tg.compile(**kwargs)` once per worker (seed from the config; the native device
        from the config when given), logging "compiled in ...". Returns the handle."""
        if key in self.state:
            train = self.state[key]
            self.post("setup", kernels=train.kernel_count, params=param_count(train),
                      compileMs=self.state.get("compile_ms"))
            return train
        cfg = self.cfg
        kwargs.setdefault("seed", cfg.get("seed"))
        if cfg.get("device") is not None:
            kwargs.setdefault("device", cfg["device"])
        t0 = time.perf_counter()
        train = await tg.compile(**kwargs)
        ms = 1000 * (time.perf_counter() - t0)
        self.state[key] = train
        self.state.setdefault("step", 0)
        self.state.setdefault("losses", [])
        self.state.update(compile_ms=ms, kernels=train.kernel_count, params=param_count(train))
        log(f"compiled in {ms:.0f} ms: {train.kernel_count} kernels, {param_count(train):,} "
            f"params, {train.device.description}")
        self.post("setup", kernels=train.kernel_count, params=param_count(train),
                  compileMs=ms)
        return train

    async def train(self, train: Any, batch: Callable[[], Mapping[str, Any]],
                    steps: int | None = None, *,
                    on_every: Callable[[int, float, float], Awaitable[None]] | None = None,
                    every: int | None = None, max_pending: int = 50) -> Any:
        """Up to `steps` (default cfg["steps"]) training steps from the current step count,
        losses streamed to the page, `on_every(step, loss, rate)` every `every` steps
        (default cfg["every"]), ending early on Stop. Returns the TrainingRun."""
        cfg = self.cfg
        run = await train_steps(train, batch, int(cfg["steps"] if steps is None else steps),
                                start_step=self.state.get("step", 0),
                                every=int(cfg.get("every", 100) if every is None else every),
                                on_every=self._tracking(on_every), should_stop=self.stopped,
                                losses=self.state.setdefault("losses", []),
                                max_pending=max_pending)
        self.state["step"] = run.step
        return run

    async def train_each(self, train: Any, batch: Callable[[], Awaitable[Mapping[str, Any]]],
                         steps: int | None = None, *,
                         on_every: Callable[[int, float, float], Awaitable[None]] | None = None,
                         every: int | None = None) -> Any:
        """Like :meth:`train` for batches that need awaiting (a rollout with the current
        policy): `await batch()` before each step. Returns one TrainingRun for them all."""
        cfg = self.cfg
        total = int(cfg["steps"] if steps is None else steps)
        every = int(cfg.get("every", 100) if every is None else every)
        run = TrainingRun(self.state.get("step", 0))
        t_run = t_mark = time.perf_counter()
        mark = run.step
        while run.run_steps < total and not self.stopped():
            feeds = await batch()
            if self.stopped():  # the batch itself may ask to stop (a target reached)
                break
            one = await self.train(train, lambda f=feeds: f, 1, every=1 << 30)
            run.step, run.last_loss = one.step, one.last_loss
            run.run_steps += 1
            run.step_seconds += one.step_seconds
            if on_every is not None and run.step % every == 0:
                rate = (run.step - mark) / (time.perf_counter() - t_mark)
                await on_every(run.step, one.last_loss, rate)
                t_mark, mark = time.perf_counter(), run.step
        run.stopped = self.stopped()
        run.wall_seconds = time.perf_counter() - t_run
        return run

    def _tracking(self, fn: Callable[[int, float, float], Awaitable[None]] | None
                  ) -> Callable[[int, float, float], Awaitable[None]] | None:
        if fn is None:
            return None

        async def call(step: int, loss: float, rate: float) -> None:
            self.state["step"] = step
            await fn(step, loss, rate)
        return call

    async def reset(self, *extra: str) -> None:
        """Fresh params and optimizer state of the compiled handle, step 0, losses cleared;
        `extra` state keys dropped."""
        if "train" in self.state:
            await self.state["train"].reset()
        self.state.update(step=0, losses=[])
        for key in extra:
            self.state.pop(key, None)

    def figures(self, run: Any, **extra: Any) -> dict[str, Any]:
        """The run's figures: steps, loss (and its mean over the last 10), speed, compile
        time, kernels, params, and `extra`."""
        losses = self.state.get("losses", [])
        recent = losses[-10:]
        return {
            "steps": run.step, "run_steps": run.run_steps, "stopped": run.stopped,
            "loss": losses[-1] if losses else None,
            "loss_avg10": sum(recent) / len(recent) if recent else None,
            **extra,
            "steps_per_s": run.steps_per_s, "wall_steps_per_s": run.wall_steps_per_s,
            "compile_ms": self.state.get("compile_ms"), "kernels": self.state.get("kernels"),
            "params": self.state.get("params"),
        }


def run_native(ns: dict[str, Any]) -> None:
    """`python demos/NAME/main.py key=value ...`: run main() with those config values,
    printing the log lines and the figures. Does nothing in the worker (where the script
    also runs as __main__: the page awaits main() itself)."""
    if in_pyodide():
        return
    def value(text: str) -> Any:
        for cast in (int, float):
            try:
                return cast(text)
            except ValueError:
                pass
        return text

    ns["DEMO_CONFIG"] = {k: value(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
    tg.web.set_sink(lambda d: print(d["text"], flush=True) if d.get("kind") == "log" else None)
    print(asyncio.run(ns["main"]()))
