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

from . import describe
from .compiler import Options, Request, compile_graph
from .errors import AbortError, ShapeError
from .flight import CallQueue
from .gpu import GPUDevice, request_device
from .hostdata import to_bytes
from .ir import Graph
from .lr import rebase
from .module import Module
from .results import Aborted, Captures, Completed, Failed, Result
from .runtime import Executable, ParamStore
from .skipped import non_finite_grad, non_finite_param, non_finite_update
from .tensor import PRNG_SEED_INPUT
from .trace import check_seed, normalize_inputs, resolve_shapes

DEFAULT_CHUNK_SIZE = 32
_default_device: GPUDevice | None = None


async def default_device() -> GPUDevice:
    """The process-wide default device (created on first use, and again after a loss)."""
    global _default_device
    if _default_device is None or _default_device.lost:
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


def _snapshot(where: str, given: Mapping[str, Any], shapes: Mapping[str, tuple[Any, ...]],
              dtypes: Mapping[str, str]) -> dict[str, bytes]:
    """The user's inputs validated against their shapes and copied, at call time: a step or
    run queued behind others uses the data as it was when it was called."""
    out = {}
    for name, value in given.items():
        if isinstance(value, (int, float)):
            value = [value]
        out[name] = bytes(to_bytes(f"input '{name}'", value, shapes[name], dtypes[name]))
    return out


def _non_finite_input(data: Mapping[str, bytes], dtypes: Mapping[str, str]) -> str:
    """Which f32 input holds a NaN or Inf, if any ("" when none): looked up only after a
    failed step, so a normal step pays nothing."""
    for name, raw in data.items():
        if dtypes.get(name) != "f32":
            continue
        for k, v in enumerate(memoryview(raw).cast("f")):
            if not math.isfinite(v):
                return f"input '{name}' holds {v} at flat index {k}"
    return ""


async def _value(result: Result) -> Result:
    return result


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
    """A compiled training step on a device. Create with :func:`compile`.

    Threads: a handle may be used from any thread and any event loop (each thread with its
    own ``asyncio.run``, or successive ``asyncio.run`` calls in one thread). Its calls, and
    those of its attached forwards, run one at a time in call order whichever thread made
    them; each runs in the event loop of the thread that made it."""

    def __init__(self, device: GPUDevice, loss: Callable[..., Any], inputs: Mapping[str, Any],
                 chunk_size: int, fuse: bool = True, tiered: bool | None = None):
        super().__init__()
        self.device = device
        self._tiered = tiered
        self._loss_fn = loss
        self._decls = normalize_inputs(inputs, wildcards=False, op="compile")
        self._input_decls = dict(inputs)
        self._chunk_size = chunk_size
        self._fuse = fuse
        self._children: list[Forward] = []
        self._exe: Executable | None = None
        self._store: ParamStore | None = None
        # Everything that touches this training's GPU state runs in call order, one at a
        # time (attached forwards too): an upload never lands inside a step.
        self._queue = CallQueue()

    def _build(self, model: Module, optimizer: Any, seed: int | None) -> None:
        seed = check_seed(seed)
        c = compile_graph(Request("training", model, self._loss_fn, self._input_decls,
                                  optimizer=optimizer, seed=seed),
                          Options.for_device(self.device, fuse=self._fuse,
                                             chunk_size=self._chunk_size,
                                             tiered=self._tiered))
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
        """The model's dotted param names, in param order."""
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
        """How many GPU kernels (compute dispatches) one step runs."""
        return self._exe.kernel_count if self._exe else 0

    @property
    def output_shape(self) -> tuple[int, ...]:
        """The loss's shape: () (a training step's output is its 0-d loss)."""
        return ()

    @property
    def ir(self) -> Graph:
        """The compiled step's final IR graph (``print(train.ir)`` shows it)."""
        return self._exe.graph if self._exe else Graph()

    @property
    def kernels(self) -> list[str]:
        """The WGSL source of each kernel the step dispatches."""
        return [k.wgsl for k in self._exe.kernels if k.threads > 0] if self._exe else []

    @property
    def peak_bytes(self) -> int:
        """The GPU memory the step's buffer plan needs at its peak, in bytes."""
        return self._exe.plan.peak_bytes if self._exe else 0

    @property
    def step_count(self) -> int:
        """Completed steps since compile (or the last reset of the optimizer state)."""
        return self._t

    def __repr__(self) -> str:
        """One line: the model, params, inputs, optimizer, kernels, step count, device, state
        (never a buffer's contents)."""
        inputs = describe.mapping({n: describe.shape(d.shape, d.dtype)
                                   for n, d in self._decls.items()})
        model = type(getattr(self, "_model", None)).__name__
        if self._destroyed or self._store is None:
            return (f"<tg.Training of {model}: destroyed after {describe.count(self._t, 'step')}"
                    f", inputs {inputs}>")
        optimizer = f"{type(self._optimizer).__name__}(lr={self._lr!r})"
        return (f"<tg.Training of {model}: {describe.count(self.param_count, 'param')} in "
                f"{describe.count(len(self.param_names), 'tensor')}, inputs {inputs}, "
                f"{optimizer}, {describe.count(self.kernel_count, 'kernel')}, peak "
                f"{describe.byte_size(self.peak_bytes)}, {describe.count(self._t, 'step')} "
                f"done, on {describe.device(self.device)}, "
                f"{describe.count(len(self._children), 'attached forward')}>")

    # -- steps ---------------------------------------------------------------------------
    def step(self, **inputs: Any) -> Coroutine[Any, Any, Result]:
        """One forward + backward + optimizer update (await it). Returns Completed(loss,
        captures), Aborted() or Failed(error); a NaN or Inf loss is Failed.

        Each input is a numpy array, a buffer (array.array, memoryview, bytes) or a (nested)
        list of its declared dtype and size. Data that carries a shape of 2 or more dims must
        have the declared shape exactly (a transposed ``x.T`` of the right size is a
        ShapeError, never silently misread); flat data (1-D arrays and buffers, flat lists) of
        the right size is read in row-major order; a single value fits a one-element shape.

        The inputs are checked and copied when step is called, and calls on this training
        (steps, uploads, resets, forward runs) run one at a time in call order. A step called
        before replace_model/destroy returns Aborted if it had not finished.

        Cancellation (``task.cancel()``, ``asyncio.wait_for`` timing out, ``asyncio.run``
        ending): a call cancelled while it still waits for its turn behind other calls never
        runs. A call that has started runs to its end whether or not anything still awaits
        it: a step that reached the GPU is applied whole and counted (step counter, PRNG
        counter, LR schedule position), as are uploads and resets; the cancelled awaiter
        gets ``CancelledError`` at once, and the calls made after it run after it."""
        generation = self._generation
        try:
            _check_user_inputs("step", inputs, self._input_decls)
            data = _snapshot("step", inputs, {n: d.shape for n, d in self._decls.items()},
                             {n: d.dtype for n, d in self._decls.items()})
        except Exception as e:  # noqa: BLE001 - step reports failures, never raises
            failure = Failed(e)
            return self._queue.submit(lambda: _value(failure))
        return self._queue.submit(lambda: self._guard(lambda: self._step(data), generation))

    async def _step(self, data: Mapping[str, bytes]) -> Result:
        exe = self._exe
        if exe is None:
            raise AbortError("no graph")
        feeds: dict[str, Any] = dict(data)
        t = self._t + 1
        feeds.update(self._opt.host_scalars(self._lr, t))
        prng = PRNG_SEED_INPUT in exe.inputs
        if prng:
            feeds[PRNG_SEED_INPUT] = self._prng_counter + 1
        checked = _feed_bytes(exe, feeds)
        if prng:
            self._prng_counter += 1
        out, caps, applied = await exe.run(checked)
        loss = _scalar(out)
        if not math.isfinite(loss) or not applied:
            return Failed(FloatingPointError(await self._skipped(exe, data, loss, t)))
        self._t = t
        return Completed(loss=loss, captures=Captures(caps))

    async def _skipped(self, exe: Executable, data: Mapping[str, bytes], loss: float, t: int
                       ) -> str:
        """Why step `t` was skipped (looked up after the fact: a good step pays nothing)."""
        skipped = "the update was skipped, params and optimizer state are unchanged"
        culprit = (_non_finite_input(data, {n: d.dtype for n, d in self._decls.items()})
                   or exe.sentinel_only_input(data))
        if culprit:
            what = f"loss is {loss}" if not math.isfinite(loss) else \
                f"the loss is finite ({loss:.6g}) but a gradient is not"
            return f"{what} at step {t}: {skipped}; {culprit}"
        if not math.isfinite(loss):
            param = await non_finite_param(self._live_store())
            return f"loss is {loss} at step {t}: {skipped}" + (
                f"; {param} (params must be finite: check what was uploaded)" if param else
                " (training diverged: lower the learning rate, clip gradients)")
        grad = await non_finite_grad(exe, self._grads)
        if grad:
            return (f"the loss is finite ({loss:.6g}) but a gradient is not at step {t}: "
                    f"{skipped}; {grad} (training diverged: lower the learning rate, clip "
                    "gradients)")
        what, where = await non_finite_update(exe, self._grads)
        return (f"the update would make {what} non-finite at step {t}"
                + (f" ({where})" if where else "") + f": {skipped}; lower the learning rate "
                "(or clip gradients with clip_grad_norm)")

    # -- params and state ----------------------------------------------------------------
    def upload_params(self, params: Mapping[str, Any], partial: bool = False
                      ) -> Coroutine[Any, Any, None]:
        """Write params {name: array}; every name unless `partial`. Checked and copied when
        called (a bad name, size or shape raises then); written in call order with the steps.

        The shape rule of :meth:`step` applies: an array of 2 or more dims must have the
        param's shape (``param_shapes``) exactly, flat data of the right size is row-major. A
        PyTorch ``nn.Linear.weight`` is ``[out, in]``, tensorgrad's ``Linear.W`` ``[in, out]``:
        pass its transpose."""
        store = self._live_store()
        data = store.check(params, partial)
        return self._queue.submit(lambda: self._write_params(store, data))

    async def _write_params(self, store: ParamStore, data: Mapping[str, bytes]) -> None:
        if store is not self._store:
            raise AbortError("upload_params: the model was replaced or destroyed before the "
                             "upload ran")
        store.write(data)

    def download_params(self) -> Coroutine[Any, Any, dict[str, Any]]:
        """{name: array} of every param (after the calls made before this one)."""
        return self._queue.submit(lambda: self._live_store().download())

    def download_param_grads(self) -> Coroutine[Any, Any, dict[str, Any]]:
        """{name: array}: the gradients computed by the last step (zeros before any)."""
        async def read() -> dict[str, Any]:
            names = list(self._grads)
            values = await self._live_exe().read([self._grads[n] for n in names])
            return dict(zip(names, values))
        return self._queue.submit(read)

    def reset(self, params: bool = True, optimizer: bool = True) -> Coroutine[Any, Any, None]:
        """Re-initialise params (same seed, same values as at compile) and/or optimizer
        state (zeros, step counter 0), in call order with the steps."""
        async def reset() -> None:
            if params:
                self._live_store().reset()
            if optimizer:
                self._zero_optimizer_state()
        return self._queue.submit(reset)

    def reset_optimizer_state(self) -> Coroutine[Any, Any, None]:
        """Zero every optimizer state buffer and restart the step counter."""
        async def reset() -> None:
            self._zero_optimizer_state()
        return self._queue.submit(reset)

    def _zero_optimizer_state(self) -> None:
        exe = self._live_exe()
        for node in exe.graph.states.values():
            init = float(node.attrs.get("init", 0.0))
            exe.write(node.id, to_bytes("state", [init] * node.size, node.shape, "f32"))
        self._t = 0

    def set_lr(self, lr: Any) -> Coroutine[Any, Any, None]:
        """Replace the learning rate or schedule (checked when called); it applies from the
        next step after the calls made before this one, a schedule starting there."""
        self._live_exe()
        rebase(lr, 1)  # checks it now

        async def apply() -> None:
            self._live_exe()
            self._lr = rebase(lr, self._t + 1)
        return self._queue.submit(apply)

    def replace_model(self, model: Module, seed: int | None = None,
                      optimizer: Any = None) -> Coroutine[Any, Any, None]:
        """Swap in a new model (fresh params, optimizer state and step counter). Calls made
        before it return Aborted if they had not finished; attached forwards retrace against
        the new model. The rebuild runs once the calls before it are done."""
        self._live_exe()
        if seed is not None:
            check_seed(seed)  # a bad seed raises now, not inside the queue
        self._generation += 1
        for child in self._children:
            child._invalidate()

        async def rebuild() -> None:
            old_exe, old_store = self._exe, self._store
            self._build(model, optimizer if optimizer is not None else self._optimizer, seed)
            if old_exe is not None:
                old_exe.destroy()
            if old_store is not None:
                old_store.destroy()
        return self._queue.submit(rebuild)

    async def attach(self, forward: Callable[..., Any], inputs: Mapping[str, Any],
                     output: str = "f32", max_cached_shapes: int = 8) -> Forward:
        """A forward graph sharing this training's param buffers; its runs take their turn
        with the steps. `inputs` may leave one dim per input as None, the same size for all
        (``{"x": (None, 1)}``): each run resolves it from the data (length / the other dims)
        and a new size is compiled on first use, the last `max_cached_shapes` kept."""
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
    """A compiled forward (inference) graph; one compiled executable per input shape.

    Like :class:`Training`, usable from any thread and event loop: its runs (an attached
    forward's with its training's calls) run one at a time in call order."""

    def __init__(self, device: GPUDevice, forward: Callable[..., Any], inputs: Mapping[str, Any],
                 output: str, max_cached_shapes: int, chunk_size: int,
                 owner: Training | None = None, store: ParamStore | None = None,
                 model: Module | None = None, fuse: bool = True):
        super().__init__()
        if output not in ("f32", "i32"):
            raise ShapeError("forward", f"output must be 'f32' or 'i32', got {output!r}")
        dtypes = {n: d.dtype for n, d in normalize_inputs(inputs).items()}  # a clear error first
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
        self._dtypes = dtypes
        self._own_queue = CallQueue()

    @property
    def _queue(self) -> CallQueue:
        """The owner's queue for an attached forward (its runs order with the steps)."""
        return self._owner._queue if self._owner else self._own_queue

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
        """The dotted param names, in param order (the params this forward shares or owns)."""
        return self._store.names

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """{param name: shape}, in param order (the params this forward shares or owns)."""
        return {n: s.shape for n, s in self._store.specs.items()}

    @property
    def param_count(self) -> int:
        """How many parameter values the model has (sum of the param sizes)."""
        return sum(s.size for s in self._store.specs.values())

    def __repr__(self) -> str:
        """One line: the model, params, inputs (None dims as None), output dtype, the shapes
        compiled so far and their kernels, the device, attached or standalone, state."""
        decls = normalize_inputs(self._input_decls)
        inputs = describe.mapping({n: describe.shape(d.shape, d.dtype) for n, d in decls.items()})
        model = type(self._model).__name__ if self._model is not None else "?"
        owner = "attached to a tg.Training" if self._owner else "standalone"
        if self._destroyed:
            return f"<tg.Forward of {model}: destroyed, inputs {inputs}, {owner}>"
        compiled = [", ".join(f"{n}: {list(s)}" for n, (s, _) in typed.items()) + "; "
                    + describe.count(exe.kernel_count, "kernel")
                    for exe, typed in self._cache.values()]
        shapes = (describe.count(len(compiled), "shape") + " compiled (" +
                  " | ".join(compiled) + ")" if compiled else "no shape compiled yet")
        try:
            params = describe.count(self.param_count, "param")
        except RuntimeError:  # an attached forward whose training was destroyed
            params = "params gone (its training was destroyed)"
        return (f"<tg.Forward of {model}: {params}, inputs {inputs} -> {self._output}, "
                f"{shapes}, on {describe.device(self.device)}, {owner}>")

    def _invalidate(self) -> None:
        self._generation += 1
        for exe, _ in self._cache.values():
            exe.destroy()
        self._cache.clear()

    def graph_for(self, **inputs: Any) -> Executable:
        """The executable for these inputs' shapes (compiled on first use, LRU-cached)."""
        return self._executable(resolve_shapes(self._input_decls, inputs))

    def _executable(self, shapes: Mapping[str, tuple[int, ...]]) -> Executable:
        typed = {n: (s, self._dtypes[n]) for n, s in shapes.items()}
        key = "|".join(f"{n}:{'x'.join(map(str, s))}:{d}" for n, (s, d) in sorted(typed.items()))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit[0]
        c = compile_graph(Request("forward", self._model, self._forward, typed,
                                  output=self._output),
                          Options.for_device(self.device, fuse=self._fuse,
                                             chunk_size=self._chunk_size, store=self._store,
                                             tiered=self._owner._tiered if self._owner
                                             else None))
        exe = c.executable
        assert exe is not None
        self._cache[key] = (exe, typed)
        while len(self._cache) > self._max_cached:
            _, (old, _) = self._cache.popitem(last=False)
            old.destroy()
        return exe

    def run(self, **inputs: Any) -> Coroutine[Any, Any, Result]:
        """Run the forward (await it): Completed(output, captures), Aborted() or
        Failed(error). The inputs are checked and copied when run is called (the shape rule of
        :meth:`Training.step`; a None dim is resolved from the data's size); runs of an
        attached forward take their turn with the training's steps, in call order.

        Cancelled while it waits for its turn, a run never runs; once started it runs to its
        end (its PRNG draw counted) and the cancelled awaiter gets ``CancelledError`` at once,
        as :meth:`Training.step` says."""
        generation = self._generation
        try:
            _check_user_inputs("run", inputs, self._input_decls)
            shapes = resolve_shapes(self._input_decls, inputs)
            data = _snapshot("run", inputs, shapes, self._dtypes)
        except Exception as e:  # noqa: BLE001 - run reports failures, never raises
            failure = Failed(e)
            return self._queue.submit(lambda: _value(failure))
        return self._queue.submit(lambda: self._guard(lambda: self._run(shapes, data),
                                                      generation))

    async def _run(self, shapes: Mapping[str, tuple[int, ...]], data: Mapping[str, bytes]
                   ) -> Result:
        exe = self._executable(shapes)
        feeds: dict[str, Any] = dict(data)
        if PRNG_SEED_INPUT in exe.inputs:
            self._prng_counter += 1
            feeds[PRNG_SEED_INPUT] = self._prng_counter
        out, caps, _ = await exe.run(_feed_bytes(exe, feeds))
        return Completed(output=out, captures=Captures(caps))

    def output_shape(self, **inputs: Any) -> tuple[int, ...]:
        """The output's shape for these inputs (compiling for their shapes if needed)."""
        exe = self.graph_for(**inputs)
        return exe.graph[exe.output_id].shape

    def upload_params(self, params: Mapping[str, Any], partial: bool = False
                      ) -> Coroutine[Any, Any, None]:
        """Write params {name: array} (the owner's, for an attached forward); checked and
        copied when called (the shape rule of :meth:`Training.upload_params`), written in
        call order."""
        store = self._store
        data = store.check(params, partial)

        async def write() -> None:
            if store is not self._store:
                raise AbortError("upload_params: the model was replaced or destroyed before "
                                 "the upload ran")
            store.write(data)
        return self._queue.submit(write)

    def download_params(self) -> Coroutine[Any, Any, dict[str, Any]]:
        """{name: array} of every param (after the calls made before this one)."""
        return self._queue.submit(lambda: self._store.download())

    def destroy(self) -> None:
        """Free the forward's GPU resources (and its params, when it owns them); pending and
        later runs return Aborted."""
        if self._destroyed:
            return
        self._invalidate()
        self._destroyed = True
        if self._own_store is not None:
            self._own_store.destroy()
            self._own_store = None


async def compile(*, model: Module, loss: Callable[..., Any], inputs: Mapping[str, Any],
                  optimizer: Any, device: GPUDevice | None = None, seed: int | None = None,
                  chunk_size: int = DEFAULT_CHUNK_SIZE, fuse: bool = True,
                  tiered: bool | None = None) -> Training:
    """Trace `loss(model, **inputs)`, derive gradients, append `optimizer` and compile the
    whole training step for `device` (default: navigator.gpu in Pyodide, wgpu natively).

    `inputs`: {name: shape} (f32) or {name: (shape, "i32")}, every dim given: the step is
    compiled for those shapes (a None dim raises, naming the forward calls that take one:
    ``train.attach(forward=..., inputs={"x": (None, 1)})``). Host data given to `step` must
    fit it: data carrying 2 or more dims (numpy arrays, nested lists, memoryviews) must have
    the declared shape exactly, flat data of the right size is read row-major. `seed`: an int
    (None: random). `chunk_size`: most compute
    passes per GPU submission (0: one submission per step). `fuse`: inline chains of
    elementwise ops into single kernels (fewer dispatches, less memory traffic). `tiered`:
    start on kernels that compile quickest (naive matmuls) and swap in the optimized ones
    once their pipelines, compiled in the background after the first step, are ready (same
    results, the same buffers); None (the default) tiers where shader compiles are dear
    (SwiftShader), False never, True always. Mistakes in the model raise
    here (ShapeError / TraceError); `step` itself never raises."""
    if not isinstance(chunk_size, int) or chunk_size < 0:
        raise ValueError(f"chunk_size must be an int >= 0, got {chunk_size!r}")
    normalize_inputs(inputs, wildcards=False, op="compile")  # clear errors before the device
    check_seed(seed)
    device = device or await default_device()
    train = Training(device, loss, inputs, chunk_size, fuse, tiered)
    train._build(model, optimizer, seed)
    return train


async def compile_forward(*, model: Module, forward: Callable[..., Any],
                          inputs: Mapping[str, Any], output: str = "f32",
                          device: GPUDevice | None = None, seed: int | None = None,
                          max_cached_shapes: int = 8,
                          chunk_size: int = DEFAULT_CHUNK_SIZE, fuse: bool = True) -> Forward:
    """A standalone forward executor with its own params (initialised from `seed`; load
    trained ones with `upload_params`). `inputs` may leave one dim per input as None
    (``{"x": (None, 1)}``): resolved from each run's data, each size compiled on first use
    and the last `max_cached_shapes` kept, as for :meth:`Training.attach`."""
    seed = check_seed(seed)
    normalize_inputs(inputs, op="compile_forward")  # a clear error before any allocation
    device = device or await default_device()
    store = ParamStore(device, model.named_params(), seed)
    return Forward(device, forward, inputs, output, max_cached_shapes, chunk_size,
                   store=store, model=model, fuse=fuse)
