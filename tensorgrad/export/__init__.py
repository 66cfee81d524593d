"""Exporters: a tensorgrad model as source code for another framework.

``tg.export.torch(model_or_handle, inputs=..., path=...)`` writes a PyTorch ``nn.Module``
file and its weights (safetensors); see :mod:`tensorgrad.export.pytorch`.
"""

from .pytorch import ExportError, TorchExport, forward_ops, translatable_ops
from .pytorch import export_torch as torch

__all__ = ["ExportError", "TorchExport", "forward_ops", "torch", "translatable_ops"]
