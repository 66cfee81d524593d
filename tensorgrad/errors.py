"""Every exception tensorgrad raises on purpose, in one place.

Building a graph: :class:`ShapeError` (a shape, dtype or argument mistake, naming the op and
the user's line), :class:`DeviceLimitError` (a tensor too large for the device),
:class:`TraceError` (misuse of the tracer), :class:`ShaderCompileError` (a kernel's WGSL was
rejected), :class:`PlanError` (an internal inconsistency in a buffer plan),
:class:`FeatureError` (the device lacks an optional feature asked for: ``shader-f16``).
Running it: :class:`AbortError` (the graph was replaced or destroyed meanwhile; ``step`` and
``run`` report it as ``Aborted()``), :class:`DeviceLostError` (the GPU device is gone),
:class:`MainThreadError` (in-process GPU use asked for on a web page's main thread).
Across the worker boundary: :class:`ProtocolError` (a message the protocol table does not
allow) and :class:`RemoteError`, raised on the page for an exception of the
worker, which travels as its class name; :func:`remote_error` maps that name back to the class
above (or the built-in) of that name, so ``except tg.ShapeError`` works on the page too.
Checkpoints: :class:`SafetensorsError` (a malformed safetensors file, or a save that would
write one).
"""

from __future__ import annotations

import builtins
import functools
import os
import sys
import sysconfig
from collections.abc import Sequence
from types import FrameType
from typing import Any

__all__ = ["ERRORS", "AbortError", "DeviceLimitError", "DeviceLostError", "FeatureError",
           "MainThreadError",
           "PlanError", "ProtocolError", "RemoteError", "SafetensorsError", "ShaderCompileError",
           "ShapeError", "TraceError", "error_class", "remote_error", "user_call_site",
           "user_traceback"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    """The standard library's folders (asked on first use: sysconfig is slow to load in
    Pyodide): sysconfig's, and the one `os` was loaded from, which in Pyodide is a zip
    (``/lib/python314.zip/``) that sysconfig does not name."""
    dirs = {os.path.abspath(sysconfig.get_paths()["stdlib"]),
            os.path.dirname(os.path.abspath(os.__file__))}
    return tuple(d + os.sep for d in sorted(dirs))


@functools.cache
def _runtime_dirs() -> tuple[str, ...]:
    """Folders of the runtime's own Python (Pyodide's event loop and FFI), wherever it is
    installed, and of this package."""
    dirs = [_PACKAGE_DIR]
    for name in ("pyodide", "_pyodide", "micropip"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)))
    return tuple(d + os.sep for d in dirs)


def _is_internal(filename: str) -> bool:
    """A frame that is never the user's line: tensorgrad's own, the standard library's
    (asyncio's event loop, ...), Pyodide's (its webloop); installed packages under the
    stdlib folder (site-packages) can be the user's."""
    if filename.startswith(("<frozen", *_runtime_dirs())):
        return True
    return filename.startswith(_stdlib_dirs()) and "-packages" + os.sep not in filename


@functools.lru_cache(maxsize=4096)
def _internal_code(co_filename: str) -> bool:
    """Whether frames running code from `co_filename` are never the user's (asked for every
    frame of every op recorded while tracing: cached, as the folders it checks are)."""
    return co_filename.startswith("<frozen") or _is_internal(os.path.abspath(co_filename))


def user_traceback(exc: BaseException) -> str:
    """`exc` formatted as ``traceback.format_exception`` does, each traceback (chained ones
    too) cut to the user's frames: the internal ones (tensorgrad's, the event loop's,
    Pyodide's; see :func:`_is_internal`) are left out, so the last frame shown is the user's
    line. A traceback with no user frame keeps its tensorgrad frames (a bug to report) and
    loses only the event loop's and Pyodide's."""
    import traceback

    top = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    todo = [top]
    while todo:
        te = todo.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        te.stack = traceback.StackSummary.from_list(_user_frames(list(te.stack)))
        todo += [t for t in (te.__cause__, te.__context__) if t is not None]
        todo += list(getattr(te, "exceptions", None) or ())
    return "".join(top.format())


def _user_frames(frames: list[Any]) -> list[Any]:
    user = [f for f in frames if not _internal_code(f.filename)]
    return user or [f for f in frames if f.filename.startswith(_PACKAGE_DIR + os.sep)]


def user_call_site(limit: int = 3) -> str:
    """The innermost frames outside the tensorgrad package, as 'file:line in func' lines."""
    frame: FrameType | None = sys._getframe(1)
    lines: list[str] = []
    while frame is not None and len(lines) < limit:
        if not _internal_code(frame.f_code.co_filename):
            lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return "\n".join(lines)


# ---- building a graph ----------------------------------------------------------------------

class ShapeError(ValueError):
    """A shape, dtype or argument mistake found while tracing.

    The message names the op, the shapes/dtypes involved and what was expected; `site` holds
    the user's own call site (the innermost frames outside tensorgrad)."""

    def __init__(self, op: str, message: str, site: str | None = None):
        self.op = op
        self.site = user_call_site() if site is None else site
        text = f"{op}: {message}"
        if self.site:
            text += "\n  at " + "\n  at ".join(self.site.splitlines())
        super().__init__(text)


class DeviceLimitError(ShapeError):
    """A tensor (or a kernel's bindings) does not fit the device's limits."""


class TraceError(RuntimeError):
    """Misuse of the tracer: an op outside a trace, nested traces, duplicate names."""


class ShaderCompileError(RuntimeError):
    """A kernel's WGSL failed validation. The message names the kernel (the op) and shows
    the WGSL with line numbers and the shader compiler's messages."""

    def __init__(self, label: str, wgsl: str, messages: Sequence[str]):
        numbered = "\n".join(f"{i + 1:4d} | {line}" for i, line in enumerate(wgsl.splitlines()))
        text = "\n".join(messages) if messages else "(no messages from the compiler)"
        super().__init__(f"WGSL for kernel '{label}' failed to compile:\n{text}\n{numbered}")
        self.label = label
        self.wgsl = wgsl
        self.messages = list(messages)


class FeatureError(RuntimeError):
    """The device lacks an optional WebGPU feature that was asked for (``shader-f16`` for
    ``precision="mixed"``); the message names the feature and the adapter."""


class PlanError(RuntimeError):
    """An internal inconsistency in a buffer plan (lifetime overlap, bad writeback)."""


# ---- running it ----------------------------------------------------------------------------

class AbortError(Exception):
    """The graph was replaced or destroyed while a call was pending (``step``/``run`` return
    ``Aborted()`` for it). The name is the one the page's JS client also uses."""


class DeviceLostError(RuntimeError):
    """The GPU device was lost (driver reset, ``device.destroy()``, a crash): every later call
    on its graphs fails with this; start a new session (or device) to go on."""


class MainThreadError(RuntimeError):
    """In-process GPU use (``tg.compile``, ``tg.compile_forward``, a device) was asked for in a
    Pyodide that runs on a web page's main thread. tensorgrad runs in-process only inside a Web
    Worker (PyScript's ``<script type="py" worker>``, JupyterLite's kernel, a worker of your
    own); on the page, ``tensorgrad.web.start()`` runs it in a dedicated worker."""


# ---- checkpoints ---------------------------------------------------------------------------

class SafetensorsError(ValueError):
    """A safetensors file that the format's rules refuse (see
    :func:`tensorgrad.load_safetensors`), or a save that could not load back as given (a
    name or metadata entry that is not a str). The message names the tensor, when there is
    one, and the rule broken."""


# ---- across the worker boundary ------------------------------------------------------------

class ProtocolError(ValueError):
    """A worker message its protocol table does not allow: an unknown kind, a payload that is
    not an object with the table's fields, or a field of the wrong type; the message names the
    kind, the field, the type expected and the value that came (see
    :mod:`tensorgrad.web.protocol`)."""


class RemoteError(Exception):
    """An exception raised in the worker (or by the JS client): the worker's exception type
    ``name``, its ``message`` (``str(err)``) and its formatted ``remote_traceback``.

    Where ``name`` is a built-in exception or one of tensorgrad's, the instance also derives
    from that class (``except ValueError`` and ``isinstance(err, tg.ShapeError)`` work)."""

    def __init__(self, name: str, message: str, remote_traceback: str = "") -> None:
        Exception.__init__(self, message)  # not super(): the mixed-in class's __init__ differs
        self.name = name
        self.message = message
        self.remote_traceback = remote_traceback
        if remote_traceback:
            self.add_note(f"in tensorgrad's worker:\n{remote_traceback.rstrip()}")

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"RemoteError({self.name}: {self.message!r})"

    def __reduce__(self) -> Any:
        return remote_error, (self.name, self.message, self.remote_traceback)


ERRORS: dict[str, type[Exception]] = {cls.__name__: cls for cls in (
    ShapeError, DeviceLimitError, TraceError, ShaderCompileError, PlanError, AbortError,
    DeviceLostError, MainThreadError, ProtocolError, RemoteError, SafetensorsError,
    FeatureError)}
_REMOTE_CLASSES: dict[str, type[RemoteError]] = {}


def error_class(name: str) -> type[Exception] | None:
    """The tensorgrad or built-in exception class called `name`, if any."""
    cls = ERRORS.get(name) or getattr(builtins, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


def remote_error(name: str, message: str, remote_traceback: str = "") -> RemoteError:
    """A :class:`RemoteError` for the worker's exception `name` (mixed with the local class of
    that name when there is one)."""
    cls = _REMOTE_CLASSES.get(name)
    if cls is None:
        base = error_class(name) if name.isidentifier() else None
        cls = RemoteError
        if base is not None and not issubclass(RemoteError, base):
            try:
                cls = type(name, (RemoteError, base), {"__module__": __name__})
            except TypeError:  # an incompatible instance layout
                cls = RemoteError
        _REMOTE_CLASSES[name] = cls
    try:
        return cls(name, message, remote_traceback)
    except Exception:  # noqa: BLE001 (a base class that refuses these arguments)
        return RemoteError(name, message, remote_traceback)
