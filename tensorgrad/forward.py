"""The forward handle: :class:`Forward`, a compiled forward (inference) function, one
executable per input shape. Attached to a training (:meth:`tensorgrad.Training.attach`) it
binds that training's params; standalone (:func:`tensorgrad.compile_forward`) it owns a param
store of its own, made by the compiler's store stage.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from . import describe
from .compiler import Request, compile_graph
from .errors import AbortError, ShapeError
from .flight import CallQueue
from .gpu import GPUDevice
from .handle import Handle, Shapes
from .ir import DType, Shape
from .module import Module
from .results import Captures, Completed, Result
from .runtime import Executable, ParamStore
from .tensor import Tensor
from .trace import normalize_inputs, resolve_shapes

if TYPE_CHECKING:
    from .hostdata import InputData
    from .trace import InputSpec
    from .training import Training

Typed = dict[str, tuple[Shape, DType]]
"""{input name: (shape, dtype)} of one compiled shape of a forward."""

# A compile may give the event loop a turn: in the browser, Pyodide's run_sync (JSPI) waits for
# the pipelines while other tasks run, so replace_model or destroy can happen in the middle of
# one. Each compiled shape therefore remembers the param store it binds, and is used only while
# that store is the live one.
_Cached = tuple[Executable, Typed, ParamStore]


class Forward(Handle):
    """A compiled forward (inference) graph; one compiled executable per input shape.

    Like :class:`Training`, usable from any thread and event loop: its runs (an attached
    forward's with its training's calls) run one at a time in call order."""

    def __init__(self, device: GPUDevice, forward: Callable[..., Tensor],
                 inputs: Mapping[str, InputSpec], output: DType, max_cached_shapes: int,
                 chunk_size: int, owner: Training | None = None,
                 store: ParamStore | None = None, model: Module | None = None,
                 fuse: bool = True, tiered: bool | None = None):
        check_output(output)
        dtypes = {n: d.dtype for n, d in normalize_inputs(inputs).items()}  # a clear error first
        # An attached forward's runs take their turn in its training's queue (with the steps).
        super().__init__(device, inputs, dtypes, chunk_size, fuse, tiered,
                         owner._queue if owner is not None else CallQueue())
        self._forward = forward
        self._output = output
        if owner is not None:  # an attached forward runs in its training's precision
            self._precision = owner._precision
        self._max_cached = max(1, int(max_cached_shapes))
        self._owner = owner
        self._own_store = store
        self._own_model = model
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._cache_lock = threading.RLock()  # the cache and its compiles, from any thread

    def _live_store(self) -> ParamStore:
        store = self._owner._live_store() if self._owner else self._own_store
        if store is None:
            raise RuntimeError("this forward handle was destroyed")
        return store

    def _shapes(self, inputs: Mapping[str, InputData]) -> dict[str, tuple[int, ...]]:
        return resolve_shapes(self._input_decls, inputs)

    @property
    def _model(self) -> Module:
        if self._owner is not None:
            return self._owner._model
        assert self._own_model is not None  # a standalone forward is given its model
        return self._own_model

    def __repr__(self) -> str:
        """One line: the model, params, inputs (None dims as None), output dtype, the shapes
        compiled so far and their kernels, the device, attached or standalone, state."""
        decls = normalize_inputs(self._input_decls)
        inputs = describe.mapping({n: describe.shape(d.shape, d.dtype) for n, d in decls.items()})
        model = type(self._model).__name__
        owner = "attached to a tg.Training" if self._owner else "standalone"
        if self._destroyed:
            return f"<tg.Forward of {model}: destroyed, inputs {inputs}, {owner}>"
        compiled = [", ".join(f"{n}: {list(s)}" for n, (s, _) in typed.items()) + "; "
                    + describe.count(exe.kernel_count, "kernel")
                    for exe, typed, _ in self._cache.values()]
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
        for exe, _, _ in self._cache.values():
            exe.destroy()
        self._cache.clear()

    def graph_for(self, **inputs: InputData) -> Executable:
        """The executable for these inputs' shapes (compiled on first use, LRU-cached), for
        the model in place now: between ``replace_model`` and its rebuild, the old one."""
        shapes = resolve_shapes(self._input_decls, inputs)
        while True:
            try:
                return self._executable(shapes)
            except AbortError:  # replaced while it compiled: compile for the new one
                if self._destroyed:
                    raise RuntimeError("this forward handle was destroyed") from None

    def _executable(self, shapes: Shapes) -> Executable:
        """The cached executable of `shapes` bound to the live param store, else a new one.
        AbortError when the model is replaced or the handle destroyed while it compiles."""
        with self._cache_lock:
            return self._cached_or_compiled(shapes)

    def _cached_or_compiled(self, shapes: Shapes) -> Executable:
        typed: Typed = {n: (s, self._dtypes[n]) for n, s in shapes.items()}
        key = "|".join(f"{n}:{'x'.join(map(str, s))}:{d}" for n, (s, d) in sorted(typed.items()))
        store = self._live_store()
        hit = self._cache.pop(key, None)
        if hit is not None:
            if hit[2] is store:
                self._cache[key] = hit  # most recently used
                return hit[0]
            hit[0].destroy()  # compiled against a store replaced since
        generation = self._generation
        c = compile_graph(Request("forward", self._model, self._forward, typed,
                                  output=self._output), self._options(store))
        exe = c.executable
        assert exe is not None
        if self._destroyed or generation != self._generation or self._live_store() is not store:
            exe.destroy()
            raise AbortError("the model was replaced or the forward destroyed while this "
                             "shape compiled")
        self._cache[key] = (exe, typed, store)
        while len(self._cache) > self._max_cached:
            _, (old, _, _) = self._cache.popitem(last=False)
            old.evicted = True
            old.destroy()
        return exe

    def run(self, **inputs: InputData) -> Coroutine[Any, Any, Result]:
        """Run the forward (await it): Completed(output, captures), Aborted() or
        Failed(error). The inputs are checked and copied when run is called (the shape rule of
        :meth:`Training.step`; a None dim is resolved from the data's size); runs of an
        attached forward take their turn with the training's steps, in call order.

        Cancelled while it waits for its turn, a run never runs; once started it runs to its
        end (its PRNG draw counted) and the cancelled awaiter gets ``CancelledError`` at once,
        as :meth:`Training.step` says."""
        return self._call("run", inputs, self._run)

    async def _run(self, shapes: Shapes, data: dict[str, bytes]) -> Result:
        while True:
            exe = self._executable(shapes)
            feeds, prng = dict(data), self._prng_counter
            self._feed_seed(exe, feeds)
            try:
                out, caps, _ = await exe.run(feeds)
            except AbortError:
                # evicted before it ran by a shape another thread compiled (output_shape,
                # graph_for): compiled again, its PRNG draw not counted twice; a forward
                # replaced or destroyed is Aborted
                if exe.evicted and not self._destroyed:
                    self._prng_counter = prng
                    continue
                raise
            return Completed(output=out, captures=Captures(caps))

    def output_shape(self, **inputs: InputData) -> tuple[int, ...]:
        """The output's shape for these inputs (compiling for their shapes if needed)."""
        exe = self.graph_for(**inputs)
        return exe.graph[exe.output_id].shape

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
        if self._owner is not None:
            self._owner._detach(self)  # (a training attaching and destroying many holds none)


def check_output(output: object) -> None:
    """ShapeError unless `output` (a forward's declared output dtype) is 'f32' or 'i32'."""
    if output not in ("f32", "i32"):
        raise ShapeError("forward", f"output must be 'f32' or 'i32', got {output!r}")


__all__ = ["Forward", "check_output"]
