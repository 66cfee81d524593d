"""Exporters: a tensorgrad model as source code for another framework.

``tg.export.torch(model_or_handle, inputs=..., path=...)`` writes a PyTorch ``nn.Module``
file and its weights (safetensors); see :mod:`tensorgrad.export.pytorch`. Each op's
translation lives in the op table (``define(..., torch=...)``); this package traces the
model (:mod:`.tracing`), builds its module tree (:mod:`.tree`), analyses the graph
(:mod:`.analysis`), writes each forward (:mod:`.forwards`, :mod:`.body`) and class
(:mod:`.classes`, :mod:`.classtext`) with the torch runtime helpers (:mod:`.helpers`).
"""

from .pytorch import ExportError, TorchExport, forward_ops, translatable_ops
from .pytorch import export_torch as torch

__all__ = ["ExportError", "TorchExport", "forward_ops", "torch", "translatable_ops"]
