"""The public, async training and inference API: `compile`, `compile_forward`, and the handles.

    train = await tg.compile(model=MLP(), loss=loss_fn, inputs={"x": [256, 1], "y": [256, 1]},
                             optimizer=tg.optim.Adam(lr=5e-3))
    result = await train.step(x=x, y=y)          # Completed | Aborted | Failed, never raises

The handles hold what a compiled graph needs between calls (its executable, the params, the
optimizer's step counter and LR); every graph is made by :func:`tensorgrad.compiler.compile_graph`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from .compiler import Options, Request, compile_graph
from .errors import AbortError, ShapeError
from .gpu import GPUDevice, request_device
from .hostdata import to_bytes
from .init import random_seed
from .ir import Graph
from .module import Module
from .results import Aborted, Captures, Completed, Failed, Result
from .runtime import Executable, ParamStore
from .tensor import PRNG_SEED_INPUT
from .trace import normalize_inputs, resolve_shapes

DEFAULT_CHUNK_SIZE = 32
_default_device: GPUDevice | None = None


async def default_device() -> GPUDevice:
    """The process-wide default device (created on first use)."""
    global _default_device
    if _default_device is None:
        _default_device = await request_device()
    return _default_device


def _scalar(x: Any) -> float:
    if hasattr(x, "reshape"):
        return float(x.reshape(-1)[0])
    return float(x.tolist() if x.ndim == 0 else x[0])  # a memoryview (no numpy)


class _Runner:
    """Serialization, PRNG seeding and result mapping shared by training and forwards."""

    def __init__(self) -> None:
        self._generation = 0
        self._destroyed = False

    async def _guard(self, call: Callable[[], Any], generation: int) -> Result:
        """Run `call`; Aborted if the graph was replaced/destroyed since `generation` (the
        generation when step/run was called, not when the coroutine first ran)."""
        try:
            if self._destroyed or generation != self._generation:
                raise AbortError("destroyed or replaced")
            result = await call()
        except AbortError:
            return Aborted()
        except Exception as e:  # noqa: BLE001 - step/run report failures, never raise
            if generation != self._generation or self._destroyed:
                return Aborted()
            return Failed(e)
        if generation != self._generation or self._destroyed:
            return Aborted()
        return result


def _feed_bytes(exe: Executable, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Validate every feed against its input node; Python numbers are 0-d/[1] scalars."""
    inputs = exe.inputs
    out = {}
    for name, value in feeds.items():
        node = inputs.get(name)
        if node is None:
            out[name] = value  # reported by Executable.run with the list of inputs
            continue
        if isinstance(value, (int, float)):
            value = [value]
        out[name] = to_bytes(f"input '{name}'", value, node.shape, node.dtype)
    return out


def _check_user_inputs(where: str, given: Mapping[str, Any], declared: Mapping[str, Any]
                       ) -> None:
    missing = sorted(set(declared) - set(given))
    extra = sorted(set(given) - set(declared))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing} (declared as "
                         + ", ".join(f"{n}: {declared[n]!r}" for n in missing) + ")")
        if extra:
            parts.append(f"unexpected {extra}")
        raise ShapeError(where, f"inputs {', '.join(parts)}; declared inputs are "
                         f"{sorted(declared)}")


class Training(_Runner):
    """A compiled training step on a device. Create with :func:`compile`."""

    def __init__(self, device: GPUDevice, loss: Callable[..., Any], inputs: Mapping[str, Any],
                 chunk_size: int, fuse: bool = True):
        super().__init__()
        self.device = device
        self._loss_fn = loss
        self._input_decls = dict(inputs)
        self._chunk_size = chunk_size
        self._fuse = fuse
        self._children: list[Forward] = []
        self._exe: Executable | None = None
        self._store: ParamStore | None = None

    def _build(self, model: Module, optimizer: Any, seed: int | None) -> None:
        seed = random_seed() if seed is None else int(seed)
        c = compile_graph(Request("training", model, self._loss_fn, self._input_decls,
                                  optimizer=optimizer, seed=seed),
                          Options.for_device(self.device, fuse=self._fuse,
                                             chunk_size=self._chunk_size))
        assert c.optimizer is not None
        self._model, self._optimizer = model, optimizer
        self._opt, self._grads = c.optimizer, c.grads
        self._store, self._exe = c.store, c.executable
        self._lr = optimizer.lr
        self._t = 0
        self._prng_counter = 0
        self.seed = c.seed

    # -- properties ----------------------------------------------------------------------
    @property
    def param_names(self) -> list[str]:
        return self._store.names if self._store else []

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """{param name: shape}, in param order."""
        return {n: s.shape for n, s in self._store.specs.items()} if self._store else {}

    @property
    def param_count(self) -> int:
        """How many parameter values the model has (sum of the param sizes)."""
        return sum(s.size for s in self._store.specs.values()) if self._store else 0

    @property
    def kernel_count(self) -> int:
        return self._exe.kernel_count if self._exe else 0

    @property
    def output_shape(self) -> tuple[int, ...]:
        return ()

    @property
    def ir(self) -> Graph:
        return self._exe.graph if self._exe else Graph()

    @property
    def kernels(self) -> list[str]:
        return [k.wgsl for k in self._exe.kernels if k.threads > 0] if self._exe else []

    @property
    def peak_bytes(self) -> int:
        return self._exe.plan.peak_bytes if self._exe else 0

    @property
    def step_count(self) -> int:
        return self._t

    # -- steps ---------------------------------------------------------------------------
    def step(self, **inputs: Any) -> Coroutine[Any, Any, Result]:
        """One forward + backward + optimizer update (await it). Returns Completed(loss,
        captures), Aborted() or Failed(error); a NaN or Inf loss is Failed. A step called
        before replace_model/destroy returns Aborted even if it had not started yet."""
        return self._guard(lambda: self._step(inputs), self._generation)

    async def _step(self, inputs: Mapping[str, Any]) -> Result:
        exe = self._exe
        if exe is None:
            raise AbortError("no graph")
        _check_user_inputs("step", inputs, self._input_decls)
        feeds = dict(inputs)
        t = self._t + 1
        feeds.update(self._opt.host_scalars(self._lr, t))
        prng = PRNG_SEED_INPUT in exe.inputs
        if prng:
            feeds[PRNG_SEED_INPUT] = self._prng_counter + 1
        checked = _feed_bytes(exe, feeds)  # validated before the step counter moves
        self._t = t
        if prng:
            self._prng_counter += 1
        out, caps = await exe.run(checked)
        loss = _scalar(out)
        if not math.isfinite(loss):
            return Failed(FloatingPointError(f"loss is {loss} at step {t}: training diverged "
                                             "(lower the learning rate, clip gradients)"))
        return Completed(loss=loss, captures=Captures(caps))

    # -- params and state ----------------------------------------------------------------
    async def upload_params(self, params: Mapping[str, Any], partial: bool = False) -> None:
        """Write params {name: array}; every name unless `partial`. Validated before writing."""
        self._live_store().upload(params, partial)

    async def download_params(self) -> dict[str, Any]:
        """{name: array} of every param."""
        return await self._live_store().download()

    async def download_param_grads(self) -> dict[str, Any]:
        """{name: array}: the gradients computed by the last step (zeros before any)."""
        exe = self._live_exe()
        names = list(self._grads)
        values = await exe.read([self._grads[n] for n in names])
        return dict(zip(names, values))

    async def reset(self, params: bool = True, optimizer: bool = True) -> None:
        """Re-initialise params (same seed, same values as at compile) and/or optimizer
        state (zeros, step counter 0)."""
        if params:
            self._live_store().reset()
        if optimizer:
            await self.reset_optimizer_state()

    async def reset_optimizer_state(self) -> None:
        """Zero every optimizer state buffer and restart the step counter."""
        exe = self._live_exe()
        for node in exe.graph.states.values():
            init = float(node.attrs.get("init", 0.0))
            exe.write(node.id, to_bytes("state", [init] * node.size, node.shape, "f32"))
        self._t = 0

    async def set_lr(self, lr: Any) -> None:
        """Replace the learning rate or schedule; schedules start at the next step."""
        from .lr import rebase
        self._live_exe()
        self._lr = rebase(lr, self._t + 1)

    async def replace_model(self, model: Module, seed: int | None = None,
                            optimizer: Any = None) -> None:
        """Swap in a new model (fresh params, optimizer state and step counter). Calls in
        flight return Aborted; attached forwards retrace against the new model."""
        self._live_exe()
        self._generation += 1
        old_exe, old_store = self._exe, self._store
        for child in self._children:
            child._invalidate()
        self._build(model, optimizer if optimizer is not None else self._optimizer, seed)
        if old_exe is not None:
            old_exe.destroy()
        if old_store is not None:
            old_store.destroy()

    async def attach(self, forward: Callable[..., Any], inputs: Mapping[str, Any],
                     output: str = "f32", max_cached_shapes: int = 8) -> Forward:
        """A forward graph sharing this training's param buffers. One input dim may be None
        (resolved from the data, compiled per size on first use)."""
        self._live_exe()
        child = Forward(self.device, forward, inputs, output, max_cached_shapes,
                        self._chunk_size, owner=self, fuse=self._fuse)
        self._children.append(child)
        return child

    def destroy(self) -> None:
        """Free every GPU resource; pending and later calls return Aborted."""
        if self._destroyed:
            return
        self._destroyed = True
        self._generation += 1
        for child in self._children:
            child.destroy()
        if self._exe is not None:
            self._exe.destroy()
        if self._store is not None:
            self._store.destroy()
        self._exe = self._store = None

    def _live_exe(self) -> Executable:
        if self._destroyed or self._exe is None:
            raise RuntimeError("this training handle was destroyed")
        return self._exe

    def _live_store(self) -> ParamStore:
        self._live_exe()
        assert self._store is not None
        return self._store


class Forward(_Runner):
    """A compiled forward (inference) graph; one compiled executable per input shape."""

    def __init__(self, device: GPUDevice, forward: Callable[..., Any], inputs: Mapping[str, Any],
                 output: str, max_cached_shapes: int, chunk_size: int,
                 owner: Training | None = None, store: ParamStore | None = None,
                 model: Module | None = None, fuse: bool = True):
        super().__init__()
        if output not in ("f32", "i32"):
            raise ShapeError("forward", f"output must be 'f32' or 'i32', got {output!r}")
        self.device = device
        self._forward = forward
        self._input_decls = dict(inputs)
        self._output = output
        self._max_cached = max(1, int(max_cached_shapes))
        self._chunk_size = chunk_size
        self._fuse = fuse
        self._owner = owner
        self._own_store = store
        self._own_model = model
        self._cache: OrderedDict[str, tuple[Executable, Any]] = OrderedDict()
        self._prng_counter = 0

    @property
    def _store(self) -> ParamStore:
        store = self._owner._live_store() if self._owner else self._own_store
        if store is None:
            raise RuntimeError("this forward handle was destroyed")
        return store

    @property
    def _model(self) -> Module:
        return self._owner._model if self._owner else self._own_model  # type: ignore

    @property
    def param_names(self) -> list[str]:
        return self._store.names

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """{param name: shape}, in param order (the params this forward shares or owns)."""
        return {n: s.shape for n, s in self._store.specs.items()}

    @property
    def param_count(self) -> int:
        """How many parameter values the model has (sum of the param sizes)."""
        return sum(s.size for s in self._store.specs.values())

    def _invalidate(self) -> None:
        self._generation += 1
        for exe, _ in self._cache.values():
            exe.destroy()
        self._cache.clear()

    def graph_for(self, **inputs: Any) -> Executable:
        """The executable for these inputs' shapes (compiled on first use, LRU-cached)."""
        dtypes = {n: d.dtype for n, d in normalize_inputs(self._input_decls).items()}
        shapes = {n: (s, dtypes[n]) for n, s in resolve_shapes(self._input_decls, inputs).items()}
        key = "|".join(f"{n}:{'x'.join(map(str, s))}:{d}" for n, (s, d) in sorted(shapes.items()))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit[0]
        c = compile_graph(Request("forward", self._model, self._forward, shapes,
                                  output=self._output),
                          Options.for_device(self.device, fuse=self._fuse,
                                             chunk_size=self._chunk_size, store=self._store))
        exe = c.executable
        assert exe is not None
        self._cache[key] = (exe, shapes)
        while len(self._cache) > self._max_cached:
            _, (old, _) = self._cache.popitem(last=False)
            old.destroy()
        return exe

    def run(self, **inputs: Any) -> Coroutine[Any, Any, Result]:
        """Run the forward (await it): Completed(output, captures), Aborted() or
        Failed(error)."""
        return self._guard(lambda: self._run(inputs), self._generation)

    async def _run(self, inputs: Mapping[str, Any]) -> Result:
        _check_user_inputs("run", inputs, self._input_decls)
        exe = self.graph_for(**inputs)
        feeds = dict(inputs)
        if PRNG_SEED_INPUT in exe.inputs:
            self._prng_counter += 1
            feeds[PRNG_SEED_INPUT] = self._prng_counter
        out, caps = await exe.run(_feed_bytes(exe, feeds))
        return Completed(output=out, captures=Captures(caps))

    def output_shape(self, **inputs: Any) -> tuple[int, ...]:
        exe = self.graph_for(**inputs)
        return exe.graph[exe.output_id].shape

    async def upload_params(self, params: Mapping[str, Any], partial: bool = False) -> None:
        self._store.upload(params, partial)

    async def download_params(self) -> dict[str, Any]:
        return await self._store.download()

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._invalidate()
        self._destroyed = True
        if self._own_store is not None:
            self._own_store.destroy()
            self._own_store = None


async def compile(*, model: Module, loss: Callable[..., Any], inputs: Mapping[str, Any],
                  optimizer: Any, device: GPUDevice | None = None, seed: int | None = None,
                  chunk_size: int = DEFAULT_CHUNK_SIZE, fuse: bool = True) -> Training:
    """Trace `loss(model, **inputs)`, derive gradients, append `optimizer` and compile the
    whole training step for `device` (default: navigator.gpu in Pyodide, wgpu natively).

    `inputs`: {name: shape} (f32) or {name: (shape, "i32")}. `chunk_size`: most compute
    passes per GPU submission (0: one submission per step). `fuse`: inline chains of
    elementwise ops into single kernels (fewer dispatches, less memory traffic). Mistakes in the model raise
    here (ShapeError / TraceError); `step` itself never raises."""
    if not isinstance(chunk_size, int) or chunk_size < 0:
        raise ValueError(f"chunk_size must be an int >= 0, got {chunk_size!r}")
    device = device or await default_device()
    train = Training(device, loss, inputs, chunk_size, fuse)
    train._build(model, optimizer, seed)
    return train


async def compile_forward(*, model: Module, forward: Callable[..., Any],
                          inputs: Mapping[str, Any], output: str = "f32",
                          device: GPUDevice | None = None, seed: int | None = None,
                          max_cached_shapes: int = 8,
                          chunk_size: int = DEFAULT_CHUNK_SIZE, fuse: bool = True) -> Forward:
    """A standalone forward executor with its own params (initialised from `seed`)."""
    device = device or await default_device()
    seed = random_seed() if seed is None else int(seed)
    store = ParamStore(device, model.named_params(), seed)
    return Forward(device, forward, inputs, output, max_cached_shapes, chunk_size,
                   store=store, model=model, fuse=fuse)
