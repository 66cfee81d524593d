"""`Module`: a container of params and child modules with stable dotted names.

Declare params in ``__init__`` with ``self.param(shape, ...)`` (it returns a placeholder) and
keep child modules as attributes, or inside lists, tuples and dicts. Names are dotted paths:
``blocks.0.attn.q.W``.

Order. Params are visited depth first, in attribute definition order (the order attributes
were first assigned, i.e. ``vars(module)``), lists and tuples by index, dicts in insertion
order. That order is ``param_names()``, the order the init generator is consumed and the order
of upload/download records. A param or module reachable twice (weight tying, a child's
reference back to its parent) is visited once, under its first name; a list, tuple or dict of
modules that contains itself is a ValueError naming its attribute path.

Tracing never touches the user's object: :func:`materialize` clones the module tree and puts
a ``param`` leaf tensor where each placeholder was, on the clone only.

Freezing. ``module.freeze()`` marks every param under `module` frozen (``freeze(False)``
trainable again); the latest call wins: it clears the marks of the modules below it. A
training step derives no gradient for a frozen param, and its optimizer neither updates it nor
keeps state for it (no weight decay either); it is still a param (``upload_params``,
``download_params``, attached forwards). A param reached both under a frozen module and under
a trainable one (weight tying) is an error; a child's reference back to its parent is not such
a path (the parent's params are frozen or not as the parent's own path says).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, cast

from . import init as _init
from .errors import ShapeError, TraceError, user_call_site
from .init import ParamSpec
from .ir import DType
from .tensor import Tensor, is_tracing, leaf

__all__ = ["Module", "Param", "ParamSpec", "materialize"]

PARAM_DTYPES = ("f32", "i32")
FROZEN = "_tg_frozen"  # the attribute Module.freeze sets on the module it is called on


@dataclass(frozen=True, eq=False)
class Param:
    """A param placeholder (compared by identity): what `Module.param` returns.

    It becomes a `param` leaf Tensor on the traced clone; using it as a tensor outside of a
    trace is an error."""

    shape: tuple[int, ...]
    dtype: DType
    init: _init.InitSpec
    decay: bool
    fan_in: int
    decay_set: bool = False  # decay was given (else: default_decay's, the filter decides)

    def __repr__(self) -> str:
        return (f"Param(shape={list(self.shape)}, dtype={self.dtype}, init={self.init!r}, "
                f"decay={self.decay})")

    def _misuse(self, *_: Any) -> Any:
        raise TraceError(f"{self!r} is a param placeholder, not a tensor: params become "
                         "tensors only inside tg.trace / tg.compile (use the module passed to "
                         "your loss/forward function, not the original one)")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _misuse
    __truediv__ = __rtruediv__ = __matmul__ = __rmatmul__ = __neg__ = _misuse


class Module:
    """Base class of models and layers. Subclasses set params and children in `__init__`
    (no `super().__init__()` needed) and compute in `forward`; `layer(x)` calls `forward`."""

    def param(self, shape: Sequence[int], init: _init.InitSpec | None = None,
              decay: bool | None = None, dtype: DType = "f32",
              fan_in: int | None = None) -> Tensor:
        """Declare a param (call in `__init__`, assign the result to an attribute).

        It returns a :class:`Param` placeholder, typed as the Tensor it becomes: `forward`
        only ever sees it as one (on the traced clone of the module).

        init: an init spec (default `init.randn(0.02)`); decay: weight decay flag (default:
        on unless init is zeros/ones, and an optimizer's `decay_filter` other than True
        decides instead; a flag given here wins over the filter); fan_in: for
        `init.kaiming` (default `init.default_fan_in(shape)`: `shape[0]` up to rank 2,
        `prod(shape[1:])` above)."""
        where = type(self).__name__
        if is_tracing():
            site = user_call_site()
            raise TraceError(
                f"{where}.param({_fmt_shape(shape)}) was called while tracing: params must be "
                f"declared in __init__, not created inside forward/loss (build the module, "
                f"and any sub-module, before calling tg.trace / tg.compile)"
                + (f"\n  at {site.splitlines()[0]}" if site else ""))
        op = f"{where}.param"
        if isinstance(shape, int):
            shape = (shape,)
        try:
            shape = tuple(shape)
        except TypeError:
            raise ShapeError(op, f"shape must be a sequence of positive ints, got {shape!r}")
        if any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in shape):
            raise ShapeError(op, f"shape must be a sequence of positive ints, got {list(shape)}")
        if dtype not in PARAM_DTYPES:
            raise ShapeError(op, f"dtype must be one of {PARAM_DTYPES}, got {dtype!r}")
        spec = _init.DEFAULT if init is None else init
        if decay is not None and not isinstance(decay, bool):
            raise ShapeError(op, f"decay must be True, False or None, got {decay!r}")
        if fan_in is None:
            fan_in = _init.default_fan_in(shape)
        elif isinstance(fan_in, bool) or not isinstance(fan_in, int) or fan_in <= 0:
            raise ShapeError(op, f"fan_in must be a positive int, got {fan_in!r}")
        _init.check_spec(spec, shape, dtype, op, fan_in)
        placeholder = Param(shape, dtype, spec,
                            _init.default_decay(spec) if decay is None else decay, fan_in,
                            decay_set=decay is not None)
        return cast(Tensor, placeholder)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The computation: subclasses define it (``layer(x)`` calls it). It runs only while
        tracing, on a copy of the module whose params are tensors."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def named_params(self) -> dict[str, ParamSpec]:
        """{dotted name: ParamSpec} in traversal order (see the module docstring)."""
        return {name: _spec(name, p) for name, p in _params(self)}

    def param_names(self) -> list[str]:
        """The dotted param names, in traversal order (see the module docstring)."""
        return [name for name, _ in _params(self)]

    def freeze(self, frozen: bool = True) -> Self:
        """Freeze every param of this module and the modules under it (`frozen=False`: make
        them trainable again), overriding earlier calls on those modules. A training step
        leaves frozen params as they are: no gradient, no optimizer update or state. Returns
        the module (``model.features.freeze()`` in `__init__`, or on a built model)."""
        if not isinstance(frozen, bool):
            raise TypeError(f"{type(self).__name__}.freeze(frozen={frozen!r}): frozen must be "
                            "True or False")
        for module in _walk(self).modules:
            vars(module).pop(FROZEN, None)
        vars(self)[FROZEN] = frozen
        return self

    def frozen_param_names(self) -> list[str]:
        """The names of the frozen params (see :meth:`freeze`), in `param_names()` order."""
        return [name for name, _, frozen in _walk(self).checked() if frozen]

    def init_params(self, seed: int) -> dict[str, Any]:
        """Initial values ({name: flat array}) as a trace with this seed would produce."""
        return _init.init_params(self.named_params(), seed)

    def __repr__(self) -> str:
        children = [f"{k}={type(v).__name__}" for k, v in vars(self).items()
                    if isinstance(v, Module)]
        return f"{type(self).__name__}({', '.join(children)})"


def _fmt_shape(shape: Any) -> str:
    try:
        return str(list(shape))
    except TypeError:
        return repr(shape)


def _spec(name: str, p: Param) -> ParamSpec:
    return ParamSpec(name, p.shape, p.dtype, p.init, p.decay, p.fan_in, p.decay_set)


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, Module):
        yield from vars(obj).items()
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield str(i), v
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield str(k), v


def _holds_params(obj: Any, path: frozenset[int] = frozenset()) -> bool:
    if isinstance(obj, (Param, Module)):
        return True
    if not isinstance(obj, (list, tuple, dict)) or id(obj) in path:
        return False  # a container cycle (reported by _walk) holds nothing new
    inner = path | {id(obj)}
    return any(_holds_params(v, inner) for _, v in _children(obj))


def _cycle_error(root: Module, prefix: str, key: str, value: Any, where: dict[int, str]
                 ) -> ValueError:
    kind = type(value).__name__
    first = where[id(value)] or "the model"
    return ValueError(
        f"{type(root).__name__}: '{prefix}.{key}' is the {kind} '{first}' again, which "
        f"contains itself: a reference cycle through lists, tuples and dicts has no finite "
        f"param names (a module may refer back to a module; a container may not contain "
        f"itself); keep layers in a plain list or dict")


@dataclass
class _Tree:
    """What one walk of a module tree finds (:func:`_walk`)."""

    params: list[tuple[str, Param, bool]] = field(default_factory=list)  # (name, p, frozen)
    modules: list[Module] = field(default_factory=list)  # the root and those under it, once
    conflict: TraceError | None = None  # the first tied param frozen on one path only

    def checked(self) -> list[tuple[str, Param, bool]]:
        """`params`, or the conflict raised."""
        if self.conflict is not None:
            raise self.conflict
        return self.params


def _tie_error(name: str, was: bool, prefix: str, frozen: bool) -> TraceError:
    state = ("frozen", "trainable")
    return TraceError(
        f"param '{name}' is {state[not was]} but is also reached as '{prefix}', where it is "
        f"{state[not frozen]} (the same param in two places, e.g. tied weights): freeze it in "
        "both places or in neither")


def _walk(root: Module) -> _Tree:
    """The one walk of the tree under `root`, in the order of the module docstring: each param
    once, under its first name, with whether it is frozen (as the nearest module marked by
    `freeze` on that path says; not frozen without one), and each module once.

    A module reached again under the other frozen state is walked again, to find a tied param
    frozen on one path and trainable on another (`conflict`); a reference back to a module
    the walk is inside of adds nothing (that module's params are named, and frozen or not, by
    its own path). ValueError naming the attribute path of a list/tuple/dict that contains
    itself."""
    tree = _Tree()
    first: dict[int, tuple[str, bool]] = {}  # param id -> (its name, frozen)
    seen: set[tuple[int, bool]] = set()      # (module id, frozen) walked
    open_: dict[int, str] = {}               # modules and containers on the path: id -> name

    def walk(obj: Any, prefix: str, frozen: bool) -> None:
        if isinstance(obj, Param):
            if id(obj) not in first:
                first[id(obj)] = (prefix, frozen)
                tree.params.append((prefix, obj, frozen))
            elif first[id(obj)][1] != frozen and tree.conflict is None:
                tree.conflict = _tie_error(*first[id(obj)], prefix, frozen)
            return
        if isinstance(obj, Module):
            frozen = vars(obj).get(FROZEN, frozen)
            if id(obj) in open_ or (id(obj), frozen) in seen:
                return
            if (id(obj), not frozen) not in seen:
                tree.modules.append(obj)
            seen.add((id(obj), frozen))
        open_[id(obj)] = prefix
        for key, value in _children(obj):
            if isinstance(value, (list, tuple, dict)):
                if not _holds_params(value):
                    continue  # plain data (even a self-referencing one) is not walked
                if id(value) in open_:
                    raise _cycle_error(root, prefix, key, value, open_)
            if isinstance(value, (Param, Module, list, tuple, dict)):
                walk(value, f"{prefix}.{key}" if prefix else key, frozen)
        del open_[id(obj)]

    walk(root, "", False)
    return tree


def _params(root: Module) -> list[tuple[str, Param]]:
    """(dotted name, Param) in traversal order (see :func:`_walk` for its errors)."""
    return [(name, p) for name, p, _ in _walk(root).checked()]


def _clone(obj: Any, prefix: str, memo: dict[int, Any],
           on_param: Callable[[str, Param], Any]) -> Any:
    """Copy of the module tree under `obj`, with each Param replaced by `on_param(name, p)`.

    Modules become fresh instances of the same class (attributes copied, children cloned);
    lists/tuples/dicts holding params or modules are rebuilt; everything else is shared."""
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, Param):
        new = on_param(prefix, obj)
        memo[id(obj)] = new
        return new

    def sub(key: str, value: Any) -> Any:
        if not _holds_params(value):
            return value
        return _clone(value, f"{prefix}.{key}" if prefix else key, memo, on_param)

    if isinstance(obj, Module):
        new = object.__new__(type(obj))
        memo[id(obj)] = new
        for key, value in vars(obj).items():
            object.__setattr__(new, key, sub(key, value))
        return new
    if isinstance(obj, list):
        new_list: list[Any] = []
        memo[id(obj)] = new_list
        new_list.extend(sub(str(i), v) for i, v in enumerate(obj))
        return new_list
    if isinstance(obj, tuple):
        items = [sub(str(i), v) for i, v in enumerate(obj)]
        new_t = type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
        memo[id(obj)] = new_t
        return new_t
    if isinstance(obj, dict):
        new_d = type(obj)() if type(obj) is not dict else {}
        memo[id(obj)] = new_d
        for k, v in obj.items():
            new_d[k] = sub(str(k), v)
        return new_d
    return obj


def clone(model: Module) -> Module:
    """A structural copy of `model` sharing its placeholders (the original is untouched)."""
    return _clone(model, "", {}, lambda name, p: p)


def materialize(model: Module) -> tuple[Module, dict[str, ParamSpec], dict[str, Tensor]]:
    """Inside a trace: clone `model`, creating one `param` leaf per placeholder, in order.

    Returns (clone, {name: ParamSpec}, {name: Tensor})."""
    if not isinstance(model, Module):
        raise TraceError(f"the model must be a tg.Module instance, got {type(model).__name__}")
    order = _params(model)
    names = {id(p): name for name, p in order}
    specs = {name: _spec(name, p) for name, p in order}
    tensors: dict[str, Tensor] = {name: leaf("param", name, p.shape, p.dtype)
                                  for name, p in order}
    copy = _clone(model, "", {}, lambda _name, p: tensors[names[id(p)]])
    return copy, specs, tensors
