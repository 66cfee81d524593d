"""The handles' shared machinery on a native device: one base for Training and Forward,
every param store made by the compiler's stages, host data converted once per call."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad import hostdata
from tensorgrad.compiler import Options, Request, compile_graph
from tensorgrad.handle import Handle
from tests.models import TinyMLP
from tests.native.api_helpers import INPUTS, bits, data, run


class Noisy(TinyMLP):
    """TinyMLP with dropout: its graphs read the PRNG seed input."""

    def forward(self, x: tg.Tensor) -> tg.Tensor:
        return self.l2(tg.dropout(tg.relu(self.l1(x)), 0.25))


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The `what` of every host-data conversion (hostdata.to_bytes, the real one, called
    wherever tensorgrad imported it) while the test runs."""
    seen: list[str] = []
    real = hostdata.to_bytes

    def counted(what: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(what)
        return real(what, *args, **kwargs)
    for name, module in list(sys.modules.items()):
        if name.startswith("tensorgrad") and getattr(module, "to_bytes", None) is real:
            monkeypatch.setattr(module, "to_bytes", counted)
    yield seen


def test_a_step_and_a_run_convert_each_input_once(gpu_device, conversions) -> None:
    """The user's inputs are checked and copied when the call is made, and that is the one
    conversion: the optimizer's hidden scalars and the PRNG seed are packed directly, the
    executable writes the bytes as it gets them."""
    async def go() -> None:
        train = await tg.compile(model=Noisy(), loss=lambda m, x, y: tg.mean(tg.square(m(x) - y)),
                                 inputs=INPUTS, optimizer=tg.optim.AdamW(lr=1e-2), seed=1,
                                 device=gpu_device)
        fwd = await train.attach(forward=lambda m, x: m(x), inputs={"x": (None, 2)})
        await fwd.run(x=data(1, batch=3)["x"])  # compiles the forward's shape first
        conversions.clear()
        for k in range(3):
            assert (await train.step(**data(k))).kind == "completed"
        assert conversions == ["input 'x'", "input 'y'"] * 3
        conversions.clear()
        r = await fwd.run(x=data(2, batch=3)["x"])
        assert r.kind == "completed" and r.output.shape == (3, 1)
        assert conversions == ["input 'x'"]
        train.destroy()

    run(go())


def test_packed_hidden_inputs_step_as_before(gpu_device) -> None:
    """The steps' losses and params equal the reference interpreter's with the hidden inputs
    it is fed as numbers (AdamW's lrt and shrink, several steps)."""
    from tests.models import reference_values, updated_params

    async def go() -> None:
        train = await tg.compile(model=TinyMLP(), loss=lambda m, x, y: tg.mean(tg.square(m(x) - y)),
                                 inputs=INPUTS, optimizer=tg.optim.AdamW(lr=0.05, weight_decay=0.3),
                                 seed=2, device=gpu_device)
        d = data(4)
        params = await train.download_params()
        values = reference_values(train, {**params, **d})
        r = await train.step(**d)
        assert r.kind == "completed"
        np.testing.assert_allclose(r.loss, values[train.ir.outputs[0]], rtol=1e-5)
        want = updated_params(train, values)
        got = await train.download_params()
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7)
        train.destroy()

    run(go())


def test_a_params_request_makes_the_store_through_the_stages(gpu_device) -> None:
    c = compile_graph(Request("params", TinyMLP(), seed=3), Options.for_device(gpu_device))
    try:
        assert c.done == ["trace", "store"] and c.executable is None and not c.graph.nodes
        assert c.store is not None and c.store.names == ["l1.W", "l1.b", "l2.W", "l2.b"]
        assert "param store" in repr(c)
        got = run(c.store.download())
        want = TinyMLP().init_params(3)
        assert {n: np.asarray(v).reshape(-1).tolist() for n, v in got.items()} == \
            {n: list(v) for n, v in want.items()}
    finally:
        assert c.store is not None
        c.store.destroy()

    async def standalone() -> None:  # compile_forward's params are that store's
        fwd = await tg.compile_forward(model=TinyMLP(), forward=lambda m, x: m(x),
                                       inputs={"x": (None, 2)}, device=gpu_device, seed=3)
        assert bits(await fwd.download_params()) == bits(got)
        fwd.destroy()

    run(standalone())


def test_the_store_stage_needs_a_device() -> None:
    with pytest.raises(ValueError, match=r"^compile: the store stage needs a device"):
        compile_graph(Request("params", TinyMLP(), seed=3), Options())


def test_training_and_forward_share_one_handle_base() -> None:
    shared = ("param_names", "param_shapes", "param_count", "upload_params",
              "download_params")
    for cls in (tg.Training, tg.Forward):
        assert issubclass(cls, Handle)
        assert not set(shared) & set(vars(cls)), f"{cls.__name__} repeats {shared}"


def test_compile_forward_refuses_a_model_that_is_no_module_as_compile_does(gpu_device) -> None:
    """The store stage reads the params of a tg.Module only (before: an AttributeError from
    deep inside)."""
    from tensorgrad.errors import TraceError

    async def go() -> None:
        with pytest.raises(TraceError, match=r"^the model must be a tg\.Module instance, got "
                           r"dict"):
            await tg.compile_forward(model={"W": 1}, forward=lambda m, x: x,  # type: ignore
                                     inputs={"x": (2,)}, device=gpu_device)

    run(go())


def test_a_failed_store_stage_gives_up_the_pipelines_started_before_it(gpu_device,
                                                                     monkeypatch) -> None:
    """The pipelines stage starts the kernels' pipelines before the store stage makes the
    params (they compile meanwhile); when the store stage fails, the compilation gives them
    up: the references taken on pipelines a live graph shares are dropped again."""
    from tensorgrad import compiler, runtime

    def loss(m: TinyMLP, x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        return tg.mean(tg.square(m(x) - y))

    def request() -> Request:
        return Request("training", TinyMLP(), loss, INPUTS, optimizer=tg.optim.Adam(lr=1e-2),
                       seed=1)

    live = compile_graph(request(), Options.for_device(gpu_device, tiered=False))
    assert live.executable is not None and live.store is not None
    cache = runtime.pipeline_cache(gpu_device)
    refs = {w: cache.refs[w] for w in live.executable.wgsls}

    def no_store(*args: Any, **kwargs: Any) -> None:
        raise MemoryError("no room for the params")

    monkeypatch.setattr(compiler, "ParamStore", no_store)
    with pytest.raises(MemoryError, match="no room for the params"):
        compile_graph(request(), Options.for_device(gpu_device, tiered=False))
    assert {w: cache.refs.get(w, 0) for w in live.executable.wgsls} == refs
    live.executable.destroy()
    live.store.destroy()
