"""The makemore demo's script: the character-model script (demos/common/char_lm.py) on the
first names of PyPI names==0.3.0 (demos/data/names.py), names sampled on the host from the
logits of model.py's CharTransformer.

Natively: ``python demos/makemore/main.py steps=100 every=50``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import char_lm
import demo_common as dc

D = dc.Script(globals(), "makemore", char_lm.DEFAULTS)
SETTINGS = char_lm.Settings(data="names.txt", what="names", model="CharTransformer",
                            sampler="host")


async def main() -> dict:
    return await char_lm.main(D, SETTINGS)


if __name__ == "__main__":
    dc.run_native(globals())
