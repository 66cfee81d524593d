"""The distribution: its name, version, license and classifiers agree everywhere they are
written, and the wheel and sdist that setuptools builds (and the wheel build.py makes for the
browser) hold what they should. Installing the wheel and training from it:
tests/native/test_install.py."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
import zipfile
from pathlib import Path

import pytest
from trove_classifiers import classifiers as TROVE

import tensorgrad as tg
from tests.packaging import ROOT, build_dists, sdist_files, wheel_files, wheel_metadata

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Written by setuptools, not by build.py's wheel (which leaves out the README body).
SETUPTOOLS_ONLY = {"Description-Content-Type", "Dynamic"}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build_dists(tmp_path_factory.mktemp("dists"))


def test_distribution_name_is_not_pypis_tensorgrad() -> None:
    """`tensorgrad` on PyPI is another project (a tensor-network library): the distribution
    has its own name, the import name stays tensorgrad."""
    assert re.sub(r"[-_.]+", "-", PROJECT["name"]).lower() == "tensorgrad-webgpu"
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]


def test_version_and_license_agree_across_python_npm_and_the_license_file() -> None:
    package = json.loads((ROOT / "package.json").read_text())
    assert PROJECT["version"] == tg.__version__ == package["version"], (
        PROJECT["version"], tg.__version__, package["version"])
    assert package["license"] == PROJECT["license"] == "MIT"
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n") and "Copyright (c) 2026 tensorgrad contributors" in text


def test_classifiers_are_valid_and_name_no_license() -> None:
    """Every classifier is a trove classifier; none is a `License ::` one (the SPDX
    `license = "MIT"` replaces them, and setuptools >= 77 rejects both together)."""
    unknown = [c for c in PROJECT["classifiers"] if c not in TROVE]
    assert not unknown, f"not trove classifiers: {unknown}"
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]
    assert "Topic :: Scientific/Engineering :: Artificial Intelligence" in PROJECT["classifiers"]
    assert set(PROJECT["urls"]) == {"Homepage", "Documentation", "Repository", "Changelog"}


def test_changelog_has_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(PROJECT['version'])}\b", text, re.MULTILINE), (
        f"CHANGELOG.md has no '## {PROJECT['version']}' section")


def test_wheel_holds_the_package_py_typed_and_the_license(dists: tuple[Path, Path]) -> None:
    wheel, _ = dists
    assert wheel.name == f"tensorgrad_webgpu-{PROJECT['version']}-py3-none-any.whl"
    files = wheel_files(wheel)
    dist_info = f"tensorgrad_webgpu-{PROJECT['version']}.dist-info"
    assert "tensorgrad/py.typed" in files and "tensorgrad/gpu/browser.mjs" in files
    assert f"{dist_info}/licenses/LICENSE" in files
    strays = [f for f in files if not f.startswith(("tensorgrad/", f"{dist_info}/"))]
    assert not strays, f"files outside the package in the wheel: {strays}"
    headers, body = wheel_metadata(wheel)
    fields = dict(headers)
    assert (fields["Name"], fields["Version"]) == ("tensorgrad-webgpu", PROJECT["version"])
    assert fields["License-Expression"] == "MIT" and fields["License-File"] == "LICENSE"
    assert fields["Metadata-Version"] == "2.4" and fields["Description-Content-Type"] == (
        "text/markdown")
    assert body.strip() == (ROOT / "README.md").read_text().strip()  # PyPI's project page
    assert ("Requires-Dist", 'wgpu==0.32.0; extra == "native"') in headers


def test_sdist_holds_the_sources_and_license_but_no_tests(dists: tuple[Path, Path]) -> None:
    _, sdist = dists
    assert sdist.name == f"tensorgrad_webgpu-{PROJECT['version']}.tar.gz"
    files = sdist_files(sdist)
    for name in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml",
                 "tensorgrad/__init__.py", "tensorgrad/py.typed", "tensorgrad/gpu/browser.mjs"):
        assert name in files, f"the sdist lacks {name}"
    assert not [f for f in files if f.startswith(("tests/", "demos/", "bench/", "web/"))]


def test_build_py_wheel_matches_setuptools_wheel(dists: tuple[Path, Path]) -> None:
    """The browser's wheel (build.py, zipfile) has setuptools' name, files, file contents and
    metadata fields (all but the README body)."""
    import build

    ours, theirs = build.build_wheel(), dists[0]
    assert ours.name == theirs.name
    assert wheel_files(ours) == wheel_files(theirs)
    mine, _ = wheel_metadata(ours)
    setuptools = [(k, v) for k, v in wheel_metadata(theirs)[0] if k not in SETUPTOOLS_ONLY]
    assert sorted(mine) == sorted(setuptools)

    def digests(path: Path) -> dict[str, str]:
        with zipfile.ZipFile(path) as zf:
            return {n: hashlib.sha256(zf.read(n)).hexdigest() for n in zf.namelist()
                    if not n.endswith(("/RECORD", "/WHEEL", "/METADATA"))}

    assert digests(ours) == digests(theirs)


def test_build_py_sees_the_installed_test_extra_as_met() -> None:
    """`build.py test` skips `pip install -e .[test]` when every requirement of the test extra
    is installed: `name`, `name==v` and `name>=v` (setuptools>=77) are read, so a run after
    the install does not reinstall (a `>=` requirement counted as unmet before)."""
    import build

    assert build._requirement_met("setuptools>=77") and build._requirement_met("pytest")
    assert not build._requirement_met("setuptools>=9999")
    assert not build._requirement_met("no-such-package-here==1.0")
    unmet = [r for r in PROJECT["optional-dependencies"]["test"] if not build._requirement_met(r)]
    assert not unmet, f"build.py reads these test requirements as missing: {unmet}"
