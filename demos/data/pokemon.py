"""Pokémon species names from the npm package `pokemon@3.3.1` (MIT; pinned in package.json),
for the pokeformer demo.

Its `data/en.json` lists the 1,025 species in National Dex order. Each name is lowercased and
kept to a-z (``Mr. Mime`` → ``mrmime``, ``Farfetch'd`` → ``farfetchd``, ``Nidoran♀`` →
``nidoran``); duplicates are dropped. `pokemon.txt`: one name per line, in Dex order.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "node_modules" / "pokemon"
VERSION = "3.3.1"
OUT = "pokemon.txt"
OUT_SHA256 = "67b2ff267fb71a55690b0e653c57431ebc2615a86576e1fbfbaf022d09aba37e"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def convert() -> bytes:
    meta = json.loads((PACKAGE / "package.json").read_text())
    if meta.get("version") != VERSION:
        raise SystemExit(f"node_modules/pokemon is {meta.get('version')}, want {VERSION} "
                         "(run npm ci)")
    seen: dict[str, None] = {}
    for name in json.loads((PACKAGE / "data" / "en.json").read_text(encoding="utf-8")):
        word = "".join(c for c in name.lower() if "a" <= c <= "z")
        if word:
            seen.setdefault(word)
    return "".join(f"{n}\n" for n in seen).encode()


def build(cache: Path) -> list[Path]:
    out = cache / OUT
    if out.exists() and OUT_SHA256 and _digest(out.read_bytes()) == OUT_SHA256:
        return [out]
    data = convert()
    if OUT_SHA256 and _digest(data) != OUT_SHA256:
        raise SystemExit(f"{OUT}: sha256 {_digest(data)}, pinned {OUT_SHA256}")
    out.write_bytes(data)
    return [out]


if __name__ == "__main__":  # print the hash to pin
    data = convert()
    print(len(data.splitlines()), "names;", _digest(data))
