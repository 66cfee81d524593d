"""Param initializers (plain data) and the seeded generator that realizes them.

Specs: :func:`randn`, :func:`kaiming`, :func:`zeros`, :func:`ones`, :func:`literal` (frozen
dataclasses). A :class:`ParamSpec` is a named param: shape, dtype, init spec, decay, fan-in.

Values come from one Mulberry32 stream (seeded with the trace seed) consumed in param order:
``randn``/``kaiming`` take two uniforms per element (Box–Muller, cosine branch, ``u1`` clamped
at 1e-10, computed in double and stored as f32); ``zeros``/``ones``/``literal`` take none.
This matches the TypeScript library bit for bit. NumPy is optional: without it values come
back as ``array('f')`` (``array('i')`` for i32 params); with it the same values are computed
vectorized (Mulberry32 is counter based) and still returned as ``array``, which
``numpy.asarray`` reads without a copy.
"""

from __future__ import annotations

import math
import secrets
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from .errors import ShapeError
from .ir import DType

__all__ = [
    "InitSpec",
    "Kaiming",
    "Literal",
    "Mulberry32",
    "Ones",
    "ParamSpec",
    "Randn",
    "Zeros",
    "default_decay",
    "default_fan_in",
    "generate",
    "init_params",
    "kaiming",
    "literal",
    "ones",
    "randn",
    "random_seed",
    "zeros",
]

MASK32 = 0xFFFFFFFF
GOLDEN = 0x6D2B79F5
U1_MIN = 1e-10
MAX_NORMAL = math.sqrt(-2.0 * math.log(U1_MIN))  # the largest |z| Box–Muller makes here
F32_MAX = 3.4028234663852886e38


# ---- specs -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Randn:
    """Normal values with standard deviation `scale`."""

    scale: float = 0.02
    kind = "randn"



@dataclass(frozen=True)
class Kaiming:
    """Normal values with std `gain / sqrt(fan_in)`; the param supplies `fan_in`."""

    gain: float = math.sqrt(2.0)
    kind = "kaiming"



@dataclass(frozen=True)
class Zeros:
    """All zeros (what :func:`zeros` returns)."""

    kind = "zeros"



@dataclass(frozen=True)
class Ones:
    """All ones (what :func:`ones` returns)."""

    kind = "ones"



@dataclass(frozen=True)
class Literal:
    """Exactly these values (row-major); the count must equal the param's element count."""

    values: tuple[float, ...]
    kind = "literal"



InitSpec = Randn | Kaiming | Zeros | Ones | Literal
"""Any init spec."""
DEFAULT = Randn()  # the init of a param declared without one


@dataclass(frozen=True)
class ParamSpec:
    """A named param: shape, dtype, init spec, weight-decay flag and fan-in. Plain data.
    `decay_set`: the flag was given (``Module.param(decay=...)``, a layer's ``decay=``);
    otherwise it is :func:`default_decay`'s, and an optimizer's ``decay_filter`` decides."""

    name: str
    shape: tuple[int, ...]
    dtype: DType = "f32"
    init: InitSpec = DEFAULT
    decay: bool = True
    fan_in: int = 1
    decay_set: bool = False

    @property
    def size(self) -> int:
        """How many values the param holds (the product of its shape)."""
        return prod(self.shape)


def randn(scale: float = 0.02) -> Randn:
    """Normal init with std `scale` (the default for every weight)."""
    return Randn(float(scale))


def kaiming(gain: float = math.sqrt(2.0)) -> Kaiming:
    """Normal init with std `gain / sqrt(fan_in)` (fan_in: Linear `in`, Conv2d `in/g·kH·kW`)."""
    return Kaiming(float(gain))


def zeros() -> Zeros:
    """All zeros (biases; no weight decay by default)."""
    return Zeros()


def ones() -> Ones:
    """All ones (norm gains; no weight decay by default)."""
    return Ones()


def literal(values: Iterable[float]) -> Literal:
    """Init from given values (any flat iterable or array; nested lists are flattened)."""
    if hasattr(values, "tolist"):  # numpy arrays, without importing numpy
        values = values.tolist()
    return Literal(tuple(float(v) for v in _flatten(values)))


def _flatten(values: Any) -> Iterable[Any]:
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flatten(v)
        else:
            yield v


def default_decay(spec: InitSpec) -> bool:
    """Weight decay unless said otherwise: on for randn/kaiming/literal, off for zeros/ones."""
    return not isinstance(spec, (Zeros, Ones))


def default_fan_in(shape: Sequence[int]) -> int:
    """Fan-in when a param does not declare one.

    rank 0: 1; rank 1 and 2: ``shape[0]`` (weights are ``[in, out]``, as in Linear);
    rank ≥ 3: ``prod(shape[1:])`` (convolution layout ``[out, in/groups, *kernel]``)."""
    if not shape:
        return 1
    if len(shape) <= 2:
        return int(shape[0])
    return int(prod(shape[1:]))


def check_spec(spec: Any, shape: Sequence[int], dtype: DType, name: str = "param",
               fan_in: int | None = None) -> None:
    """Raise ShapeError if `spec` cannot initialize a param of `shape`/`dtype`, or would make
    a value that is not a finite f32 (or, for i32, not an i32); `name` names the param."""
    if not isinstance(spec, (Randn, Kaiming, Zeros, Ones, Literal)):
        raise ShapeError(name, f"init must be an init spec (tg.init.randn(), kaiming(), "
                         f"zeros(), ones(), literal(values)), got {spec!r}")
    numel = prod(shape)
    if isinstance(spec, Literal) and len(spec.values) != numel:
        raise ShapeError(name, f"init.literal has {len(spec.values)} values but the param "
                         f"shape {list(shape)} has {numel} elements")
    if dtype != "f32" and isinstance(spec, (Randn, Kaiming)):
        raise ShapeError(name, f"init.{spec.kind} makes floats but the param dtype is "
                         f"{dtype}; use init.zeros(), ones() or literal(values)")
    problem = _nonfinite_problem(spec, dtype, fan_in)
    if problem:
        raise ShapeError(name, problem + ("; params must start finite (a non-finite param "
                                          "makes every loss NaN, whatever the learning rate)"
                                          if dtype == "f32" else ""))


def _nonfinite_problem(spec: InitSpec, dtype: DType, fan_in: int | None) -> str:
    """Why `spec` would make a value that is not a finite f32 (or an i32), or ""."""
    if isinstance(spec, Literal):
        for k, v in enumerate(spec.values):
            if dtype == "f32" and not (math.isfinite(v) and abs(v) <= F32_MAX):
                return (f"init.literal holds {v!r} at flat index {k}, which is not a finite "
                        f"f32 (|v| <= {F32_MAX:.7g})")
            if dtype != "f32" and not (math.isfinite(v) and v == int(v) and
                                       -2**31 <= v < 2**31):
                return (f"init.literal holds {v!r} at flat index {k}, which is not an {dtype} "
                        "(a whole number in -2147483648..2147483647)")
        return ""
    if isinstance(spec, Randn):
        what, std = f"init.randn(scale={spec.scale!r})", spec.scale
    elif isinstance(spec, Kaiming):
        what = f"init.kaiming(gain={spec.gain!r})"
        if not math.isfinite(spec.gain):
            return f"{what} makes non-finite values (the gain must be finite)"
        if fan_in is None or fan_in <= 0:
            return ""
        what, std = f"{what} with fan_in {fan_in}", spec.gain / math.sqrt(fan_in)
    else:
        return ""
    if not math.isfinite(std):
        return f"{what} makes non-finite values (the scale must be finite)"
    if abs(std) * MAX_NORMAL > F32_MAX:
        return (f"{what} makes values up to {abs(std) * MAX_NORMAL:.3g}, beyond f32's range "
                f"({F32_MAX:.3g}): they would be inf")
    return ""


# ---- the generator ---------------------------------------------------------------------

def _mix(t: int) -> int:
    """Mulberry32's output mix of one 32-bit state value (as an unsigned int)."""
    t = ((t ^ (t >> 15)) * (t | 1)) & MASK32
    t ^= (t + (((t ^ (t >> 7)) * (t | 61)) & MASK32)) & MASK32
    return (t ^ (t >> 14)) & MASK32


class Mulberry32:
    """The 32-bit Mulberry32 generator: uniforms in [0, 1), identical to the JS version.

    The state advances by a constant, so the k-th draw is a pure function of (seed, k);
    :meth:`uniforms` uses that to compute many draws at once with NumPy when available."""

    def __init__(self, seed: int):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"Mulberry32 seed must be an int, got {seed!r}")
        self.state = seed & MASK32

    def next_u32(self) -> int:
        """The next 32-bit unsigned draw of the stream."""
        self.state = (self.state + GOLDEN) & MASK32
        return _mix(self.state)

    def random(self) -> float:
        """One uniform in [0, 1)."""
        return self.next_u32() / 4294967296.0

    def uniforms(self, n: int) -> Any:
        """The next `n` uniforms: a float64 NumPy array, or a list without NumPy."""
        np = _numpy()
        if np is None:
            return self._uniforms_list(n)
        k = np.arange(1, n + 1, dtype=np.uint32)
        with np.errstate(over="ignore"):  # uint32 arithmetic wraps mod 2**32, as in JS
            t = k * np.uint32(GOLDEN)
            t += np.uint32(self.state)
            t = (t ^ (t >> np.uint32(15))) * (t | np.uint32(1))
            t = t ^ (t + (t ^ (t >> np.uint32(7))) * (t | np.uint32(61)))
            t = t ^ (t >> np.uint32(14))
        self.state = (self.state + n * GOLDEN) & MASK32
        return t.astype(np.float64) / 4294967296.0

    def _uniforms_list(self, n: int) -> list[float]:
        """:meth:`uniforms` in pure Python: :func:`_mix` written out in one loop (in Pyodide,
        without NumPy, a function call per draw made this most of a compile's Python time)."""
        out = [0.0] * n
        t0 = self.state
        for i in range(n):  # every value stays below 2**32 (the masks _mix needs no more)
            t0 = (t0 + GOLDEN) & MASK32
            t = ((t0 ^ (t0 >> 15)) * (t0 | 1)) & MASK32
            t ^= (t + (t ^ (t >> 7)) * (t | 61)) & MASK32
            out[i] = (t ^ (t >> 14)) / 4294967296.0
        self.state = t0
        return out

    def normals(self, n: int, std: float) -> array[float]:
        """`n` Box–Muller samples times `std`, as f32 (two uniforms per sample)."""
        np = _numpy()
        if np is None and FAST_NORMALS is not None and n >= FAST_NORMALS_MIN:
            out = FAST_NORMALS(self.state, n, std)
            self.state = (self.state + 2 * n * GOLDEN) & MASK32
            return out
        u = self.uniforms(2 * n)
        if np is None:
            sqrt, log, cos, two_pi = math.sqrt, math.log, math.cos, 2.0 * math.pi
            return array("f", [sqrt(-2.0 * log(max(U1_MIN, u1))) * cos(two_pi * u2) * std
                               for u1, u2 in zip(u[0::2], u[1::2])])
        u1 = np.maximum(U1_MIN, u[0::2])
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u[1::2])
        return array("f", (z * std).astype(np.float32).tobytes())


def _numpy() -> Any:
    if not USE_NUMPY:
        return None
    try:
        import numpy
    except ImportError:
        return None
    return numpy


USE_NUMPY = True  # tests flip this to exercise the pure-Python path
# Where NumPy is missing, a faster maker of Mulberry32.normals' values when one is installed
# (the browser adapter installs one written in JS, tensorgrad/gpu/browser.py):
# (state, n, std) -> the n f32 values of the stream at `state`, equal to the Python loop's
# to one f32 ulp. Used from FAST_NORMALS_MIN values on (below that the call costs more).
FAST_NORMALS: Callable[[int, int, float], array[float]] | None = None
FAST_NORMALS_MIN = 256


def random_seed() -> int:
    """A fresh 32-bit seed."""
    return secrets.randbits(32)


def generate(spec: InitSpec, shape: Sequence[int], rng: Mulberry32, *, fan_in: int | None = None,
             dtype: DType = "f32", name: str = "param") -> array[Any]:
    """Initial values of one param (flat, row-major), drawing from `rng` as the spec needs."""
    fan = default_fan_in(shape) if fan_in is None else fan_in
    check_spec(spec, shape, dtype, f"param '{name}'" if name != "param" else name, fan)
    n = prod(shape)
    code = "f" if dtype == "f32" else "i"
    if isinstance(spec, Zeros):
        return array(code, bytes(4 * n))
    if isinstance(spec, Ones):
        return array(code, [1] * n)
    if isinstance(spec, Literal):
        if code == "i":
            return array("i", (int(v) for v in spec.values))
        return array("f", spec.values)
    if isinstance(spec, Randn):
        return rng.normals(n, spec.scale)
    if fan <= 0:
        raise ShapeError(name, f"kaiming init needs a positive fan_in, got {fan}")
    return rng.normals(n, spec.gain / math.sqrt(fan))


def init_params(specs: Mapping[str, ParamSpec] | Iterable[ParamSpec], seed: int
                ) -> dict[str, array[Any]]:
    """Initial values for every param, in order, from one Mulberry32(seed) stream.

    `specs`: ParamSpecs (e.g. `model.named_params()` or a trace's `params`). Returns
    {name: flat array('f') (array('i') for i32 params)}; `numpy.asarray(v).reshape(shape)`
    gives an ndarray view."""
    items = specs.values() if isinstance(specs, Mapping) else specs
    rng = Mulberry32(seed)
    return {p.name: generate(p.init, p.shape, rng, fan_in=p.fan_in, dtype=p.dtype, name=p.name)
            for p in items}
