"""Param init in the browser worker: the normal values made in JS (tensorgrad/init.py's
FAST_NORMALS, installed by the browser adapter) are the Python loop's, and the stream goes
on from the same state."""

from __future__ import annotations

import ast

from .conftest import Page

COMPARE = """
import struct
import tensorgrad as tg
from tensorgrad import init
from tensorgrad.init import ParamSpec
await tg.default_device()  # loads the adapter's JS module, which installs the JS normals
fast_fn = init.FAST_NORMALS
# "b" is below FAST_NORMALS_MIN (the Python loop): it reads the stream where "a" left it
specs = [ParamSpec("a", (300, 7)), ParamSpec("b", (5,)),
         ParamSpec("c", (64, 64), init=init.kaiming(), fan_in=64), ParamSpec("d", (1000,))]
rows = []
for seed in (0, 42, 4294967295):
    fast = init.init_params(specs, seed)
    init.FAST_NORMALS = None
    try:
        slow = init.init_params(specs, seed)
    finally:
        init.FAST_NORMALS = fast_fn
    for name in fast:
        a = struct.unpack(f"{len(fast[name])}i", fast[name].tobytes())
        b = struct.unpack(f"{len(slow[name])}i", slow[name].tobytes())
        ulps = [abs(x - y) for x, y in zip(a, b)]
        rows.append((seed, name, len(a), len(b), max(ulps), sum(u > 0 for u in ulps)))
(fast_fn is not None, init._numpy() is None, rows)
"""


def test_normals_made_in_js_are_the_python_loops(tg: Page) -> None:
    """Params of three seeds, made by the JS maker and by the Python loop, agree to one f32
    ulp (JS's log and cos may round a double's last bit unlike the C library's), almost all
    bit for bit, and a param made in between by the Python loop reads the same stream."""
    installed, no_numpy, rows = ast.literal_eval(tg.exec(COMPARE))
    assert installed and no_numpy
    assert len(rows) == 12
    for seed, name, n_fast, n_slow, max_ulps, differing in rows:
        assert n_fast == n_slow, (seed, name)
        assert max_ulps <= 1, (seed, name, max_ulps)
        assert differing <= n_fast // 1000, (seed, name, differing)
