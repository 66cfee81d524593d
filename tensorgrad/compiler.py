"""The compiler: one ordered list of stages from a model and a function to a GPU program.

    trace → autograd → passes → optimizer → passes → plan → emit → pipelines → store → build

A :class:`Compilation` carries one graph through :data:`STAGES`; each stage fills in its part
(the traced graph, the gradients, the optimizer's writebacks, the buffer plan, the kernels,
the param store, the executable). Training steps and forward graphs take the same stages:
autograd and the optimizer do nothing for a forward graph. A "params" request has no graph:
it reads the model's params and makes their store (a standalone forward's, made before any of
its graphs, whose input sizes come with its runs). Passes are registered in
:data:`tensorgrad.passes.PASSES`, each at the phase where it runs. :func:`trace` and
:func:`trace_forward` are the IR-only entry points (no device); the handles
(:mod:`tensorgrad.training`, :mod:`tensorgrad.forward`) compile through :func:`compile_graph`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from . import describe
from .autograd import append_grad
from .codegen.kernel import Kernel, Target, dump_kernels, emit_graph, emit_kernels
from .errors import ShapeError, TraceError
from .gpu.interface import DeviceLimits, GPUDevice
from .init import ParamSpec
from .ir import DType, Graph
from .module import Module
from .ops.index import input_index_bounds
from .ops.registry import OPS
from .optim import OptimizerConfig, OptimizerPlan, Writeback, append_optimizer
from .passes import PASSES, Phase
from .pipelines import Acquiring, pipeline_cache
from .plan import BufferPlan, plan_buffers
from .precision import append_scaled_grad, check_precision
from .runtime import (
    Executable,
    ParamStore,
    build_executable,
    dispatches,
    kernel_sources,
    shared_param_buffers,
)
from .tensor import Tensor
from .trace import InputDecl, InputSpec, check_seed, model_params, trace_graph

__all__ = ["STAGES", "Compilation", "Options", "Request", "Stage", "compile_graph", "trace",
           "trace_forward"]

Kind = Literal["training", "forward", "params"]
GRAPHS: frozenset[Kind] = frozenset({"training", "forward"})
# The layout ops (views and packs) the buffer plan arranges without kernels.
LAYOUT_OPS = {name: op for name, op in OPS.items() if op.view is not None or op.pack}


@dataclass(frozen=True)
class Request:
    """What to compile: `fn(model, **inputs)` is the loss (training) or the forward output;
    a "params" request compiles no function, only the model's param store.

    `optimizer` is required by the optimizer stage of a training graph; `seed` seeds the
    param init (None: random); `output` is the declared dtype of a forward's output."""

    kind: Kind
    model: Module
    fn: Callable[..., Tensor] | None = None
    inputs: Mapping[str, InputSpec] = field(default_factory=dict)
    optimizer: OptimizerConfig | None = None
    seed: int | None = None
    output: DType | None = None


@dataclass
class Options:
    """How to compile: for which device (None: stop after emit), with which passes.

    `store` holds the params to bind (an attached forward shares its training's); without one
    the store stage makes a fresh store from the model's params and the seed."""

    device: GPUDevice | None = None
    limits: DeviceLimits = field(default_factory=DeviceLimits)
    target: Target | None = None
    fuse: bool = True
    arena: bool = True  # params, gradients and optimizer state in arenas (few update kernels)
    chunk_size: int = 32
    store: ParamStore | None = None
    # A tiered start: build on quick-to-compile kernels (Target.quick), then swap in the
    # optimized ones once their pipelines are compiled (Executable.upgrade). None: where
    # compiles are dear (Target.costly_compiles: SwiftShader).
    tiered: bool | None = None
    # "f32", or "mixed": f16 activations, loss scaling (tensorgrad/precision.py)
    precision: str = "f32"

    @property
    def mixed(self) -> bool:
        """Whether the step is compiled in mixed precision (f16 activations)."""
        return self.precision == "mixed"

    @property
    def tiered_start(self) -> bool:
        """Whether the build starts on quick kernels (see `tiered`)."""
        if self.tiered is not None:
            return self.tiered and self.device is not None
        return self.device is not None and self.target is not None and \
            self.target.costly_compiles

    @property
    def parallel_gpu(self) -> bool:
        """True unless the target is a CPU-emulated GPU (passes that only add parallelism,
        such as split-K, are off there)."""
        return self.target is None or not self.target.software

    @property
    def stitch_for_gpu(self) -> bool:
        """Whether the stitching pass runs for a GPU (or no target)."""
        return self.fuse and self.parallel_gpu

    @property
    def stitch_for_software(self) -> bool:
        """Whether the stitching pass runs for a CPU-emulated GPU (see
        :attr:`tensorgrad.ops.registry.Stitch.software_permutes`)."""
        return self.fuse and not self.parallel_gpu

    @staticmethod
    def for_device(device: GPUDevice, **kwargs: Any) -> Options:
        return Options(device=device, limits=device.limits,
                       target=Target.for_device(device.limits, device.info), **kwargs)


@dataclass
class Compilation:
    """One graph on its way through the stages. `output` is the loss node of a training
    graph and the output node of a forward graph; `grads` maps param names to gradient
    nodes; ids are re-pointed whenever a pass renumbers the graph."""

    request: Request
    graph: Graph = field(default_factory=Graph)
    output: int = -1
    params: dict[str, ParamSpec] = field(default_factory=dict)
    inputs: dict[str, InputDecl] = field(default_factory=dict)
    seed: int = 0
    grads: dict[str, int] = field(default_factory=dict)
    optimizer: OptimizerPlan | None = None
    plan: BufferPlan | None = None
    kernels: list[Kernel] = field(default_factory=list)
    store: ParamStore | None = None
    executable: Executable | None = None
    tiered: bool = False  # a tiered start: `kernels` are the quick tier (Options.tiered)
    acquiring: Acquiring | None = None  # the pipelines started for `kernels`
    done: list[str] = field(default_factory=list)  # the stages run so far

    @property
    def training(self) -> bool:
        return self.request.kind == "training"

    @property
    def loss(self) -> int:
        """The loss node (training graphs)."""
        if not self.training:
            raise AttributeError("a forward graph has no loss; its output node is .output")
        return self.output

    @property
    def writebacks(self) -> tuple[Writeback, ...]:
        return self.optimizer.writebacks if self.optimizer else ()

    def roots(self) -> set[int]:
        """Nodes every pass must keep: the output, the gradients, the writeback sources, the
        step guard."""
        status = () if self.optimizer is None or self.optimizer.status is None else (
            self.optimizer.status,)
        dests = (wb.dest for wb in self.writebacks if wb.kind == "node")
        return {self.output, *self.grads.values(), *(wb.source for wb in self.writebacks),
                *dests, *status}

    def renumber(self, graph: Graph, remap: Mapping[int, int]) -> None:
        """Adopt `graph`, whose ids relate to the old ones by `remap`."""
        self.graph = graph
        self.output = remap[self.output]
        self.grads = {name: remap[i] for name, i in self.grads.items()}
        if self.optimizer is not None:
            self.optimizer = self.optimizer.renumbered(remap)

    def __str__(self) -> str:
        return str(self.graph)

    def __repr__(self) -> str:
        """One line: what was compiled, the stages done, node, param and input counts and
        shapes, the kernels and the plan's peak once there (``print()`` shows the IR)."""
        r = self.request
        what = {"training": "training step", "forward": "forward graph",
                "params": "param store"}[r.kind]
        stage = f"after {self.done[-1]!r}" if self.done else "before tracing"
        params = sum(s.size for s in self.params.values())
        inputs = describe.mapping({n: describe.shape(d.shape, d.dtype)
                                   for n, d in self.inputs.items()})
        parts = [describe.count(len(self.graph.nodes), "node"),
                 f"{describe.count(len(self.params), 'param')} ({params:,} values)",
                 f"inputs {inputs}", f"{'loss' if self.training else 'output'} %{self.output}"]
        if self.training:
            parts.append(describe.count(len(self.grads), "gradient"))
        if self.kernels:
            parts.append(describe.count(sum(1 for k in self.kernels if k.threads > 0), "kernel"))
        if self.plan is not None:
            parts.append(f"peak {describe.byte_size(self.plan.peak_bytes)}")
        if self.executable is not None:
            parts.append(f"built on {describe.device(self.executable.device)}")
        return f"<Compilation of a {what} of {type(r.model).__name__}, {stage}: " + \
            ", ".join(parts) + ">"


# ---- the stages ------------------------------------------------------------------------------

def _trace(c: Compilation, o: Options) -> None:
    r = c.request
    if r.kind == "params":  # no function: the model's params alone
        c.params, c.seed = model_params(r.model), check_seed(r.seed)
        return
    assert r.fn is not None, f"a {r.kind} request needs a function"
    traced = trace_graph(r.model, r.fn, r.inputs, "loss" if c.training else "forward")
    out = traced.graph[traced.output]
    if r.output is not None and out.dtype != r.output:
        raise ShapeError("forward", f"the forward returns {out.dtype} but output="
                         f"{r.output!r} was declared")
    c.graph, c.output, c.params, c.inputs = traced.graph, traced.output, traced.params, \
        traced.inputs
    c.seed = check_seed(r.seed)


def _autograd(c: Compilation, o: Options) -> None:
    if c.training:  # (each checks that the loss is a 0-d f32 tensor)
        grad = append_scaled_grad if o.mixed else append_grad
        c.grads = grad(c.graph, c.output, c.request.model.frozen_param_names())


def _passes(phase: Phase) -> Callable[[Compilation, Options], None]:
    def run(c: Compilation, o: Options) -> None:
        for p in PASSES:
            if p.phase == phase and (p.option is None or getattr(o, p.option)):
                c.renumber(*p.run(c.graph, c.roots()))
    return run


def _optimizer(c: Compilation, o: Options) -> None:
    if not c.training:
        return
    if c.request.optimizer is None:
        raise ValueError("compile: a training graph needs an optimizer (tg.optim.Adam(...), "
                         "AdamW or SGD)")
    frozen = c.request.model.frozen_param_names()
    if not c.grads and frozen:
        raise TraceError(f"compile: every f32 param of the model is frozen (Module.freeze), so "
                         f"there is nothing to train (frozen: {frozen}); unfreeze some with "
                         ".freeze(False), or run the model with tg.compile_forward")
    if not c.grads:
        raise TraceError(f"compile: the model has no f32 params, so there is nothing to train "
                         f"(its params: {list(c.params) or 'none'}); declare params with "
                         "self.param(...) or layers such as tg.Linear, or run a function "
                         "without params with tg.compile_forward")
    c.optimizer = append_optimizer(c.graph, c.grads, c.request.optimizer,
                                   {n: s.decay if s.decay_set else None
                                    for n, s in c.params.items()},
                                   default_decay={n: s.decay for n, s in c.params.items()},
                                   limits=o.limits, loss=c.output, arena=o.arena)
    c.graph.outputs = [c.output] + ([] if c.optimizer.status is None else [c.optimizer.status])


def _plan(c: Compilation, o: Options) -> None:
    c.plan = plan_buffers(c.graph, grads=c.grads, writebacks=c.writebacks, limits=o.limits,
                          layout_ops=LAYOUT_OPS)


def _emit(c: Compilation, o: Options) -> None:
    no_kernel = c.plan.no_kernel if c.plan is not None else frozenset()
    target = o.target or Target(limits=o.limits)
    c.tiered = o.tiered_start
    if c.tiered:
        quick = _quick_kernels(c.graph, replace(target, quick=True), no_kernel,
                               give_up=o.tiered is None)
        if quick is not None:
            c.kernels = quick
            return
        c.tiered = False
    c.kernels = emit_graph(c.graph, target, OPS, no_kernel)


def _quick_kernels(graph: Graph, quick: Target, no_kernel: frozenset[int], give_up: bool
                   ) -> list[Kernel] | None:
    """A tiered start's first kernels; with `give_up` (the tiering chosen automatically),
    None at the first kernel the quick tier refuses. Large matmuls keep their
    slow-to-compile kernels in the quick tier too: a tiered start would save little compile
    time and run its first steps slower (the addition transformer on SwiftShader: 7.3 s to
    compile + 8.2 s for a first step, against 12.0 + 1.6 s untiered)."""
    kernels = []
    for kernel in emit_kernels(graph, quick, OPS, no_kernel):
        if give_up and kernel.quick_refused:
            return None
        kernels.append(kernel)
    dump_kernels(kernels)
    return kernels


def _pipelines(c: Compilation, o: Options) -> None:
    """Start compiling the kernels' pipelines (in the background where the device can), so
    that they compile while the store stage initialises the params. The build stage
    finishes them; a compilation stopped between the two holds them in `c.acquiring` (give
    them up with ``pipeline_cache(device).abandon``)."""
    if o.device is None:
        raise ValueError("compile: the pipelines stage needs a device (Options.for_device)")
    c.acquiring = pipeline_cache(o.device).start(
        kernel_sources(dispatches(c.graph, c.kernels, OPS)))


def _store(c: Compilation, o: Options) -> None:
    """The params to bind: `o.store` (shared), else a fresh store laid out as the optimizer
    packed its arena (ParamStore checks the device limits before allocating anything)."""
    if o.store is not None:
        c.store = o.store
        return
    if o.device is None:
        raise ValueError("compile: the store stage needs a device (Options.for_device)")
    layout = c.optimizer.layout if c.optimizer is not None else None
    c.store = ParamStore(o.device, c.params, c.seed, layout)


def _build(c: Compilation, o: Options) -> None:
    if o.device is None:
        raise ValueError("compile: the build stage needs a device (Options.for_device)")
    assert c.plan is not None and c.store is not None and c.acquiring is not None
    upgrade = None
    if c.tiered:
        graph, no_kernel = c.graph, c.plan.no_kernel
        target = replace(o.target or Target(limits=o.limits), background=True)

        def upgrade() -> list[Kernel]:
            return emit_graph(graph, target, OPS, no_kernel)
    c.executable = build_executable(o.device, c.graph, c.plan, c.kernels, c.output,
                                    pipeline_cache(o.device), o.chunk_size, OPS,
                                    shared_param_buffers(c.graph, c.plan, c.store),
                                    status_id=c.optimizer.status if c.optimizer else None,
                                    index_bounds=input_index_bounds(c.graph),
                                    acquiring=c.acquiring, upgrade=upgrade)


def _abandon(c: Compilation, o: Options) -> None:
    """Undo what the device stages of a failed compilation made: the pipelines started for
    it (abandoned once: build_executable may have abandoned them already) and a store made
    by the store stage for this graph (a shared `o.store` stays)."""
    if c.executable is not None:
        return
    if c.acquiring is not None and o.device is not None:
        pipeline_cache(o.device).abandon(c.acquiring)
    if c.store is not None and c.store is not o.store:
        c.store.destroy()
        c.store = None


@dataclass(frozen=True)
class Stage:
    """One step of :func:`compile_graph`: `run` fills in its part of the compilation, for
    requests of the `kinds` it applies to (the others pass it by)."""

    name: str
    run: Callable[[Compilation, Options], None]
    kinds: frozenset[Kind] = GRAPHS


STAGES: tuple[Stage, ...] = (
    Stage("trace", _trace, GRAPHS | {"params"}),
    Stage("autograd", _autograd),
    Stage("passes after autograd", _passes("after_autograd")),
    Stage("optimizer", _optimizer),
    Stage("passes after optimizer", _passes("after_optimizer")),
    Stage("plan", _plan),
    Stage("emit", _emit),
    Stage("pipelines", _pipelines),
    Stage("store", _store, GRAPHS | {"params"}),
    Stage("build", _build),
)


def compile_graph(request: Request, options: Options, until: str = "build") -> Compilation:
    """Run the stages in order, up to and including the one named `until`."""
    names = [s.name for s in STAGES]
    if until not in names:
        raise ValueError(f"compile_graph: no stage {until!r} (stages: {names})")
    check_precision(options.precision, options.device.info if options.device else None)
    c = Compilation(request)
    try:
        for stage in STAGES:
            if request.kind in stage.kinds:
                stage.run(c, options)
                c.done.append(stage.name)
            if stage.name == until:
                break
    except BaseException:
        _abandon(c, options)
        raise
    return c


# ---- IR-only entry points --------------------------------------------------------------------

def trace(model: Module, loss: Callable[..., Tensor], inputs: Mapping[str, InputSpec],
          seed: int | None = None) -> Compilation:
    """Trace `loss(model, **inputs)` and derive its gradients: the forward + backward graph
    after dead-code elimination, before the optimizer (no device needed).

    The loss must be a 0-d f32 tensor; all input dims must be concrete. `seed` (32-bit;
    random by default) seeds the param init. The result's `graph`, `loss`, `grads` ({param
    name: gradient node}), `params` and `inputs` describe the step; ``print()`` shows the IR."""
    return compile_graph(Request("training", model, loss, inputs, seed=seed), Options(),
                         until="passes after autograd")


def trace_forward(model: Module, forward: Callable[..., Tensor],
                  inputs: Mapping[str, InputSpec]) -> Compilation:
    """Trace `forward(model, **inputs)` after dead-code elimination (no device needed).

    Input dims must be concrete: this traces one shape. For inputs of any size at run time,
    ``train.attach(forward=..., inputs={"x": (None, 1)})`` or ``tg.compile_forward`` take a
    None dim, resolve it from each run's data and compile each size on first use."""
    return compile_graph(Request("forward", model, forward, inputs), Options(),
                         until="passes after autograd")
