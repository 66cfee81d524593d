"""WGSL code generation: one kernel per IR node, from each op's emitter."""

from .kernel import EmitContext, Kernel, Target, dispatch_size, emit_graph

__all__ = ["EmitContext", "Kernel", "Target", "dispatch_size", "emit_graph"]
