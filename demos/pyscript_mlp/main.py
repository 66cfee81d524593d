"""The PyScript demo: this file runs on the page (PyScript's Pyodide, main thread).

It defines the model (MODEL, run in tensorgrad's worker and also here, for the export),
starts tensorgrad's worker with ``tensorgrad.web.start()``, compiles the training step there,
drives the training loop from here (each ``await train.step(...)`` lets the page run while
the worker computes on the GPU), draws the loss and the fit on two canvases, and exports the
trained model to PyTorch (``tg.export.torch``: a .py file and a .safetensors file, offered as
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
BLUE, LIGHT_BLUE, ORANGE, GRAY = "#2563eb", "#93c5fd", "#ea580c", "#9ca3af"
INK, GRID, AXIS = "#111827", "#e5e7eb", "#6b7280"

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


def log(text: str) -> None:
    el = document.getElementById("log")
    el.textContent += text + "\n"
    el.scrollTop = el.scrollHeight
    print(text)


def show(element_id: str, text: str) -> None:
    document.getElementById(element_id).textContent = text


def js_object(value: dict):
    return to_js(value, dict_converter=js.Object.fromEntries)


# ---- plots, drawn from Python on a 2-D canvas ------------------------------------------------

def _ticks(lo: float, hi: float, count: int = 5) -> list:
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m for m in (1, 2, 5, 10) if m * mag >= raw) * mag
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]


def plot(canvas_id: str, title: str, series: list, *, log_y: bool = False,
         x_range: tuple | None = None, y_range: tuple | None = None) -> None:
    """Axes, ticks and line series [(xs, ys, color, width)]; canvas.dataset.points = count."""
    canvas = document.getElementById(canvas_id)
    ctx = canvas.getContext("2d")
    w, h = canvas.width, canvas.height
    left, right, top, bottom = 52, 12, 24, 28
    ctx.fillStyle = "#ffffff"
    ctx.fillRect(0, 0, w, h)
    ctx.font = "12px system-ui, sans-serif"
    ctx.fillStyle = INK
    ctx.fillText(title, left, 15)
    points = [(x, y) for xs, ys, _, _ in series for x, y in zip(xs, ys)
              if math.isfinite(y) and (y > 0 or not log_y)]
    canvas.dataset.points = str(len(points))
    if not points:
        ctx.fillStyle = AXIS
        ctx.fillText("waiting for the model", w / 2 - 60, h / 2)
        return
    fy = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    x0, x1 = x_range or (min(p[0] for p in points), max(p[0] for p in points))
    y0, y1 = y_range or (min(fy(p[1]) for p in points), max(fy(p[1]) for p in points))
    if x1 <= x0:
        x1 = x0 + 1
    if y1 <= y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (w - left - right)

    def py(y: float) -> float:
        return h - bottom - (fy(y) - y0) / (y1 - y0) * (h - top - bottom)

    ctx.strokeStyle = GRID
    ctx.lineWidth = 1
    ctx.fillStyle = AXIS
    yticks = ([10 ** e for e in range(math.floor(y0), math.ceil(y1) + 1)] if log_y
              else _ticks(y0, y1))
    for t in yticks:
        if not y0 - 1e-9 <= fy(t) <= y1 + 1e-9:
            continue
        ctx.beginPath()
        ctx.moveTo(left, py(t))
        ctx.lineTo(w - right, py(t))
        ctx.stroke()
        ctx.fillText(f"{t:g}", 4, py(t) + 4)
    for t in _ticks(x0, x1):
        ctx.fillText(f"{t:g}", px(t) - 8, h - 8)
    for xs, ys, color, width in series:
        ctx.strokeStyle = color
        ctx.lineWidth = width
        ctx.beginPath()
        pen = False
        for x, y in zip(xs, ys):
            if not math.isfinite(y) or (log_y and y <= 0):
                pen = False
                continue
            if pen:
                ctx.lineTo(px(x), py(y))
            else:
                ctx.moveTo(px(x), py(y))
                pen = True
        ctx.stroke()


def smooth(ys: list, k: int = 10) -> list:
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= k:
            acc -= ys[i - k]
        out.append(acc / min(i + 1, k))
    return out


def draw(losses: list, xs: list, pred: list | None, pred_step: int) -> None:
    steps = list(range(1, len(losses) + 1))
    series = [(steps, losses, LIGHT_BLUE if len(losses) >= 20 else BLUE, 1)]
    if len(losses) >= 20:
        series.append((steps, smooth(losses), BLUE, 2))
    plot("loss", "training loss (log scale)", series, log_y=True)
    fit = [(xs, [math.sin(x) for x in xs], GRAY, 3)]
    if pred is not None:
        fit.append((xs, pred, ORANGE, 2))
    plot("fit", f"sin(x) and the model at step {pred_step}", fit,
         x_range=(-math.pi, math.pi), y_range=(-1.35, 1.35))


# ---- the run -------------------------------------------------------------------------------

async def predict_grid(predict, xs: array.array) -> list:
    result = await predict.run(x=xs)
    if result.kind != "completed":
        raise RuntimeError(f"predict: {result}")
    out = result.output
    flat = out.tolist() if hasattr(out, "tolist") else list(out)
    return [float(v[0] if isinstance(v, list) else v) for v in flat]


async def train_and_plot() -> dict:
    cfg = query()
    t_page = now_ms()  # PyScript is up: its Pyodide and the tensorgrad wheel are loaded
    log(f"PyScript ready in {t_page / 1000:.1f} s (tensorgrad {tg.__version__} on the page)")
    show("status", "starting tensorgrad's worker…")
    session = await tensorgrad.web.start(client_url="../../tensorgrad.js")
    t_ready = now_ms()
    log(f"ready in {t_ready / 1000:.1f} s: worker {session.timings}")
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
    show("s-kernels", str(train.kernel_count))
    document.getElementById("stop").disabled = False

    xs = array.array("f", [-math.pi + 2 * math.pi * i / (PLOT_POINTS - 1)
                           for i in range(PLOT_POINTS)])
    xs_list = list(xs)
    rng = random.Random(int(cfg["seed"]))
    losses: list = []
    pred = await predict_grid(predict, xs)
    draw(losses, xs_list, pred, 0)
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
        recent = losses[-10:]
        if reached is None and len(recent) == 10 and sum(recent) / 10 < cfg["target"]:
            reached = step
        if step % cfg["every"] == 0 or reached == step:
            pred = await predict_grid(predict, xs)
            rate = step / ((now_ms() - t_train) / 1000)
            log(f"step {step:5d}  loss {result.loss:.5f}  {rate:.1f} steps/s")
            show("s-rate", f"{rate:.1f}")
            draw(losses, xs_list, pred, step)
        show("s-step", str(step))
        show("s-loss", f"{result.loss:.4g}")
        if reached is not None:
            break
    train_s = (now_ms() - t_train) / 1000
    js.window.tgTraining.end = now_ms()
    pred = await predict_grid(predict, xs)
    draw(losses, xs_list, pred, len(losses))
    fit_mse = sum((p - math.sin(x)) ** 2 for p, x in zip(pred, xs_list)) / len(xs_list)
    recent = losses[-10:]
    figures = {
        "steps": len(losses), "steps_to_target": reached, "target": cfg["target"],
        "loss": losses[-1], "loss_avg10": sum(recent) / len(recent), "fit_mse": fit_mse,
        "steps_per_s": len(losses) / train_s, "train_s": train_s,
        "pyscript_ready_ms": t_page, "worker_ready_ms": t_ready, "compile_ms": compile_ms,
        "kernels": train.kernel_count, "stopped": STATE["stop"],
    }
    js.window.tgFit = js_object({"xs": xs_list, "pred": pred})
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
