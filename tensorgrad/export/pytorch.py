"""Export a tensorgrad model to PyTorch: a plain ``nn.Module`` source file plus its weights.

    ex = tg.export.torch(MLP(), inputs={"x": (None, 1)}, path="mlp_torch.py")
    ex = await tg.export.torch(train, inputs={"x": (None, 1)}, path="mlp_torch.py")

The first form exports a Module with its seeded init (``seed``) or the given ``params``; the
second downloads a training or forward handle's current weights (so it is awaited). Both
write ``path`` (the source) and ``path`` with the suffix ``.safetensors`` (the weights,
loadable with ``safetensors.torch.load_file``) and return a :class:`TorchExport`; with
``path=None`` nothing is written and the export holds the source text and the weight bytes
(this is what runs in the browser, where neither torch nor numpy is needed).

What is written:

* one ``nn.Module`` class per tensorgrad Module class of the tree (a class whose instances
  differ in structure or forward code gets variants ``Name_2``, ...), its params as
  ``nn.Parameter`` under the same dotted names (lists become ``nn.ModuleList``, dicts
  ``nn.ModuleDict``), constructor arguments taken from the instance's int attributes where
  they give the param shapes (``Linear(in_features=1, out_features=64)``), and a
  ``reset_parameters`` that follows the tensorgrad init specs (same distributions, not the
  same random stream);
* each module's ``forward`` written from the traced IR, one line per node or per inlined
  expression, with the user's source line as a comment. A call of a submodule becomes
  ``self.child(...)`` when its traced body only reads its tensor arguments and its own
  params; otherwise it is inlined into the caller.

Shapes. The IR is traced at fixed shapes. A dim declared ``None`` in ``inputs`` (one per
input, the same value for all, as for ``train.attach``) is traced at three probe sizes; every
shape and op argument that changes with it must be ``a * N + c`` (integers), and is written
as an expression of that size read from the input (``B = x.shape[0]``), so the exported
forward accepts any size there. Every other dim stays what was traced.

Semantics. Every forward-reachable op of the op table (:func:`forward_ops`) has a
translation, given where the op is defined (``define(..., torch=...)``); backward and
optimizer ops (made after the trace, never in a forward) raise :class:`ExportError`. Differences, all within
float tolerance or of measure zero: ``erf`` is exact in torch (tensorgrad uses a 1.5e-7
approximation); ``abs`` and ``maximum``/``minimum`` give the torch gradient at exact ties;
``dropout``, ``randn`` and ``categorical`` draw from torch's generator (same distributions;
dropout follows ``module.train()`` / ``eval()``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import describe
from ..codegen.torchexpr import Sym, TorchContext
from ..module import Module
from ..ops.registry import GRAD_ERROR, OPS
from ..tensor import Tensor
from .analysis import Analysis
from .body import translate_node, unsupported  # noqa: F401  (translate_node: re-exported)
from .classes import Grouper
from .classtext import ClassWriter
from .errors import ExportError
from .forwards import Forwards
from .helpers import HELPERS
from .tracing import trace_probes

__all__ = ["ExportError", "TorchExport", "export_torch", "forward_ops", "translatable_ops"]

PROBES = (3, 5, 7)        # sizes a None dim is traced at (two to fit a * N + c, one to check)
_Ctx = TorchContext       # a translation's context, under the name this module gave it


@dataclass
class TorchExport:
    """An exported model: the PyTorch source, the safetensors weights and what they hold."""

    source: str
    weights: bytes
    class_name: str
    inputs: dict[str, tuple[tuple[int | str, ...], str]]   # name -> (shape, dtype); str = N
    output_shape: tuple[int | str, ...]
    output_dtype: str
    param_names: list[str]
    size_name: str | None = None       # the name of the None dim in the source (e.g. "B")
    path: Path | None = None
    weights_path: Path | None = None

    def __repr__(self) -> str:
        """One line: the class, inputs and output with dtype and shape (the size name for a
        None dim), how many params, source lines and weight bytes, where they were written;
        never the weights or the source themselves (``print(ex.source)`` shows the code)."""
        inputs = describe.mapping({n: describe.shape(s, d) for n, (s, d) in self.inputs.items()})
        where = f", written to {str(self.path)!r}" if self.path is not None else ", not saved"
        return (f"<TorchExport {self.class_name}: inputs {inputs} -> "
                f"{describe.shape(self.output_shape, self.output_dtype)}, "
                f"{describe.count(len(self.param_names), 'param tensor')}, source "
                f"{describe.count(self.source.count(chr(10)) + 1, 'line')}, weights "
                f"{describe.byte_size(len(self.weights))} (safetensors){where}>")

    def save(self, path: str | Path, weights_path: str | Path | None = None) -> TorchExport:
        """Write the source to `path` and the weights beside it (suffix ``.safetensors``)."""
        self.path = Path(path)
        self.weights_path = (Path(weights_path) if weights_path is not None
                             else self.path.with_suffix(".safetensors"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.source)
        self.weights_path.write_bytes(self.weights)
        return self

    def load(self) -> Any:
        """The exported class instantiated with the weights loaded (needs torch)."""
        import importlib.util
        import sys
        import tempfile

        from safetensors.torch import load as load_bytes

        path = self.path
        if path is None:
            path = Path(tempfile.mkdtemp(prefix="tg_export_")) / "exported_model.py"
            path.write_text(self.source)
        name = f"tg_export_{path.stem}_{abs(hash(self.source)) % 10**8}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        model = getattr(module, self.class_name)()
        model.load_state_dict(load_bytes(self.weights))
        return model


def _is_handle(obj: Any) -> bool:
    return not isinstance(obj, Module) and callable(getattr(obj, "download_params", None))


def export_torch(model_or_handle: Any, *, inputs: Mapping[str, Any] | None = None,
                 forward: Callable[..., Tensor] | None = None, path: str | Path | None = None,
                 weights_path: str | Path | None = None, params: Mapping[str, Any] | None = None,
                 seed: int = 0, class_name: str | None = None, model: Module | None = None,
                 probes: Sequence[int] = PROBES) -> Any:
    """Export to PyTorch (see the module docstring).

    model_or_handle: a ``tg.Module`` (returns a :class:`TorchExport`), or a training/forward
    handle (``tg.compile`` / ``compile_forward`` / ``attach``; returns an awaitable: its
    weights are downloaded). inputs: ``{name: shape | (shape, dtype)}`` with at most one None
    dim per input (a forward handle's own declaration by default). forward: ``fn(model,
    **inputs) -> Tensor`` (default: ``model(**inputs)``; a forward handle's own function).
    path: write the source there and the weights beside it. params: ``{name: array}`` for a
    Module (default: its init from `seed`). class_name: the top class (default: the model's
    class name). model: the Module of a handle (default: the handle's)."""
    if _is_handle(model_or_handle):
        return _export_handle(model_or_handle, inputs=inputs, forward=forward, path=path,
                              weights_path=weights_path, class_name=class_name, model=model,
                              probes=probes)
    if not isinstance(model_or_handle, Module):
        raise ExportError(f"expected a tg.Module or a training/forward handle, got "
                          f"{type(model_or_handle).__name__}")
    if inputs is None:
        raise ExportError("inputs are required for a Module: {name: shape | (shape, dtype)}, "
                          "e.g. {'x': (None, 1)} (None: any size there)")
    root = model_or_handle
    values = dict(params) if params is not None else root.init_params(seed)
    return _export(root, forward, inputs, values, path, weights_path, class_name, probes)


async def _export_handle(handle: Any, *, inputs: Any, forward: Any, path: Any,
                         weights_path: Any, class_name: Any, model: Any, probes: Any
                         ) -> TorchExport:
    model = model if model is not None else getattr(handle, "_model", None)
    if not isinstance(model, Module):
        raise ExportError(f"cannot find the tg.Module of this {type(handle).__name__} handle; "
                          "pass model=... (the Module it was compiled from)")
    if forward is None:
        forward = getattr(handle, "_forward", None)
    if inputs is None:
        inputs = getattr(handle, "_input_decls", None) if forward is not None else None
    if inputs is None:
        raise ExportError("inputs are required to export a training handle (its loss inputs "
                          "are not the forward's): {name: shape | (shape, dtype)}")
    values = await handle.download_params()
    return _export(model, forward, inputs, values, path, weights_path, class_name, probes)


def forward_ops() -> list[str]:
    """Op kinds that can appear in a traced forward (everything but backward/optimizer ops)."""
    import tensorgrad.ops  # noqa: F401  (fills the op table)

    return sorted(name for name, op in OPS.items() if op.vjp != GRAD_ERROR)


def translatable_ops() -> list[str]:
    """Op kinds the exporter writes as torch code (those with a translation in the op table)."""
    import tensorgrad.ops  # noqa: F401  (fills the op table)

    return sorted(name for name, op in OPS.items() if op.torch is not None)


def _default_forward(model: Module, **inputs: Tensor) -> Tensor:
    return model(**inputs)


def _export(root: Module, forward: Callable[..., Tensor] | None, inputs: Mapping[str, Any],
            values: Mapping[str, Any], path: Any, weights_path: Any, class_name: str | None,
            probes: Sequence[int]) -> TorchExport:
    import tensorgrad.ops  # noqa: F401

    from ..trace import normalize_inputs

    fwd = forward or _default_forward
    decls = {k: (d.shape, d.dtype) for k, d in
             normalize_inputs(inputs, wildcards=True, op="export.torch").items()}
    probed = trace_probes(root, fwd, decls, probes)
    first, size_name = probed.first, probed.size_name
    an = Analysis(first, probed.shapes, probed.attrs, size_name, fwd, list(decls))
    for n in first.graph.nodes:
        if n.id in an.live and n.op not in ("param", "input") and (
                n.op not in OPS or OPS[n.op].torch is None):
            raise unsupported(n)
    specs = dict(root.named_params())
    source, root_name = _source(root, an, specs, class_name, decls, path)
    weights = _weights(specs, values, root_name)
    out_shape = tuple(d.render(size_name or "") if isinstance(d, Sym) else d
                      for d in an.shapes[first.out])
    ex = TorchExport(
        source=source, weights=weights, class_name=root_name,
        inputs={k: (tuple(size_name if d is None else d for d in s), dt)  # type: ignore
                for k, (s, dt) in decls.items()},
        output_shape=out_shape, output_dtype=first.graph[first.out].dtype,
        param_names=list(specs), size_name=size_name)
    if path is not None:
        ex.save(path, weights_path)
    return ex


def _source(root: Module, an: Analysis, specs: Mapping[str, Any], class_name: str | None,
            decls: Mapping[str, Any], path: Any) -> tuple[str, str]:
    """The module's source (docstring, imports, helpers, classes) and the root class name."""
    forwards = Forwards(an, decls)
    groups = Grouper(an, specs, class_name).group(forwards.decide())
    root_group = an.root.group
    root_forward = forwards.root_forward()
    writer = ClassWriter(specs)
    class_texts = [writer.text(g, root_forward if g is root_group else g.forward)
                   for g in groups]
    helpers = [HELPERS[h].strip("\n") for h in sorted(forwards.helpers)]
    imports = ["import math", ""] if writer.uses_math else []
    imports += ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
    parts = [_header(root, root_group.name, an, forwards.doc(), path), "\n".join(imports)]
    if helpers:
        parts.append("\n\n\n".join(helpers))
    parts += class_texts
    return "\n\n\n".join(parts) + "\n", root_group.name


def _header(root: Module, root_name: str, an: Analysis, forward_doc: str, path: Any) -> str:
    from ..version import __version__

    stem = Path(path).stem if path is not None else "exported_model"
    title = (f'"""PyTorch port of {type(root).__name__}, written by tensorgrad {__version__} '
             "(tg.export.torch).")
    lines = [title, "",
             "    from safetensors.torch import load_file",
             f"    from {stem} import {root_name}", "",
             f"    model = {root_name}()",
             f'    model.load_state_dict(load_file("{stem}.safetensors"))',
             f"    out = model({', '.join(an.input_names)})", "",
             f"forward: {forward_doc}."]
    if an.size_name:
        lines.append(f"{an.size_name} is the dim declared None at export; every other size is "
                     "the traced one.")
    lines += ["Param names and layouts are tensorgrad's (Linear.W is [in, out]: y = x @ W + b,",
              'the transpose of torch.nn.Linear.weight)."""']
    return "\n".join(lines)


def _weights(specs: Mapping[str, Any], values: Mapping[str, Any], class_name: str) -> bytes:
    from ..hostdata import to_bytes
    from ..safetensors import save_safetensors
    from ..version import __version__

    missing = [n for n in specs if n not in values]
    if missing:
        raise ExportError(f"no values for param(s) {missing}")
    tensors = {}
    for name, spec in specs.items():
        if spec.dtype != "f32":
            raise ExportError(f"param '{name}' is {spec.dtype}: the weights file holds f32 "
                              "params only", op="param")
        raw = to_bytes(f"param '{name}'", values[name], spec.shape, spec.dtype, param=True)
        tensors[name] = memoryview(bytes(raw)).cast("f", list(spec.shape))
    return save_safetensors(tensors, metadata={"format": "pt", "exporter": "tensorgrad",
                                               "tensorgrad": __version__,
                                               "class": class_name})
