"""JupyterLite notebook: train in the browser, then export the model to PyTorch
(tg.export.torch) as two downloadable files.

Percent format (litebundle.py converts it to export_pytorch.ipynb).
"""

# %% [markdown]
# # Train here, keep training in PyTorch
#
# Prototype a model in the browser, then carry it to PyTorch: `tg.export.torch` writes the
# model as a plain PyTorch file (one `nn.Module` per tensorgrad Module, the same parameter
# names) and its trained weights as safetensors. Neither torch nor numpy is needed here.

# %%
# %pip install tensorgrad-webgpu

# %%
import base64
import math
import random

from IPython.display import HTML, display

import tensorgrad as tg

print((await tg.check_webgpu()).message)


class MLP(tg.Module):
    def __init__(self):
        self.l1, self.l2, self.l3 = tg.Linear(1, 64), tg.Linear(64, 64), tg.Linear(64, 1)

    def forward(self, x):
        return self.l3(tg.relu(self.l2(tg.relu(self.l1(x)))))


def loss_fn(model, x, y):
    return tg.mean(tg.square(model(x) - y))


def predict(model, x):
    return model(x)


train = await tg.compile(model=MLP(), loss=loss_fn, inputs={"x": (256, 1), "y": (256, 1)},
                         optimizer=tg.optim.Adam(lr=5e-3), seed=1)

# %%
TARGET, MAX_STEPS = 0.01, 1000
rng = random.Random(0)
status = display(HTML("training…"), display_id=True)
for step in range(1, MAX_STEPS + 1):
    xs = [rng.uniform(-math.pi, math.pi) for _ in range(256)]
    match await train.step(x=xs, y=[math.sin(v) for v in xs]):
        case tg.Completed(loss=loss):
            pass
        case other:
            raise RuntimeError(f"step {step}: {other}")
    if step % 25 == 0 or loss < TARGET:
        status.update(HTML(f"step {step}: loss {loss:.4f}"))
    if loss < TARGET:
        break
print(f"final loss {loss:.4f} after {step} steps on {train.device.description}")

# %% [markdown]
# Export: with `path=None` the export holds the file's text (`.source`) and the weights
# (`.weights`, safetensors bytes); the links below download them.

# %%
exported = await tg.export.torch(train, forward=predict, inputs={"x": (None, 1)}, path=None)
source = exported.source.replace("exported_model", "mlp_torch")


def download(name, data, mime):
    href = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    return f'<a download="{name}" href="{href}">{name}</a> ({len(data):,} bytes)'


display(HTML(download("mlp_torch.py", source.encode(), "text/x-python") + " · " +
             download("mlp_torch.safetensors", exported.weights, "application/octet-stream")))
probe = [-1.5, -0.5, 0.0, 0.5, 1.5]
forward = await train.attach(forward=predict, inputs={"x": (None, 1)})
out = memoryview((await forward.run(x=probe)).output).cast("B").cast("f")
print("predictions", [round(v, 6) for v in out])
print(f"exported class {exported.class_name}: {source.count(chr(10))} lines")

# %% [markdown]
# In PyTorch:
#
# ```python
# import torch
# from safetensors.torch import load_file
# from mlp_torch import MLP
#
# model = MLP()
# model.load_state_dict(load_file("mlp_torch.safetensors"))
# opt = torch.optim.Adam(model.parameters(), lr=1e-3)   # and keep training
# ```
