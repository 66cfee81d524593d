"""`build.py serve` serves only files under its folder, on 127.0.0.1 only: '..' in any
spelling, symlinks out of the tree and folder listings are 404s; a mounted folder (the docs at
/docs/) is served under its prefix with the same rules. `build.py test` hands its arguments to
pytest as given."""

from __future__ import annotations

import http.client
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import build


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    site, outside = tmp_path / "site", tmp_path / "outside"
    (site / "app").mkdir(parents=True)
    (site / "raw").mkdir()
    outside.mkdir()
    (site / "ok.txt").write_text("served")
    (site / "app" / "index.html").write_text("<p>app</p>")
    (site / "raw" / "data.txt").write_text("listed?")
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside, site / "link")
    os.symlink(outside / "secret.txt", site / "secret.txt")
    server = build.serve_web(0, directory=site, quiet=True)
    host, port = server.server_address[:2]
    yield host, port, site
    server.shutdown()


def get(host: str, port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.putrequest("GET", path, skip_accept_encoding=True)  # the raw path, not normalised
    conn.endheaders()
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def test_binds_loopback_only(served) -> None:
    host, _, _ = served
    assert host == "127.0.0.1"


@pytest.mark.parametrize("path", [
    "/../outside/secret.txt", "/%2e%2e/outside/secret.txt", "/..%2foutside%2fsecret.txt",
    "/app/../../outside/secret.txt", "/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", "/....//secret.txt",
    "/link/secret.txt", "/secret.txt", "/raw/", "/nothing-here.txt",
])
def test_paths_outside_the_tree_are_404(served, path: str) -> None:
    host, port, _ = served
    status, body = get(host, port, path)
    assert status == 404, (path, status, body[:80])
    assert b"secret" not in body


@pytest.mark.parametrize("path", ["/%00", "/ok.txt%00", "/app/%00/index.html", "/%2500%00x"])
def test_a_nul_byte_in_the_path_is_a_400_and_no_traceback(served, capfd, path: str) -> None:
    """os.path.realpath refuses a NUL byte: the request is answered 400 (not a dropped
    connection with a traceback on the server's console), and the server goes on."""
    host, port, _ = served
    status, body = get(host, port, path)
    assert status == 400 and b"NUL byte" in body, (status, body[:200])
    assert get(host, port, "/ok.txt") == (200, b"served")
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ValueError" not in err, err


def test_files_and_pages_inside_are_served(served) -> None:
    host, port, _ = served
    assert get(host, port, "/ok.txt") == (200, b"served")
    status, body = get(host, port, "/app/")
    assert status == 200 and b"app" in body
    assert get(host, port, "/raw/data.txt")[0] == 200  # files in a folder without a listing


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The site above with a docs folder mounted at /docs/ (and a secret beside the docs)."""
    site, docs = tmp_path / "site", tmp_path / "built" / "docs"
    (site / "demos").mkdir(parents=True)
    (docs / "guides").mkdir(parents=True)
    (site / "index.html").write_text("<p>landing</p>")
    (site / "demos" / "index.html").write_text("<p>demos</p>")
    (docs / "index.html").write_text("<p>docs home</p>")
    (docs / "guides" / "index.html").write_text("<p>a guide</p>")
    (tmp_path / "built" / "secret.txt").write_text("secret")
    server = build.serve_web(0, directory=site, quiet=True, mounts={"/docs/": docs})
    host, port = server.server_address[:2]
    yield host, port
    server.shutdown()


def test_a_mounted_folder_is_served_under_its_prefix(mounted) -> None:
    host, port = mounted
    assert get(host, port, "/") == (200, b"<p>landing</p>")
    assert get(host, port, "/demos/") == (200, b"<p>demos</p>")
    assert get(host, port, "/docs/") == (200, b"<p>docs home</p>")
    assert get(host, port, "/docs/guides/") == (200, b"<p>a guide</p>")
    assert get(host, port, "/docs")[0] == 301  # to /docs/, as for any folder
    for path in ("/docs/../secret.txt", "/docs/%2e%2e/secret.txt", "/docs/..%2fsecret.txt",
                 "/docs/guides/../../secret.txt", "/secret.txt", "/docs/nothing.html"):
        status, body = get(host, port, path)
        assert status == 404 and b"secret" not in body, (path, status, body[:80])


def test_build_test_passes_every_argument_to_pytest_in_order() -> None:
    """`build.py test -p no:cacheprovider -k adam -x` hands pytest exactly that (argparse
    alone moved `-p` after its value); other commands and `test --help` are not taken."""
    args = ["-p", "no:cacheprovider", "tests/unit", "-k", "adam", "-x"]
    assert build.pytest_arguments(["test", *args]) == args
    assert build.pytest_arguments(["test"]) == []
    assert build.pytest_arguments(["serve", "--port", "0"]) is None
    assert build.pytest_arguments(["test", "--help"]) is None
