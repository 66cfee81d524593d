"""What the handles share: :class:`Handle`, the base of :class:`~tensorgrad.training.Training`
and :class:`~tensorgrad.forward.Forward`.

A handle holds compiled graphs on a device and the params they bind. Its calls run one at a
time in call order (a :class:`~tensorgrad.flight.CallQueue`; an attached forward shares its
training's), a call made before the graph was replaced or destroyed returns ``Aborted``, and
``step`` / ``run`` never raise. Host data is converted once: checked against its declared
shape and dtype and copied to bytes when the call is made (:func:`_snapshot`: the data may
change before the queued call runs), then handed to the executable as it is, beside the
hidden inputs the library makes itself (the optimizer's per-step scalars, the PRNG seed),
which are packed directly.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from .compiler import Options
from .errors import AbortError, ShapeError
from .flight import CallQueue
from .gpu import GPUDevice
from .hostdata import scalar_bytes, to_bytes
from .results import Aborted, Failed, Result
from .runtime import Executable, ParamStore
from .tensor import PRNG_SEED_INPUT

if TYPE_CHECKING:
    from .hostdata import HostArray, HostData, InputData
    from .ir import DType
    from .trace import InputSpec

DEFAULT_CHUNK_SIZE = 32
Shapes = Mapping[str, tuple[int, ...]]
"""{input name: shape} of one call's inputs (None dims resolved)."""
Body = Callable[[Shapes, dict[str, bytes]], Awaitable[Result]]
"""What a step or run does in its turn, with its input shapes and bytes."""
StagedBody = Callable[[Shapes, dict[str, bytes]], Awaitable[Awaitable[Result]]]
"""What a staged step does in its turn (submit), returning what finishes it after the turn."""


def _snapshot(where: str, given: Mapping[str, InputData], shapes: Shapes,
              dtypes: Mapping[str, DType]) -> dict[str, bytes]:
    """The user's inputs validated against their shapes and copied, at call time: a step or
    run queued behind others uses the data as it was when it was called. The only
    conversion of the user's data (the bytes go to the GPU as they are)."""
    out = {}
    for name, value in given.items():
        data: HostData = [value] if isinstance(value, (int, float)) else value
        out[name] = bytes(to_bytes(f"input '{name}'", data, shapes[name], dtypes[name]))
    return out


def _check_user_inputs(where: str, given: Mapping[str, object],
                       declared: Mapping[str, InputSpec]) -> None:
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


def non_finite_input(data: Mapping[str, bytes], dtypes: Mapping[str, DType]) -> str:
    """Which f32 input holds a NaN or Inf, if any ("" when none): looked up only after a
    failed step, so a normal step pays nothing."""
    for name, raw in data.items():
        if dtypes.get(name) != "f32":
            continue
        for k, v in enumerate(memoryview(raw).cast("f")):
            if not math.isfinite(v):
                return f"input '{name}' holds {v} at flat index {k}"
    return ""


def scalar(x: HostArray) -> float:
    """The one value of a 0-d (or one-element) host array (numpy, or a memoryview)."""
    if isinstance(x, memoryview):  # no numpy
        return float(x[()] if x.ndim == 0 else x[0])
    return float(x.reshape(-1)[0])


async def _value(result: Result) -> Result:
    return result


async def raising(error: Exception) -> NoReturn:
    """A coroutine that raises `error` when awaited: an error given where a coroutine of a
    result is expected (a step's failed first part, a step that could not be resubmitted)."""
    raise error


class Handle:
    """The base of :class:`~tensorgrad.Training` and :class:`~tensorgrad.Forward`: the
    device, the declared inputs, the call queue and what runs through it, the params.

    A subclass gives its queue (an attached forward shares its training's), its param store
    (:meth:`_live_store`, and :meth:`_shown_store` for the properties) and its inputs' shapes
    per call (:meth:`_shapes`)."""

    def __init__(self, device: GPUDevice, inputs: Mapping[str, InputSpec],
                 dtypes: Mapping[str, DType], chunk_size: int, fuse: bool,
                 tiered: bool | None, queue: CallQueue) -> None:
        self.device = device
        self._queue = queue
        self._tiered = tiered
        self._input_decls = dict(inputs)
        self._dtypes = dict(dtypes)
        self._chunk_size = chunk_size
        self._fuse = fuse
        self._precision = "f32"  # a training's (tensorgrad/precision.py); its forwards' too
        self._generation = 0
        self._destroyed = False
        self._prng_counter = 0

    # -- what a subclass gives -------------------------------------------------------------
    def _live_store(self) -> ParamStore:
        """The params the graphs bind; RuntimeError naming the handle when they are gone."""
        raise NotImplementedError

    def _shown_store(self) -> ParamStore | None:
        """The store the param properties describe (None: they describe none)."""
        return self._live_store()

    def _shapes(self, inputs: Mapping[str, InputData]) -> dict[str, tuple[int, ...]]:
        """The shapes of a call's inputs."""
        raise NotImplementedError

    # -- calls -----------------------------------------------------------------------------
    def _options(self, store: ParamStore | None = None) -> Options:
        return Options.for_device(self.device, fuse=self._fuse, chunk_size=self._chunk_size,
                                  store=store, tiered=self._tiered, precision=self._precision)

    def _call(self, where: str, inputs: Mapping[str, InputData], body: Body
              ) -> Coroutine[Any, Any, Result]:
        """Check and copy `inputs` now, then run `body(shapes, data)` in this handle's turn.
        Never raises: a bad input is a Failed, returned in call order like every result."""
        generation = self._generation
        checked = self._checked(where, inputs)
        if isinstance(checked, Failed):
            return self._queue.submit(lambda: _value(checked))
        shapes, data = checked
        return self._queue.submit(lambda: self._guard(lambda: body(shapes, data), generation))

    def _call_staged(self, where: str, inputs: Mapping[str, InputData], body: StagedBody
                     ) -> Coroutine[Any, Any, Result]:
        """:meth:`_call` of a body that gives its turn up when it returns (a staged call of
        the queue): what it returns, awaited after the turn, is the result."""
        generation = self._generation
        checked = self._checked(where, inputs)
        if isinstance(checked, Failed):
            return self._queue.submit(lambda: _value(checked))
        shapes, data = checked
        return self._queue.submit_staged(
            lambda: self._guard_staged(lambda: body(shapes, data), generation))

    def _checked(self, where: str, inputs: Mapping[str, InputData]
                 ) -> tuple[Shapes, dict[str, bytes]] | Failed:
        """(shapes, bytes) of a call's inputs, checked and copied now; a Failed if bad."""
        try:
            _check_user_inputs(where, inputs, self._input_decls)
            shapes = self._shapes(inputs)
            return shapes, _snapshot(where, inputs, shapes, self._dtypes)
        except Exception as e:  # noqa: BLE001 - step/run report failures, never raise
            return Failed(e)

    async def _guard_staged(self, call: Callable[[], Awaitable[Awaitable[Result]]],
                            generation: int) -> Awaitable[Result]:
        """:meth:`_guard` for both parts of a staged call; a first part that fails waits
        for what is in flight (``queue.settle``), so its result comes in call order."""
        try:
            if self._destroyed or generation != self._generation:
                raise AbortError("destroyed or replaced")
            rest = await call()
        except Exception as e:  # noqa: BLE001 - step/run report failures, never raise
            error = e
            if self._queue.settle is not None:
                await self._queue.settle()
            return self._guard(lambda: raising(error), generation)
        return self._guard(lambda: rest, generation, started=True)

    async def _guard(self, call: Callable[[], Awaitable[Result]], generation: int,
                     started: bool = False) -> Result:
        """Run `call`; Aborted if the graph was replaced/destroyed since `generation` (the
        generation when step/run was called, not when the coroutine first ran). `started`:
        the call is under way (the rest of a staged call), it runs to its end in any case."""
        try:
            if not started and (self._destroyed or generation != self._generation):
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

    def _feed_seed(self, exe: Executable, feeds: dict[str, bytes]) -> None:
        """The PRNG seed input of `exe`, if it draws random numbers: the next of this handle's
        draws (each step or run of a graph with random ops counts one)."""
        if PRNG_SEED_INPUT in exe.inputs:
            self._prng_counter += 1
            feeds[PRNG_SEED_INPUT] = scalar_bytes(self._prng_counter, "i32")

    # -- params ----------------------------------------------------------------------------
    @property
    def param_names(self) -> list[str]:
        """The model's dotted param names, in param order (a forward's: the params it shares
        with its training or owns)."""
        store = self._shown_store()
        return store.names if store else []

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """{param name: shape}, in param order."""
        store = self._shown_store()
        return {n: s.shape for n, s in store.specs.items()} if store else {}

    @property
    def param_count(self) -> int:
        """How many parameter values the model has (sum of the param sizes)."""
        store = self._shown_store()
        return sum(s.size for s in store.specs.values()) if store else 0

    def upload_params(self, params: Mapping[str, HostData], partial: bool = False
                      ) -> Coroutine[Any, Any, None]:
        """Write params {name: array} (an attached forward's go to its training's); every
        name unless `partial`. Checked and copied when called (a bad name, size or shape
        raises then); written in call order with the steps and runs.

        The shape rule of :meth:`Training.step <tensorgrad.Training.step>` applies: an array
        of 2 or more dims must have the param's shape (``param_shapes``) exactly, flat data of
        the right size is row-major. A PyTorch ``nn.Linear.weight`` is ``[out, in]``,
        tensorgrad's ``Linear.W`` ``[in, out]``: pass its transpose."""
        store = self._live_store()
        data = store.check(params, partial)

        async def write() -> None:
            if store is not self._current_store():
                raise AbortError("upload_params: the model was replaced or destroyed before "
                                 "the upload ran")
            store.write(data)
        return self._queue.submit(write)

    def _current_store(self) -> ParamStore | None:
        """The store now (None once destroyed), for a queued upload to compare with."""
        return self._live_store()

    def download_params(self) -> Coroutine[Any, Any, dict[str, HostArray]]:
        """{name: array} of every param (after the calls made before this one)."""
        return self._queue.submit(lambda: self._live_store().download())


__all__ = ["DEFAULT_CHUNK_SIZE", "Handle", "non_finite_input", "scalar"]
