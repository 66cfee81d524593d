"""The training handle: :class:`Training`, a compiled training step and its state between
steps (the params, the optimizer's step counter and LR). Create one with :func:`tensorgrad.compile`.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from . import describe
from .compiler import Request, compile_graph
from .errors import AbortError
from .flight import CallQueue
from .forward import Forward
from .gpu import GPUDevice
from .handle import Handle, Shapes, non_finite_input, raising, scalar
from .hostdata import scalar_bytes, to_bytes
from .inflight import Flight, InFlight, NextStep
from .ir import Graph
from .lr import LR, rebase
from .module import Module
from .optim import OptimizerConfig, OptimizerPlan
from .precision import LossScale, LossScaler, check_precision
from .results import Aborted, Captures, Completed, Failed, Result
from .runtime import Executable, ParamStore, Ran
from .skipped import non_finite_grad, skip_reason
from .tensor import Tensor
from .trace import InputDecl, check_seed, normalize_inputs
from .update import STEP_CHAIN

if TYPE_CHECKING:
    from .hostdata import HostArray, InputData
    from .ir import DType
    from .trace import InputSpec

# The chain flag's writes before a step: none, 1 (a fresh step), 0 (a forced skip).
_NO_STATES: Mapping[str, bytes] = {}
_CHAIN_WRITE = {STEP_CHAIN: scalar_bytes(1.0, "f32")}
_CHAIN_FORCE_SKIP = {STEP_CHAIN: scalar_bytes(0.0, "f32")}


class Training(Handle):
    """A compiled training step on a device. Create with :func:`compile`.

    Threads: a handle may be used from any thread and any event loop (each thread with its
    own ``asyncio.run``, or successive ``asyncio.run`` calls in one thread). Its calls, and
    those of its attached forwards, run one at a time in call order whichever thread made
    them; each runs in the event loop of the thread that made it."""

    def __init__(self, device: GPUDevice, loss: Callable[..., Tensor],
                 inputs: Mapping[str, InputSpec], chunk_size: int, fuse: bool = True,
                 tiered: bool | None = None, precision: str = "f32",
                 loss_scale: LossScale | None = None):
        decls = normalize_inputs(inputs, wildcards=False, op="compile")
        # Everything that touches this training's GPU state runs in call order, one at a
        # time (attached forwards too): an upload never lands inside a step.
        super().__init__(device, inputs, {n: d.dtype for n, d in decls.items()}, chunk_size,
                         fuse, tiered, CallQueue())
        self._loss_fn = loss
        self._decls = decls
        self._fixed = {n: _fixed_shape(d) for n, d in decls.items()}
        self._children: list[Forward] = []
        self._exe: Executable | None = None
        self._store: ParamStore | None = None
        self._precision = check_precision(precision)
        if loss_scale is not None and not isinstance(loss_scale, LossScale):
            raise TypeError(f"compile: loss_scale must be a tg.LossScale, got {loss_scale!r}")
        if loss_scale is not None and precision != "mixed":
            raise ValueError(f"compile: loss_scale={loss_scale!r} needs precision='mixed' "
                             f"(precision is {precision!r}: an f32 step is not scaled)")
        self._scaler = LossScaler(loss_scale or LossScale()) if precision == "mixed" else None
        # Steps in flight (submitted, results not in yet), oldest first, and what the next
        # one assumes: every step before it applied (see _step).
        self._flight = Flight()
        self._submitting = CallQueue()  # one submission at a time (steps, resubmissions)
        self._next_t = 0
        self._next_scaler: LossScaler | None = None
        # The executable whose chain flag is known to be 1 before the next fresh step (the
        # last step of it ran and was applied, or the flag was written): None when unsure.
        self._chain_set: Executable | None = None
        self._queue.settle = self._flight.settle

    def _build(self, model: Module, optimizer: OptimizerConfig, seed: int | None) -> None:
        seed = check_seed(seed)
        c = compile_graph(Request("training", model, self._loss_fn, self._input_decls,
                                  optimizer=optimizer, seed=seed), self._options())
        assert c.optimizer is not None
        self._model: Module = model
        self._optimizer: OptimizerConfig = optimizer
        self._opt: OptimizerPlan = c.optimizer
        self._grads = c.grads
        self._store, self._exe = c.store, c.executable
        self._lr: LR = optimizer.lr
        self._lr_given: LR = optimizer.lr  # as given: a reset of the step counter restarts it
        self._t = 0
        self._prng_counter = 0
        self.seed = c.seed
        if self._scaler is not None:
            self._scaler.reset()

    # -- what the handle base asks -------------------------------------------------------
    def _live_store(self) -> ParamStore:
        self._live_exe()
        assert self._store is not None
        return self._store

    def _shown_store(self) -> ParamStore | None:
        return self._store

    def _current_store(self) -> ParamStore | None:
        return self._store

    def _shapes(self, inputs: Mapping[str, InputData]) -> dict[str, tuple[int, ...]]:
        return self._fixed

    def _live_exe(self) -> Executable:
        if self._destroyed or self._exe is None:
            raise RuntimeError("this training handle was destroyed")
        return self._exe

    # -- properties ----------------------------------------------------------------------
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
        """Steps applied since compile (or the last reset of the optimizer state); a step
        skipped for a mixed-precision overflow is not counted."""
        return self._t

    @property
    def precision(self) -> str:
        """``"f32"`` or ``"mixed"`` (f16 activations, loss scaling), as compiled."""
        return self._precision

    @property
    def loss_scale(self) -> float | None:
        """The loss scale of the next step under ``precision="mixed"`` (None in f32)."""
        return self._scaler.scale if self._scaler else None

    @property
    def skipped_steps(self) -> int:
        """Steps skipped because their scaled gradients overflowed (mixed precision; each
        completed with ``skipped=True``); 0 in f32."""
        return self._scaler.skipped if self._scaler else 0

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
    def step(self, **inputs: InputData) -> Coroutine[Any, Any, Result]:
        """One forward + backward + optimizer update (await it). Returns Completed(loss,
        captures), Aborted() or Failed(error); a NaN or Inf loss is Failed.

        Each input is a numpy array, a buffer (array.array, memoryview, bytes) or a (nested)
        list of its declared dtype and size. Data that carries a shape of 2 or more dims must
        have the declared shape exactly (a transposed ``x.T`` of the right size is a
        ShapeError, never silently misread); flat data (1-D arrays and buffers, flat lists) of
        the right size is read in row-major order; a single value fits a one-element shape.

        The inputs are checked and copied when step is called, and calls on this training
        (steps, uploads, resets, forward runs) run one at a time in call order. A step gives
        its turn up once its GPU work is submitted, so a step called before the last one's
        loss is back is written and queued on the GPU meanwhile (up to MAX_IN_FLIGHT); the
        results are those of steps awaited one by one, bit for bit, and other calls wait for
        the steps before them. A step called before replace_model/destroy returns Aborted if
        it had not finished.

        Cancellation (``task.cancel()``, ``asyncio.wait_for`` timing out, ``asyncio.run``
        ending): a call cancelled while it still waits for its turn behind other calls never
        runs, nor does one whose task is cancelled before it first ran (``create_task`` then
        ``cancel()``, a ``TaskGroup`` failing at once). A call that has started runs to its
        end whether or not anything still awaits it: a step that reached the GPU is applied
        whole and counted (step counter, PRNG counter, LR schedule position), as are uploads
        and resets; the cancelled awaiter gets ``CancelledError`` at once, and the calls
        made after it run after it."""
        return self._call_staged("step", inputs, self._step)

    # A step gives its turn up once submitted (the queue's staged call): the next step's
    # writes and dispatches queue behind it on the GPU while its readback is on its way;
    # then, once the step before it is finished, it finishes (steps finish in call order).
    # A step submitted while others are in flight is speculative: its host scalars (the
    # step counter t, the loss scale) assume they were all applied, and the step guard skips
    # it on the GPU when the step before it was skipped (the chain flag, update.STEP_CHAIN).
    # A step that learns it was skipped explains itself (after running again, forced to
    # skip, when later steps overwrote its gradients) and submits the steps after it again
    # with the right scalars, the same data and PRNG seed: the results are those of steps
    # awaited one by one, bit for bit. Other calls settle the flight first.
    # A step submitted with none in flight (each step awaited before the next call, the
    # common case) is fresh: it needs no room, no submission turn (no resubmission can run:
    # that is a step in flight finishing), and it writes the chain flag only when the host
    # does not know it is 1 (after a skipped step, a failure, on a new executable).
    async def _step(self, shapes: Shapes, data: dict[str, bytes]) -> Awaitable[Result]:
        exe = self._exe
        if exe is None:
            raise AbortError("no graph")
        loop = asyncio.get_running_loop()
        if self._flight:
            await self._flight.make_room(loop)
        step = self._new_step(exe, data, loop)
        if self._flight:
            async with self._submitting:
                await self._submit(step, fresh=not self._flight)
                before = self._flight.enter(step)
        else:
            await self._submit(step, fresh=True)
            before = self._flight.enter(step)
        return self._finished(step, before)

    # The worker's express steps (tensorgrad.web.worker.express): a step message that finds
    # nothing to wait for (no call of this training queued or running, room in the flight,
    # a device that submits at once) is submitted outside the event loop, and its readback
    # finishes it from the JS event loop when it is the oldest in flight and was applied:
    # the same submission and bookkeeping as _step and _finished, without a call's tasks
    # and futures. Any other step finishes as _finished does, in a task.
    def _step_now(self, inputs: Mapping[str, InputData], reply: Callable[[Result], None],
                  loop: asyncio.AbstractEventLoop, quiet: Callable[[], bool]) -> bool:
        """Submit a step now, without the event loop, if nothing is to be waited for:
        True, and `reply(result)` is called with what :meth:`step` would return once the
        result is in (from the JS event loop or a task of `loop`). False: nothing was done
        (call :meth:`step`). The caller makes sure no call made before it is still to come
        (the worker: every message before it has started its handler); `quiet()` says
        whether that still holds when the readback is in (else the step finishes in a task
        of `loop`, after what started meanwhile: a destroy that came in aborts it, as it
        would a step through the loop)."""
        exe = self._exe
        if (exe is None or self._destroyed or not exe.device.submits_now
                or not self._queue.idle or not self._submitting.idle
                or not self._flight.room_in(loop)):
            return False
        checked = self._checked("step", inputs)
        if isinstance(checked, Failed):
            return False  # (step() tells)
        generation, prng = self._generation, self._prng_counter

        def arrived(ran: Ran | BaseException) -> None:
            if isinstance(ran, BaseException):
                readback.set_exception(ran)
            else:
                readback.set_result(ran)
            result = self._finish_now(step, readback, generation) if quiet() else None
            if result is not None:
                reply(result)
                return
            rest = loop.create_task(self._guard(lambda: self._finished(step, before),
                                                generation, started=True))
            rest.add_done_callback(lambda task: reply(task.result()))

        try:
            step = self._new_step(exe, checked[1], loop)
            next_step = self._next_feeds(step, fresh=not self._flight)
            readback: asyncio.Future[Ran] = loop.create_future()
            before = self._flight.newest
            taken = exe.submit_now(next_step.feeds, next_step.states, arrived)
        except Exception:  # noqa: BLE001 - step() does it again, or fails it
            taken = False
            self._chain_set = None  # (unsure)
        if not taken:
            self._prng_counter = prng
            return False
        self._submitted(step, next_step)
        step.readback = readback
        self._flight.enter(step)
        return True

    def _new_step(self, exe: Executable, data: dict[str, bytes],
                  loop: asyncio.AbstractEventLoop) -> InFlight:
        """A step of `data` called in `loop`, with the next PRNG seed (if `exe` draws)."""
        feeds = dict(data)
        self._feed_seed(exe, feeds)
        return InFlight(exe, data, feeds, loop)

    def _finish_now(self, step: InFlight, readback: asyncio.Future[Ran], generation: int
                    ) -> Result | None:
        """An express step's result if it needs no wait: its readback is in (the one it was
        submitted with) and applied, and it is the oldest in flight; else None."""
        if (step.readback is not readback or self._flight.oldest is not step
                or readback.exception() is not None):
            return None
        out, caps, applied = readback.result()
        try:
            loss = scalar(out)
        except Exception:  # noqa: BLE001 - _finished tells
            return None
        result = self._applied(step, loss, caps, applied)
        if result is None:
            return None
        self._flight.end(step)
        if generation != self._generation or self._destroyed:
            return Aborted()
        return result

    async def _submit(self, step: InFlight, fresh: bool) -> None:
        """Submit `step` as the next after those in flight (`fresh`: none is, the host's
        counts are exact and the chain flag is 1, written first unless known to be)."""
        next_step = self._next_feeds(step, fresh)
        try:
            step.readback = await step.exe.submit(next_step.feeds, states=next_step.states)
        except BaseException:
            self._chain_set = None  # (the step may have run)
            raise
        self._submitted(step, next_step)

    def _next_feeds(self, step: InFlight, fresh: bool) -> NextStep:
        """What `step` is submitted with as the next step (nothing changed yet)."""
        states = _NO_STATES
        if fresh:
            before_t = self._t
            scaler = None if self._scaler is None else copy.copy(self._scaler)
            if self._chain_set is not step.exe:
                states = _CHAIN_WRITE
        else:
            before_t, scaler = self._next_t, self._next_scaler
        t = before_t + 1
        scalars = self._opt.host_scalars(self._lr, t)
        if scaler is not None:
            scalars.update(scaler.scalars())
        feeds = dict(step.feeds)
        for name, value in scalars.items():
            feeds[name] = scalar_bytes(value, "f32")
        return NextStep(feeds, states, t, scaler)

    def _submitted(self, step: InFlight, next_step: NextStep) -> None:
        """`step` was submitted with `next_step`: the counts the step after it assumes."""
        if next_step.states:
            self._chain_set = step.exe
        step.t, step.submitted = next_step.t, next_step.feeds
        self._next_t, self._next_scaler = next_step.t, next_step.scaler
        if next_step.scaler is not None:
            next_step.scaler.update(overflow=False)

    async def _finished(self, step: InFlight, before: InFlight | None) -> Result:
        """The second part of a step, after its turn: once the step before it is finished
        (steps finish in call order), its result, once its readback is in (it is then the
        oldest in flight)."""
        assert step.readback is not None
        try:
            if before is not None:
                await before.done
            try:
                out, caps, applied = await step.readback
                loss = scalar(out)
            except BaseException:
                self._lost_readback()
                raise
            return (self._applied(step, loss, caps, applied)
                    or await self._finish_skipped(step, loss, caps))
        finally:
            self._flight.end(step)

    def _applied(self, step: InFlight, loss: float, caps: Mapping[str, Any], applied: bool
                 ) -> Completed | None:
        """The result of the oldest step in flight if the GPU applied it (out of the flight,
        counted), else None (skipped: its loss and captures tell why)."""
        if not (applied and math.isfinite(loss)):
            return None
        self._t = step.t
        if self._scaler is not None:
            self._scaler.update(overflow=False)
        self._flight.pop()
        return Completed(loss=loss, captures=Captures(caps))

    def _lost_readback(self) -> None:
        """The oldest step in flight has no readback (its error is its result)."""
        self._chain_set = None
        self._flight.pop()

    async def _finish_skipped(self, step: InFlight, loss: float, caps: Mapping[str, Any]
                              ) -> Result:
        """The result of the oldest step in flight, skipped on the GPU; the steps after it
        are submitted again (before it leaves the flight: a step submitted meanwhile is one
        of them)."""
        self._chain_set = None  # the step left 0 there (as do those after it, skipped)
        async with self._submitting:
            try:
                if len(self._flight) > 1:  # later steps overwrote its gradients: again
                    await (await step.exe.submit(step.submitted, states=_CHAIN_FORCE_SKIP))
                return await self._skipped_result(step, loss, caps)
            finally:
                await self._resubmit_after(step)
                self._flight.pop()

    async def _resubmit_after(self, skipped: InFlight) -> None:
        """Submit the steps after `skipped` again (the guard skipped them on the GPU),
        the first fresh; one that cannot be submitted gets that error as its result."""
        later = self._flight.after_oldest()
        fresh = True
        for step in later:
            assert step.readback is not None
            try:
                await step.readback  # (skipped: only its bytes are given back)
            except Exception:  # noqa: BLE001, S110 - its new submission tells
                pass
            try:
                await self._submit(step, fresh)
                fresh = False
            except Exception as e:  # noqa: BLE001 - the step's result
                step.readback, fresh = raising(e), True

    async def _skipped_result(self, step: InFlight, loss: float, caps: Mapping[str, Any]
                              ) -> Result:
        """A skipped step's result: Completed(skipped=True) for a mixed-precision overflow
        (the scale backs off), else Failed naming why."""
        if math.isfinite(loss) and await self._overflowed(step.exe, step.data):
            assert self._scaler is not None
            self._scaler.update(overflow=True)  # a normal event: skipped, scale backed off
            return Completed(loss=loss, captures=Captures(caps), skipped=True)
        culprit = self._bad_input(step.exe, step.data)
        why = await skip_reason(step.exe, self._live_store, self._grads, culprit, loss, step.t)
        return Failed(FloatingPointError(why))

    async def _overflowed(self, exe: Executable, data: Mapping[str, bytes]) -> bool:
        """Whether a skipped step with a finite loss was a mixed-precision overflow: the
        scaled gradients were not finite, the inputs were (else it is the data's fault)."""
        if self._scaler is None or self._bad_input(exe, data):
            return False
        return bool(await non_finite_grad(exe, self._grads))

    def _bad_input(self, exe: Executable, data: Mapping[str, bytes]) -> str:
        """The input that explains a skipped step (non-finite, or only sentinels), named;
        "" when every input is fine."""
        return non_finite_input(data, self._dtypes) or exe.sentinel_only_input(data)

    # -- params and state ----------------------------------------------------------------
    def download_param_grads(self) -> Coroutine[Any, Any, dict[str, HostArray]]:
        """{name: array}: the gradients computed by the last step (zeros before any)."""
        async def read() -> dict[str, HostArray]:
            names = list(self._grads)
            values = await self._live_exe().read([self._grads[n] for n in names])
            return dict(zip(names, values))
        return self._queue.submit(read)

    def reset(self, params: bool = True, optimizer: bool = True) -> Coroutine[Any, Any, None]:
        """Re-initialise params (same seed, same values as at compile) and/or optimizer
        state (zeros, step counter 0, an LR schedule back at its step 1, a mixed-precision
        loss scale back at its initial value), in call order with the steps."""
        async def reset() -> None:
            if params:
                self._live_store().reset()
            if optimizer:
                self._zero_optimizer_state()
        return self._queue.submit(reset)

    def reset_optimizer_state(self) -> Coroutine[Any, Any, None]:
        """Zero every optimizer state buffer and restart the step counter (an LR schedule,
        the one given to set_lr included, restarts at its step 1; a mixed-precision loss
        scale at its initial value)."""
        async def reset() -> None:
            self._zero_optimizer_state()
        return self._queue.submit(reset)

    def _zero_optimizer_state(self) -> None:
        exe = self._live_exe()
        for node in exe.graph.states.values():
            init = float(node.attrs.get("init", 0.0))
            exe.write(node.id, to_bytes("state", [init] * node.size, node.shape, "f32"))
        self._t = 0
        self._lr = rebase(self._lr_given, 1)  # a schedule from set_lr restarts with the count
        if self._scaler is not None:
            self._scaler.reset()

    def set_lr(self, lr: LR) -> Coroutine[Any, Any, None]:
        """Replace the learning rate or schedule (checked when called); it applies from the
        next step after the calls made before this one, a schedule starting there."""
        self._live_exe()
        rebase(lr, 1)  # checks it now

        async def apply() -> None:
            self._live_exe()
            self._lr, self._lr_given = rebase(lr, self._t + 1), lr
        return self._queue.submit(apply)

    def replace_model(self, model: Module, seed: int | None = None,
                      optimizer: OptimizerConfig | None = None) -> Coroutine[Any, Any, None]:
        """Swap in a new model (fresh params, optimizer state and step counter). Calls made
        before it return Aborted if they had not finished; attached forwards retrace against
        the new model. The rebuild runs once the calls before it are done; if the handle was
        destroyed meanwhile it raises AbortError and builds nothing."""
        self._live_exe()
        if seed is not None:
            check_seed(seed)  # a bad seed raises now, not inside the queue
        self._generation += 1
        for child in self._children:
            child._invalidate()

        async def rebuild() -> None:
            if self._destroyed:  # destroyed after this call: build nothing it would not free
                raise AbortError("replace_model: the training was destroyed before the new "
                                 "model was built")
            old_exe, old_store = self._exe, self._store
            self._build(model, optimizer if optimizer is not None else self._optimizer, seed)
            if self._destroyed_meanwhile():
                self._drop_graph()
                raise AbortError("replace_model: the training was destroyed while the new "
                                 "model compiled")
            if old_exe is not None:
                old_exe.destroy()
            if old_store is not None:
                old_store.destroy()
        return self._queue.submit(rebuild)

    async def attach(self, forward: Callable[..., Tensor], inputs: Mapping[str, InputSpec],
                     output: DType = "f32", max_cached_shapes: int = 8) -> Forward:
        """A forward graph sharing this training's param buffers; its runs take their turn
        with the steps. `inputs` may leave one dim per input as None, the same size for all
        (``{"x": (None, 1)}``): each run resolves it from the data (length / the other dims)
        and a new size is compiled on first use, the last `max_cached_shapes` kept."""
        self._live_exe()
        child = Forward(self.device, forward, inputs, output, max_cached_shapes,
                        self._chunk_size, owner=self, fuse=self._fuse, tiered=self._tiered)
        self._children.append(child)
        return child

    def _detach(self, child: Forward) -> None:
        """Forget an attached forward that was destroyed."""
        if child in self._children:
            self._children.remove(child)

    def destroy(self) -> None:
        """Free every GPU resource; pending and later calls return Aborted."""
        if self._destroyed:
            return
        self._destroyed = True
        self._generation += 1
        for child in list(self._children):  # (each one detaches itself)
            child.destroy()
        self._drop_graph()

    def _destroyed_meanwhile(self) -> bool:
        """Whether destroy() ran during a compile that gave the event loop a turn (in the
        browser, run_sync waits for the pipelines while other tasks run)."""
        return self._destroyed

    def _drop_graph(self) -> None:
        """Free the executable and param store in place (if any) and forget them."""
        if self._exe is not None:
            self._exe.destroy()
        if self._store is not None:
            self._store.destroy()
        self._exe = self._store = None


def _fixed_shape(decl: InputDecl) -> tuple[int, ...]:
    """A training input's shape: every dim given (normalize_inputs refused a None dim)."""
    dims = tuple(d for d in decl.shape if d is not None)
    assert len(dims) == len(decl.shape), decl
    return dims


__all__ = ["Training"]
