"""Script mode: what a training script running in the worker uses to talk to its page.

Inside the worker (Pyodide), :func:`post` sends ``{kind: "post", id, data}`` to the page, where
``id`` is the ``runScript`` request that is running, so the page routes it to that script's
``onPost``. Typed arrays in ``data`` are transferred, Python buffers become fresh typed arrays.
Outside Pyodide (CPython), :func:`post` hands ``data`` to the sink set by :func:`set_sink`
(by default it prints it), so the same script runs natively. :func:`train_steps` and
:func:`import_source` are the pieces every training page needs.
"""

from __future__ import annotations

import array
import importlib.util
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ..gpu import in_pyodide
from .convert import to_js_value

__all__ = ["TrainingRun", "current_request", "import_source", "post", "set_sink",
           "train_steps"]

current_request: ContextVar[int | None] = ContextVar("tensorgrad_request", default=None)
"""The id of the ``runScript`` request whose script is running (asyncio tasks inherit it):
where :func:`post` sends its data."""

_sink: Callable[[Any], None] | None = None


def set_sink(sink: Callable[[Any], None] | None) -> None:
    """Where :func:`post` sends data outside Pyodide (None: print it)."""
    global _sink
    _sink = sink


def post(data: Any) -> None:
    """Stream `data` (JSON-like values, buffers, typed arrays) to the page."""
    if not in_pyodide():
        (_sink or print)(data)
        return
    import js

    message = to_js_value({"kind": "post", "id": current_request.get(), "data": data})
    send = getattr(js, "tensorgradPost", None) or js.postMessage
    send(message)


async def import_source(name: str, url: str, local_path: str | Path) -> ModuleType:
    """Import a module's source as `name`: fetched from `url` into the worker's filesystem
    inside Pyodide, read from `local_path` natively. The module is put in `sys.modules`."""
    path = Path(local_path)
    if in_pyodide():
        from pyodide.http import pyfetch

        response = await pyfetch(url)
        if not response.ok:
            raise OSError(f"GET {url}: HTTP {response.status}")
        path = Path("/home/pyodide/modules") / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(await response.string())
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {name} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class TrainingRun:
    """What :func:`train_steps` did: steps taken, losses, and its speed."""

    step: int                    # the global step count after the run
    run_steps: int = 0
    stopped: bool = False
    last_loss: float | None = None
    step_seconds: float = 0.0    # time inside train.step
    wall_seconds: float = 0.0

    @property
    def steps_per_s(self) -> float | None:
        """Steps per second of the time spent inside ``train.step`` (None before a step)."""
        return self.run_steps / self.step_seconds if self.step_seconds else None

    @property
    def wall_steps_per_s(self) -> float | None:
        """Steps per second of the run's wall time, streaming and callbacks included."""
        return self.run_steps / self.wall_seconds if self.wall_seconds else None


async def train_steps(train: Any, next_batch: Callable[[], Mapping[str, Any]], steps: int, *,
                      start_step: int = 0, every: int | Callable[[int], bool] = 100,
                      on_every: Callable[[int, float, float], Awaitable[None]] | None = None,
                      should_stop: Callable[[], bool] = lambda: False,
                      losses: list[float] | None = None, max_pending: int = 50,
                      stream_seconds: float = 0.25) -> TrainingRun:
    """Run up to `steps` training steps, streaming losses to the page.

    Posts `{kind: "loss", step, losses}` (a Float32Array of consecutive per-step losses,
    `step` the first one's number) at least every `stream_seconds`; every `every` steps
    (or, when `every` is a function of the step number, after each step it is true for)
    awaits `on_every(step, loss, steps_per_s since the last call)`. Stops early when
    `should_stop()` is true; a step that does not complete raises RuntimeError."""
    due = every if callable(every) else lambda step: step % every == 0
    run = TrainingRun(start_step)
    pending = array.array("f")
    t_run = t_mark = t_post = time.perf_counter()
    mark = start_step

    def flush() -> None:
        nonlocal pending, t_post
        if pending:
            post({"kind": "loss", "step": run.step - len(pending) + 1, "losses": pending})
        pending, t_post = array.array("f"), time.perf_counter()

    try:
        while run.run_steps < steps and not should_stop():
            t0 = time.perf_counter()
            result = await train.step(**next_batch())
            run.step_seconds += time.perf_counter() - t0
            if result.kind != "completed":
                raise RuntimeError(f"step {run.step + 1} {result.kind}: "
                                   f"{getattr(result, 'error', '')}")
            run.step += 1
            run.run_steps += 1
            run.last_loss = result.loss
            if losses is not None:
                losses.append(result.loss)
            pending.append(result.loss)
            if len(pending) >= max_pending or time.perf_counter() - t_post > stream_seconds:
                flush()
            if on_every is not None and due(run.step):
                flush()
                rate = (run.step - mark) / (time.perf_counter() - t_mark)
                await on_every(run.step, result.loss, rate)
                t_mark, mark = time.perf_counter(), run.step
    finally:
        flush()
    run.stopped = should_stop()
    run.wall_seconds = time.perf_counter() - t_run
    return run
