"""Fixtures shared by the test layers: the documentation site, built once per session."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Loaded by every Python process of the docs build (a sitecustomize on PYTHONPATH): a connection
# to anything but this machine is logged and refused, so a build that reaches the internet
# fails (mkdocs --strict) and the log names what it tried.
NO_NETWORK = '''
import os, socket
_log = os.environ["TENSORGRAD_NET_LOG"]
with open(_log + ".armed", "a") as f:
    f.write(f"{os.getpid()}\\n")
_LOCAL = ("127.0.0.1", "::1", "localhost")
_connect, _getaddrinfo = socket.socket.connect, socket.getaddrinfo

def _refuse(what):
    with open(_log, "a") as f:
        f.write(f"{what}\\n")
    raise OSError(f"the docs build tried to reach {what}: it must build offline")

def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOCAL:
        _refuse(address)
    return _connect(self, address)

def getaddrinfo(host, *args, **kwargs):
    if host not in _LOCAL and host is not None:
        _refuse(host)
    return _getaddrinfo(host, *args, **kwargs)

socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
'''


@dataclass
class DocsBuild:
    """The built site, and what the build tried to reach (nothing, when it is offline)."""

    site: Path
    reached: list[str]
    guarded_processes: int


@pytest.fixture(scope="session")
def docs_build(tmp_path_factory: pytest.TempPathFactory) -> DocsBuild:
    """dist/docs/ built from this tree by `python build.py docs` (mkdocs build --strict: a
    broken cross-reference or link fails it), with the network refused."""
    sys.path.insert(0, str(ROOT))
    import build

    build.ensure_docs_deps()  # (pip, only when the test extra is not installed)
    guard = tmp_path_factory.mktemp("offline")
    (guard / "sitecustomize.py").write_text(NO_NETWORK)
    log = guard / "reached.log"
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "TENSORGRAD_NET_LOG")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(guard), saved["PYTHONPATH"]]))
    os.environ["TENSORGRAD_NET_LOG"] = str(log)
    try:
        site = build.build_docs()
    except SystemExit as exc:
        reached = log.read_text() if log.exists() else ""
        pytest.fail(f"python build.py docs failed: {exc}\n{reached}")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    armed = Path(f"{log}.armed")
    return DocsBuild(site, log.read_text().splitlines() if log.exists() else [],
                     len(armed.read_text().split()) if armed.exists() else 0)


@pytest.fixture(scope="session")
def docs_site(docs_build: DocsBuild) -> Path:
    """The built documentation site (dist/docs/)."""
    return docs_build.site
