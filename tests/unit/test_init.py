"""Init specs and the Mulberry32 + Box–Muller generator (bit-compatible with the JS library)."""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad import init
from tensorgrad.errors import ShapeError
from tensorgrad.init import ParamSpec

# Produced by the JS reference: mulberry32(seed) uniforms, and Float32Array of
# sqrt(-2 ln max(1e-10,u1)) * cos(2π u2) * 0.02 with two uniforms per sample.
GOLDEN = {
    0: ([0.26642920868471265, 0.0003297457005828619, 0.2232720274478197, 0.1462021479383111,
         0.46732782293111086, 0.5450490827206522],
        [0.03252864629030228, 0.021019916981458664, -0.02368774823844433,
         -0.011688100174069405, -0.021870508790016174]),
    42: ([0.6011037519201636, 0.44829055899754167, 0.8524657934904099, 0.6697340414393693,
          0.17481389874592423, 0.5265925421845168],
         [-0.019123245030641556, -0.005460522137582302, -0.036832544952631,
          -0.022817641496658325, -0.010588675737380981]),
    4294967295: ([0.8964226141106337, 0.189478256739676, 0.7156526781618595,
                  0.9440599093213677, 0.8452364315744489, 0.5391399988438934],
                 [0.0034714797511696815, 0.015359768643975258, -0.011248944327235222,
                  -0.017342057079076767, 0.03985616937279701]),
}


@pytest.fixture(params=[True, False], ids=["numpy", "pure"])
def numpy_mode(request, monkeypatch):
    monkeypatch.setattr(init, "USE_NUMPY", request.param)
    return request.param


@pytest.mark.parametrize("seed", sorted(GOLDEN))
def test_mulberry32_matches_js(seed, numpy_mode):
    uniforms, normals = GOLDEN[seed]
    rng = init.Mulberry32(seed)
    assert [rng.random() for _ in range(3)] == uniforms[:3]
    assert list(rng.uniforms(3)) == uniforms[3:]  # the batched path continues the stream
    values = init.generate(init.randn(0.02), (5,), init.Mulberry32(seed))
    assert isinstance(values, array) and values.typecode == "f"
    assert list(values) == normals


def test_numpy_and_pure_paths_agree(monkeypatch):
    specs = [ParamSpec("a", (37, 5)), ParamSpec("b", (3,), init=init.zeros(), decay=False),
             ParamSpec("c", (4, 4, 3, 3), init=init.kaiming(), fan_in=36)]
    fast = init.init_params(specs, 7)
    monkeypatch.setattr(init, "USE_NUMPY", False)
    slow = init.init_params(specs, 7)
    for k in fast:
        a, b = np.asarray(fast[k]), np.asarray(slow[k])
        # identical up to one f32 ulp (libm vs numpy transcendental rounding)
        np.testing.assert_array_max_ulp(a, b, maxulp=1)


def test_batched_uniforms_continue_the_one_at_a_time_stream(numpy_mode):
    """uniforms(n) (a loop of its own without NumPy, vectorized with it) gives exactly the
    draws random() gives, and leaves the generator where they leave it."""
    one, many = init.Mulberry32(2024), init.Mulberry32(2024)
    expected = [one.random() for _ in range(10_000)]
    assert list(many.uniforms(10_000)) == expected
    assert many.random() == one.random()


def test_same_seed_same_values_different_seed_differs(numpy_mode):
    specs = [ParamSpec("w", (8, 16)), ParamSpec("v", (16,))]
    a, b = init.init_params(specs, 123), init.init_params(specs, 123)
    c = init.init_params(specs, 124)
    assert a["w"] == b["w"] and a["v"] == b["v"]
    assert a["w"] != c["w"]


def test_one_stream_in_param_order():
    # zeros/ones/literal draw nothing; randn draws two uniforms per element, in order
    specs = [ParamSpec("a", (3,)), ParamSpec("z", (4,), init=init.zeros()),
             ParamSpec("l", (2,), init=init.literal([5, 6])), ParamSpec("b", (2,))]
    values = init.init_params(specs, 0)
    assert list(values["a"]) + list(values["b"]) == GOLDEN[0][1]
    assert list(values["z"]) == [0.0] * 4 and list(values["l"]) == [5.0, 6.0]


def test_works_with_numpy():
    values = init.init_params([ParamSpec("w", (4, 3))], 5)["w"]
    arr = np.asarray(values).reshape(4, 3)
    assert arr.dtype == np.float32 and arr.shape == (4, 3)
    assert np.frombuffer(values, dtype=np.float32).tolist() == list(values)


def test_randn_statistics():
    v = np.asarray(init.init_params([ParamSpec("w", (200, 250), init=init.randn(0.1))], 3)["w"])
    assert abs(v.mean()) < 2e-3
    assert abs(v.std() - 0.1) < 2e-3


def _std(layer: tg.Module, name: str) -> float:
    return float(np.asarray(layer.init_params(11)[name]).std())


def test_kaiming_fan_in_linear():
    lin = tg.Linear(400, 300, init=init.kaiming())
    assert lin.named_params()["W"].fan_in == 400
    assert _std(lin, "W") == pytest.approx(math.sqrt(2 / 400), rel=0.02)


def test_kaiming_fan_in_conv2d():
    # fan_in = in/groups * kH * kW (upstream used shape[0] = out channels: wrong for convs)
    conv = tg.Conv2d(32, 64, 3, groups=2, init=init.kaiming(gain=1.0))
    assert conv.named_params()["W"].fan_in == 16 * 9
    assert _std(conv, "W") == pytest.approx(1 / math.sqrt(144), rel=0.03)
    conv = tg.Conv2d(8, 256, (3, 5), init=init.kaiming())
    assert conv.named_params()["W"].fan_in == 8 * 15
    assert _std(conv, "W") == pytest.approx(math.sqrt(2 / 120), rel=0.03)


def test_default_fan_in_for_raw_params():
    assert init.default_fan_in(()) == 1
    assert init.default_fan_in((7,)) == 7
    assert init.default_fan_in((7, 3)) == 7          # [in, out]
    assert init.default_fan_in((16, 4, 3, 3)) == 36  # [out, in, kH, kW]

    class Raw(tg.Module):
        def __init__(self):
            self.w = self.param((64, 8, 3, 3), init=init.kaiming())
            self.v = self.param((10, 20), init=init.kaiming(), fan_in=20)

    specs = Raw().named_params()
    assert specs["w"].fan_in == 72 and specs["v"].fan_in == 20


def test_zeros_ones_literal():
    specs = [ParamSpec("z", (2, 3), init=init.zeros()), ParamSpec("o", (4,), init=init.ones()),
             ParamSpec("l", (2, 2), init=init.literal(np.array([[1.5, -2], [3, 0.25]]))),
             ParamSpec("i", (3,), dtype="i32", init=init.literal([1, 2, 3]))]
    v = init.init_params(specs, 0)
    assert list(v["z"]) == [0.0] * 6 and list(v["o"]) == [1.0] * 4
    assert list(v["l"]) == [1.5, -2.0, 3.0, 0.25]
    assert v["i"].typecode == "i" and list(v["i"]) == [1, 2, 3]


def test_literal_length_must_match():
    class M(tg.Module):
        def __init__(self):
            self.w = self.param((2, 3), init=init.literal([1, 2, 3]))

    with pytest.raises(ShapeError, match=r"literal has 3 values but the param shape \[2, 3\] "
                       r"has 6 elements"):
        M()


def test_float_init_on_i32_param_rejected():
    class M(tg.Module):
        def __init__(self):
            self.w = self.param((2,), dtype="i32")

    with pytest.raises(ShapeError, match="init.randn makes floats but the param dtype is i32"):
        M()


def test_decay_defaults():
    class M(tg.Module):
        def __init__(self):
            self.a = self.param((2,))
            self.b = self.param((2,), init=init.kaiming())
            self.c = self.param((2,), init=init.literal([1, 2]))
            self.d = self.param((2,), init=init.zeros())
            self.e = self.param((2,), init=init.ones())
            self.f = self.param((2,), init=init.zeros(), decay=True)
            self.g = self.param((2,), decay=False)

    decay = {k: p.decay for k, p in M().named_params().items()}
    assert decay == {"a": True, "b": True, "c": True, "d": False, "e": False, "f": True,
                     "g": False}


def test_layer_decay_defaults():
    assert {k: p.decay for k, p in tg.Linear(2, 3).named_params().items()} == \
        {"W": True, "b": False}
    assert {k: p.decay for k, p in tg.Linear(2, 3, decay=False).named_params().items()} == \
        {"W": False, "b": False}
    assert {k: p.decay for k, p in tg.LayerNorm(4).named_params().items()} == \
        {"g": False, "b": False}
    assert {k: p.decay for k, p in tg.LayerNorm(4, decay=True).named_params().items()} == \
        {"g": True, "b": True}


def test_bad_init_argument():
    class M(tg.Module):
        def __init__(self):
            self.w = self.param((2,), init="randn")

    with pytest.raises(ShapeError, match="init must be an init spec"):
        M()


def test_works_without_numpy():
    """The browser may run without NumPy: init and tracing must not need it."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['numpy'] = None\n"
            "import tensorgrad as tg\n"
            "class M(tg.Module):\n"
            "    def __init__(self):\n"
            "        self.l = tg.Linear(3, 5)\n"
            "        self.c = tg.Conv2d(2, 4, 3, init=tg.init.kaiming())\n"
            "t = tg.trace(M(), lambda m, x: tg.mean(m.l(x)), {'x': (2, 3)}, seed=0)\n"
            "v = tg.init.init_params(t.params, t.seed)\n"
            "assert type(v['l.W']).__name__ == 'array' and v['l.W'].typecode == 'f'\n"
            "print(list(v['l.W'])[:5])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert eval(out.stdout) == GOLDEN[0][1]
