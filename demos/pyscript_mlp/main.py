"""The PyScript demo: this file runs on the page (PyScript's Pyodide, main thread).

It defines the model (MODEL, run in tensorgrad's worker and also here, for the export),
starts tensorgrad's worker with ``tensorgrad.web.start()``, compiles the training step there,
drives the training loop from here (each ``await train.step(...)`` lets the page run while
the worker computes on the GPU), feeds the losses and the fit to the page's shell (the demos'
shared demos/common/shell.js and plot.js, which index.html builds as ``window.tgShell``),
and exports the trained model to PyTorch (``tg.export.torch``: a .py file and a .safetensors file, offered as
downloads). URL parameters: ``steps`` (most steps, 2000), ``target`` (stop once the mean of
the last 10 losses is below it, 0.01), ``seed`` (1), ``every`` (redraw the fit, 25).

When the run ends, ``window.tgDemo = {done, ok, figures | error}`` (what
``python build.py demo pyscript_mlp`` and the browser test wait for) and ``window.tgFit =
{xs, pred}`` (the last prediction over the plot grid).
"""

import array
import asyncio
import math
import random

import js
from pyodide.ffi import create_proxy, to_js
from pyscript import document

import tensorgrad as tg
import tensorgrad.web

# The model: source text, because it runs in tensorgrad's worker (session.exec); it is also
# executed here so that the page can export it.
MODEL = '''
import tensorgrad as tg

class MLP(tg.Module):
    def __init__(self):
        self.l1 = tg.Linear(1, 64)
        self.l2 = tg.Linear(64, 64)
        self.l3 = tg.Linear(64, 1)

    def forward(self, x):
        return self.l3(tg.relu(self.l2(tg.relu(self.l1(x)))))

def loss_fn(model, x, y):
    return tg.mean(tg.square(model(x) - y))

def predict(model, x):
    return model(x)
'''
BATCH, PLOT_POINTS = 256, 200

STATE = {"stop": False, "train": None, "model_ns": None, "figures": {}}


def now_ms() -> float:
    return float(js.performance.now())


def query() -> dict:
    params = js.URLSearchParams.new(js.location.search)
    cfg = {"steps": 2000, "target": 0.01, "seed": 1, "every": 25}
    for key, value in cfg.items():
        if params.has(key):
            given = float(params.get(key))
            cfg[key] = int(given) if isinstance(value, int) else given
    return cfg


def js_object(value: dict):
    return to_js(value, dict_converter=js.Object.fromEntries)


# ---- the page: the demos' shared shell (demos/common/shell.js), built by index.html as
# window.tgShell; its log, stats, loss chart and fit card are fed from here.

def shell():
    if not hasattr(js.window, "tgShell"):
        raise RuntimeError("window.tgShell is missing: index.html builds it before main.py runs")
    return js.window.tgShell


def log(text: str) -> None:
    shell().log(text)  # the page's log and the console


def show(element_id: str, text: str) -> None:
    document.getElementById(element_id).textContent = text


def draw(fit: dict) -> None:
    """The latest fit ({step, xs, target, pred, mse}): the fit card and its stats."""
    shell().record(js_object({"kind": "eval", **fit}))


# ---- the run -------------------------------------------------------------------------------

async def fit_of(predict, xs: array.array, step: int) -> dict:
    """The model over the plot grid against sin(x): {step, xs, target, pred, mse}."""
    result = await predict.run(x=xs)
    if result.kind != "completed":
        raise RuntimeError(f"predict: {result}")
    out = result.output
    flat = out.tolist() if hasattr(out, "tolist") else list(out)
    pred = [float(v[0] if isinstance(v, list) else v) for v in flat]
    target = [math.sin(x) for x in xs]
    mse = sum((p - t) ** 2 for p, t in zip(pred, target)) / len(pred)
    return {"step": step, "xs": list(xs), "target": target, "pred": pred, "mse": mse}


async def train_and_plot() -> dict:
    cfg = query()
    t_page = now_ms()  # PyScript is up: its Pyodide and the tensorgrad wheel are loaded
    log(f"PyScript ready in {t_page / 1000:.1f} s (tensorgrad {tg.__version__} on the page)")
    show("status", "starting tensorgrad's worker…")
    session = await tensorgrad.web.start(client_url="../../tensorgrad.js")
    t_ready = now_ms()
    worker_s = session.timings.get("totalMs", 0) / 1000
    log(f"ready in {t_ready / 1000:.1f} s (tensorgrad's worker started in {worker_s:.1f} s)")
    await session.exec(MODEL)
    STATE["model_ns"] = {}
    exec(MODEL, STATE["model_ns"])  # noqa: S102 (the same classes on the page, for the export)
    t0 = now_ms()
    train = await session.compile(model="MLP()", loss="loss_fn",
                                  inputs={"x": [BATCH, 1], "y": [BATCH, 1]},
                                  optimizer="tg.optim.Adam(lr=5e-3)", seed=int(cfg["seed"]))
    predict = await train.attach(forward="predict", inputs={"x": [None, 1]})
    compile_ms = now_ms() - t0
    STATE["train"] = train
    log(f"compiled in {compile_ms:.0f} ms: {train.kernel_count} kernels")
    shell().stat("kernels", str(train.kernel_count))
    document.getElementById("stop").disabled = False

    xs = array.array("f", [-math.pi + 2 * math.pi * i / (PLOT_POINTS - 1)
                           for i in range(PLOT_POINTS)])
    rng = random.Random(int(cfg["seed"]))
    losses: list = []
    draw(await fit_of(predict, xs, 0))
    show("status", "training in tensorgrad's worker…")
    js.window.tgTraining = js_object({"start": now_ms()})
    t_train = now_ms()
    reached = None
    while len(losses) < cfg["steps"] and not STATE["stop"]:
        batch_x = [rng.uniform(-math.pi, math.pi) for _ in range(BATCH)]
        result = await train.step(x=array.array("f", batch_x),
                                  y=array.array("f", [math.sin(v) for v in batch_x]))
        if result.kind != "completed":
            raise RuntimeError(f"step {len(losses) + 1}: {result}")
        losses.append(result.loss)
        step = len(losses)
        shell().addLosses(step, to_js([result.loss]))
        recent = losses[-10:]
        if reached is None and len(recent) == 10 and sum(recent) / 10 < cfg["target"]:
            reached = step
        if step % cfg["every"] == 0 or reached == step:
            rate = step / ((now_ms() - t_train) / 1000)
            log(f"step {step:5d}  loss {result.loss:.5f}  {rate:.1f} steps/s")
            shell().stat("rate", f"{rate:.3g}")
            draw(await fit_of(predict, xs, step))
        if reached is not None:
            break
    train_s = (now_ms() - t_train) / 1000
    js.window.tgTraining.end = now_ms()
    fit = await fit_of(predict, xs, len(losses))
    draw(fit)
    pred, fit_mse = fit["pred"], fit["mse"]
    recent = losses[-10:]
    figures = {
        "steps": len(losses), "steps_to_target": reached, "target": cfg["target"],
        "loss": losses[-1], "loss_avg10": sum(recent) / len(recent), "fit_mse": fit_mse,
        "steps_per_s": len(losses) / train_s, "train_s": train_s,
        "pyscript_ready_ms": t_page, "worker_ready_ms": t_ready, "compile_ms": compile_ms,
        "kernels": train.kernel_count, "stopped": STATE["stop"],
    }
    js.window.tgFit = js_object({"xs": fit["xs"], "pred": pred})
    STATE["figures"] = figures
    log(f"done: {len(losses)} steps, loss (last 10) {figures['loss_avg10']:.4f}, "
        f"target {cfg['target']} reached at step {reached}, fit mse {fit_mse:.4f}, "
        f"{figures['steps_per_s']:.1f} steps/s")
    show("status", f"done at step {len(losses)}" + (" (stopped)" if STATE["stop"] else ""))
    document.getElementById("stop").disabled = True
    document.getElementById("export").disabled = False
    return figures


async def export_to_pytorch() -> None:
    """Download the trained weights from the worker, write the PyTorch module here."""
    show("status", "exporting…")
    ns = STATE["model_ns"]
    params = await STATE["train"].download_params()
    ex = tg.export.torch(ns["MLP"](), forward=ns["predict"], inputs={"x": (None, 1)},
                         params=params)
    source = ex.source.replace("exported_model", "mlp_torch")
    for link_id, data, kind in (("dl-py", source.encode(), "text/x-python"),
                                ("dl-weights", ex.weights, "application/octet-stream")):
        blob = js.Blob.new(to_js([memoryview(data)]), js_object({"type": kind}))
        link = document.getElementById(link_id)
        link.href = js.URL.createObjectURL(blob)
        link.hidden = False
    js.window.tgExport = js_object({"bytes": len(ex.weights), "lines": source.count("\n"),
                                    "class": ex.class_name})
    log(f"exported: mlp_torch.py ({source.count(chr(10))} lines, class {ex.class_name}) and "
        f"mlp_torch.safetensors ({len(ex.weights)} bytes)")
    show("status", "exported: download mlp_torch.py and mlp_torch.safetensors")


def on_stop(_event) -> None:
    STATE["stop"] = True


def on_export(_event) -> None:
    asyncio.ensure_future(export_to_pytorch())


async def main() -> None:
    document.getElementById("stop").addEventListener("click", create_proxy(on_stop))
    document.getElementById("export").addEventListener("click", create_proxy(on_export))
    try:
        figures = await train_and_plot()
        js.window.tgDemo = js_object({"done": True, "ok": True, "figures": figures})
    except Exception as exc:  # noqa: BLE001 (the page reports it)
        log(f"failed: {type(exc).__name__}: {exc}")
        show("status", f"failed: {exc}")
        js.window.tgDemo = js_object({"done": True, "ok": False,
                                      "error": f"{type(exc).__name__}: {exc}"})


asyncio.ensure_future(main())
