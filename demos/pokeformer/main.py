"""The pokeformer demo's script: the character-model script (demos/common/char_lm.py) on the
Pokémon names of npm pokemon@3.3.1 (demos/data/pokemon.py), names sampled inside the graph
of model.py's Pokeformer.

Natively: ``python demos/pokeformer/main.py steps=100 every=50``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if "demo_common" not in sys.modules:  # native run: the shared script helpers
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import char_lm
import demo_common as dc

D = dc.Script(globals(), "pokeformer", char_lm.DEFAULTS)
SETTINGS = char_lm.Settings(data="pokemon.txt", what="Pokémon names", model="Pokeformer",
                            sampler="graph")


async def main() -> dict:
    return await char_lm.main(D, SETTINGS)


if __name__ == "__main__":
    dc.run_native(globals())
