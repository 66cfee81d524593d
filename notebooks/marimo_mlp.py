"""marimo notebook: the sin(x) MLP trained in the browser, in-process in marimo's Pyodide
worker (its WebAssembly runtime), offline. `python build.py lite` exports it with
`marimo export html-wasm` into dist/web/marimo/ (see litebundle.py: the runtime's Pyodide
and packages are served from the bundle). Natively: `marimo edit notebooks/marimo_mlp.py`.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell
def _():
    import marimo as mo

    mo.md("# An MLP learns sin(x), in marimo's WebAssembly worker")
    return (mo,)


@app.cell
async def _(mo):
    import math
    import random

    import tensorgrad as tg

    support = await tg.check_webgpu()
    mo.md(f"`{support.message}`")
    return math, random, support, tg


@app.cell
async def _(math, mo, random, tg):
    class MLP(tg.Module):
        def __init__(self):
            self.l1, self.l2, self.l3 = tg.Linear(1, 64), tg.Linear(64, 64), tg.Linear(64, 1)

        def forward(self, x):
            return self.l3(tg.relu(self.l2(tg.relu(self.l1(x)))))

    def loss_fn(model, x, y):
        return tg.mean(tg.square(model(x) - y))

    train = await tg.compile(model=MLP(), loss=loss_fn, inputs={"x": (256, 1), "y": (256, 1)},
                             optimizer=tg.optim.Adam(lr=5e-3), seed=1)
    rng = random.Random(1)
    loss = float("nan")
    for step in range(1, 1001):
        xs = [rng.uniform(-math.pi, math.pi) for _ in range(256)]
        match await train.step(x=xs, y=[math.sin(v) for v in xs]):
            case tg.Completed(loss=loss):
                pass
            case other:
                raise RuntimeError(f"step {step}: {other}")
        if step % 20 == 0:
            mo.output.replace(mo.md(f"step {step}: loss {loss:.4f}"))  # one line, updated
        if loss < 0.01:
            break
    mo.output.replace(mo.md(
        f"final loss {loss:.4f} after {step} steps on {train.device.description}"))


if __name__ == "__main__":
    app.run()
