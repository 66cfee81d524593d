"""What `step` and `run` return: Completed, Aborted or Failed — never an exception.

    match await train.step(x=x, y=y):
        case tg.Completed(loss=loss): ...
        case tg.Aborted(): ...
        case tg.Failed(error=err): ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from . import describe

if TYPE_CHECKING:
    from .hostdata import HostArray


class Captures(dict[str, "HostArray"]):
    """Captured tensors of one step or run, by name: {name: array}."""

    def __getitem__(self, name: str) -> Any:
        if name not in self:
            raise KeyError(f"no capture named {name!r}; captured: {sorted(self)}")
        return super().__getitem__(name)

    def names(self) -> list[str]:
        """The capture names, sorted."""
        return sorted(self)

    def __repr__(self) -> str:
        """``Captures({pred: f32[2, 2]})``: names with dtype and shape, never the values of a
        big array."""
        return f"Captures({describe.arrays(self)})"


@dataclass(frozen=True)
class Completed:
    """A finished call: `loss` (a float) for `step`, `output` (an array) for `run`.

    `skipped`: under ``precision="mixed"``, the step's scaled gradients overflowed f16, so
    its update was skipped (params and optimizer state unchanged) and the loss scale backed
    off, as ``torch.cuda.amp.GradScaler`` does; a normal event of loss scaling, counted in
    ``train.skipped_steps``. Always False in f32, where a non-finite gradient is a Failed."""

    loss: float | None = None
    output: Any = None
    captures: Captures = field(default_factory=Captures)
    kind: Literal["completed"] = "completed"
    skipped: bool = False

    def __repr__(self) -> str:
        """``Completed(loss=0.00912)`` for a step, ``Completed(output=f32[1, 1] [0.4794])`` for a
        run; captures by name, dtype and shape."""
        parts = []
        if self.loss is not None:
            parts.append(f"loss={self.loss:.6g}")
        if self.output is not None:
            parts.append(f"output={describe.array(self.output)}")
        if self.captures:
            parts.append(f"captures={describe.arrays(self.captures)}")
        if self.skipped:
            parts.append("skipped=True")
        return f"Completed({', '.join(parts)})"


@dataclass(frozen=True)
class Aborted:
    """The graph was replaced (`replace_model`) or destroyed while the call was pending."""

    kind: Literal["aborted"] = "aborted"

    def __repr__(self) -> str:
        return "Aborted()"


@dataclass(frozen=True)
class Failed:
    """The call failed; `error` says why (a bad input, a NaN loss, a device error...)."""

    error: BaseException
    kind: Literal["failed"] = "failed"

    @property
    def message(self) -> str:
        """The error's text, ``str(error)``."""
        return str(self.error)

    def __repr__(self) -> str:
        """``Failed(error=ShapeError('step: input ...'))``, a very long message cut short."""
        return f"Failed(error={type(self.error).__name__}({describe.clip(self.message)!r}))"


Result = Completed | Aborted | Failed
"""What ``step`` and ``run`` return (match it against the three classes)."""
