"""JupyterLite notebook: the README's first model, trained in the kernel's own Web Worker.

Percent format (litebundle.py converts it to first_model.ipynb): `# %%` code cells,
`# %% [markdown]` Markdown cells, `# %pip` the pip magic.
"""

# %% [markdown]
# # A first model: an MLP learns sin(x)
#
# This notebook's kernel is Pyodide running in a Web Worker, so tensorgrad runs **in-process**:
# `tg.compile` traces the model, derives the gradients, writes WGSL kernels and trains on the
# worker's own WebGPU (`navigator.gpu`). Nothing is downloaded from the internet: the wheel
# comes from this site's package index.

# %%
# %pip install tensorgrad-webgpu

# %%
import math
import random

import tensorgrad as tg

support = await tg.check_webgpu()
print(support.message)

# %%
class MLP(tg.Module):
    def __init__(self):
        self.l1, self.l2, self.l3 = tg.Linear(1, 64), tg.Linear(64, 64), tg.Linear(64, 1)

    def forward(self, x):
        return self.l3(tg.relu(self.l2(tg.relu(self.l1(x)))))


def loss_fn(model, x, y):
    return tg.mean(tg.square(model(x) - y))


train = await tg.compile(model=MLP(), loss=loss_fn,
                         inputs={"x": (256, 1), "y": (256, 1)},
                         optimizer=tg.optim.Adam(lr=5e-3), seed=0)
predict = await train.attach(forward=lambda m, x: m(x), inputs={"x": (None, 1)})
print(f"compiled: {train.kernel_count} kernels, {train.param_count} params on "
      f"{train.device.description}")

# %% [markdown]
# Train until the loss is below 0.01. The line below updates in place (an IPython display
# handle) instead of printing every step.

# %%
import time

from IPython.display import HTML, display

TARGET, MAX_STEPS = 0.01, 1000
rng = random.Random(0)
status = display(HTML("starting…"), display_id=True)
t0 = time.perf_counter()
for step in range(1, MAX_STEPS + 1):
    xs = [rng.uniform(-math.pi, math.pi) for _ in range(256)]
    match await train.step(x=xs, y=[math.sin(v) for v in xs]):
        case tg.Completed(loss=loss):
            pass
        case tg.Failed(error=err):
            raise err
    if step % 20 == 0 or loss < TARGET:
        rate = step / (time.perf_counter() - t0)
        status.update(HTML(f"step {step}: loss {loss:.4f} ({rate:.0f} steps/s)"))
    if loss < TARGET:
        break
print(f"final loss {loss:.4f} after {step} steps on {train.device.description}")

# %%
out = (await predict.run(x=[0.5])).output
print(f"model(0.5) = {float(out[0, 0]):.3f}, sin(0.5) = {math.sin(0.5):.3f}")

# %% [markdown]
# Save a checkpoint (safetensors) into the kernel's file system:

# %%
with open("mlp.safetensors", "wb") as f:
    f.write(tg.save_safetensors(await train.download_params()))
print("saved mlp.safetensors")
