"""The JupyterLite site of `python build.py lite` (dist/web/lite/), offline.

JupyterLite (PyPI ``jupyterlite-core``) and its Pyodide kernel (``jupyterlite-pyodide-kernel``)
build a static site; this module points that kernel at the Pyodide the bundle already serves
(dist/web/pyodide/, no CDN) and makes everything the kernel loads come from the bundle:

- The kernel installs ``ipython``, ``jedi`` and their dependencies through Pyodide's lock, whose
  files live on a CDN. They are pure Python: PyPI's wheels of the lock's versions are served
  beside the Pyodide core and the served lock's entries rewritten to them (as build.py does
  for micropip and packaging). ``comm`` is not in Pyodide's lock: its PyPI wheel goes into the
  site's piplite index (pypi/all.json), with the tensorgrad wheel under its PyPI distribution
  name, so that ``%pip install tensorgrad-webgpu`` works offline (PyPI fallback off).
- The notebooks are written as percent-format Python (notebooks/*.py: ``# %%`` code cells,
  ``# %% [markdown]`` cells, ``# %pip`` magics) and converted to .ipynb here.

build.py calls :func:`build_lite`; nothing here imports build.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

# The kernel's pure-Python dependencies that Pyodide's lock names (their files are on a CDN):
# served from PyPI's wheels of exactly the lock's versions (pyodide 314.0.8).
KERNEL_LOCK_WHEELS = {
    "ipython": "9.12.0", "asttokens": "3.0.1", "six": "1.17.0", "decorator": "5.2.1",
    "executing": "2.2.1", "matplotlib-inline": "0.2.1", "traitlets": "5.14.3",
    "prompt-toolkit": "3.0.52", "wcwidth": "0.6.0", "pure-eval": "0.2.3", "pygments": "2.20.0",
    "stack-data": "0.6.3", "jedi": "0.19.2", "parso": "0.8.6",
}
# ... and the ones it installs that the lock lacks: into the site's piplite index.
KERNEL_PIPLITE_WHEELS = {"comm": "0.2.3"}
# The PyPI distribution name the notebooks install (`%pip install tensorgrad-webgpu`).
DISTRIBUTION = "tensorgrad-webgpu"
KERNEL_PLUGIN = "@jupyterlite/pyodide-kernel-extension:kernel"
LITE_VERSION = "0.8.6"  # jupyterlite-core and jupyterlite-pyodide-kernel (pyproject's `lite`)
NOTEBOOKS = ("first_model", "addition_transformer", "export_pytorch")



def fetch_pypi_wheel(cache: Path, name: str, version: str) -> Path:
    """PyPI's pure-Python wheel of `name==version` (any py3 tag), downloaded once into
    `cache`."""
    stem = re.sub(r"[-_.]+", "_", name).lower()

    def found() -> list[Path]:
        return sorted(p for p in cache.glob("*.whl")
                      if p.name.lower().startswith(f"{stem}-{version}-")
                      and p.name.endswith("-none-any.whl"))

    if not found():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.14", "-d", str(cache),
               f"{name}=={version}"]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    if not found():
        raise SystemExit(f"pip download {name}=={version} gave no pure-Python wheel")
    return found()[0]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def serve_lock_wheels(core: Path, wheels: dict[str, str], cache: Path) -> list[str]:
    """Copy PyPI's wheels of `wheels` ({name: version}) into `core` (a served Pyodide folder)
    and point its pyodide-lock.json entries at them; the names rewritten."""
    lock_path = core / "pyodide-lock.json"
    lock = json.loads(lock_path.read_text())
    by_name = {_norm(k): k for k in lock["packages"]}
    done = []
    for name, version in wheels.items():
        key = by_name.get(_norm(name))
        if key is None:
            raise SystemExit(f"pyodide-lock.json has no {name}: the JupyterLite kernel needs it")
        entry = lock["packages"][key]
        if entry["version"] != version:
            raise SystemExit(f"pyodide-lock.json has {name} {entry['version']}, want {version}")
        src = fetch_pypi_wheel(cache, name, version)
        shutil.copy2(src, core / src.name)
        entry["file_name"], entry["sha256"] = src.name, _sha256(src)
        done.append(key)
    lock_path.write_text(json.dumps(lock))
    return done


def renamed_wheel(wheel: Path, distribution: str, dest: Path) -> Path:
    """`wheel` as the distribution `distribution` (its .dist-info folder, METADATA's Name and
    RECORD rewritten; the importable packages unchanged), written into `dest`."""
    with zipfile.ZipFile(wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    old_info = next(n.split("/")[0] for n in files if n.endswith(".dist-info/METADATA"))
    old_name, version = old_info[:-len(".dist-info")].rsplit("-", 1)
    if _norm(old_name) == _norm(distribution):
        shutil.copy2(wheel, dest / wheel.name)
        return dest / wheel.name
    stem = re.sub(r"[-_.]+", "_", distribution)
    new_info = f"{stem}-{version}.dist-info"
    out: dict[str, bytes] = {}
    for name, data in files.items():
        if name.startswith(old_info + "/"):
            name = new_info + name[len(old_info):]
            if name.endswith("/METADATA"):
                data = re.sub(rb"(?m)^Name: .*$", f"Name: {distribution}".encode(), data)
        if not name.endswith("/RECORD"):
            out[name] = data
    target = dest / f"{stem}-{version}-py3-none-any.whl"
    write_wheel(target, out, new_info)
    return target


def percent_to_notebook(source: str) -> dict:
    """A percent-format Python file as an nbformat 4 notebook: ``# %%`` starts a code cell,
    ``# %% [markdown]`` a Markdown cell (its lines without the leading ``# ``), and a commented
    magic (``# %pip install x``) becomes the magic itself. Text before the first marker (the
    file's docstring) is dropped."""
    cells: list[dict] = []
    kind, lines = None, []

    def flush() -> None:
        if kind is not None:
            body = "\n".join(lines).strip("\n")
            cell = {"cell_type": kind, "metadata": {}, "source": body}
            if kind == "code":
                cell.update(execution_count=None, outputs=[])
            cells.append(cell)

    for line in source.splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        elif kind == "markdown":
            lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
        elif kind == "code":
            lines.append(line[2:] if re.match(r"# %(pip|time|timeit) ", line) else line)
    flush()
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"display_name": "Python (Pyodide)", "language": "python",
                       "name": "python"},
        "language_info": {"name": "python"}}}


def lite_config() -> dict:
    """jupyter-lite.json: the kernel loads the bundle's Pyodide and never falls back to PyPI.
    "./" URLs are resolved against the site's root (jupyter-lite.json's folder) by
    JupyterLite: the bundle's Pyodide is the site's sibling."""
    return {"jupyter-lite-schema-version": 0, "jupyter-config-data": {
        "appName": "tensorgrad notebooks",
        "litePluginSettings": {KERNEL_PLUGIN: {
            "pyodideUrl": "./../pyodide/pyodide.mjs", "disablePyPIFallback": True}}}}


def build_lite(web: Path, root: Path, wheel: Path, cache: Path) -> Path:
    """Build the JupyterLite site into `web`/lite (built beside, then swapped in). `web` is the
    assembled bundle (its pyodide/ gets the kernel's wheels), `root` the repository (notebooks/),
    `wheel` tensorgrad's wheel, `cache` where PyPI's wheels are kept."""
    serve_lock_wheels(web / "pyodide", KERNEL_LOCK_WHEELS, cache)
    extension_wheel = fetch_pypi_wheel(cache, "jupyterlite-pyodide-kernel", LITE_VERSION)
    work = web.parent / f".lite-src.{os.getpid()}"
    out = web / f".lite.{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    (work / "pypi").mkdir(parents=True)
    (work / "files").mkdir()
    renamed_wheel(wheel, DISTRIBUTION, work / "pypi")
    for name, version in KERNEL_PIPLITE_WHEELS.items():
        shutil.copy2(fetch_pypi_wheel(cache, name, version), work / "pypi")
    for name in NOTEBOOKS:
        notebook = percent_to_notebook((root / "notebooks" / f"{name}.py").read_text())
        (work / "files" / f"{name}.ipynb").write_text(json.dumps(notebook, indent=1) + "\n")
    (work / "jupyter-lite.json").write_text(json.dumps(lite_config()))
    # every cell in the page (the Notebook app's default renders only the cells in view)
    (work / "overrides.json").write_text(json.dumps({
        "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}))
    (work / "jupyter_lite_config.json").write_text(json.dumps({"LiteBuildConfig": {
        "settings_overrides": ["overrides.json"],
        "ignore_sys_prefix": ["federated_extensions"],
        "federated_extensions": [str(extension_wheel)],
        "contents": ["files"], "output_dir": str(out),
        "cache_dir": str(work / ".cache")}}))
    env = {**os.environ, "JUPYTERLITE_NO_LIBARCHIVE": "1"}
    cmd = [sys.executable, "-m", "jupyterlite_core.app", "build", "--lite-dir", str(work)]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=work, env=env)
    shutil.rmtree(work, ignore_errors=True)
    for junk in out.glob("rspack.config*.js"):  # the app's own build scripts, never loaded
        junk.unlink()
    final = web / "lite"
    old = web / f".lite-old.{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(out, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


# ---- marimo --------------------------------------------------------------------------------
# `marimo export html-wasm` (pyproject's `marimo` extra) writes a page whose worker bundles
# Pyodide 314.0.0's JS loader, which refuses any other Pyodide core ("Pyodide version does not
# match"), and would fetch that core from cdn.jsdelivr.net and its lock from wasm.marimo.app.
# The page's <marimo-wasm> element takes both URLs: they point at a Pyodide 314.0.0 core from
# npm (pyodide@314.0.0, same ABI as the bundle's) and a lock whose packages are PyPI's files.
MARIMO_PYODIDE = "314.0.0"
MARIMO_PYPI = {
    "micropip": "0.11.1", "packaging": "26.1", "narwhals": "2.18.1", "jedi": "0.19.2",
    "parso": "0.8.6", "pygments": "2.20.0", "docutils": "0.22.4", "pyodide-http": "0.2.2",
    "marimo-base": "0.25.2", "markdown": "3.11.3", "pymdown-extensions": "10.21.2",
    "tomlkit": "0.15.3", "python-multipart": "0.0.34", "itsdangerous": "2.2.0",
}
# compiled, as PyPI's pyemscripten_2026_0 wheel (the lock's 0.20.0 exists only on the CDN;
# marimo-base wants >= 0.22)
MARIMO_WASM = {"msgspec": "0.23.0"}
# compiled in Pyodide's lock (CDN only) and imported by marimo at start: PyYAML's own pure-Python
# implementation, from its PyPI sdist (it runs without the _yaml extension)
PYYAML = "6.0.3"
# lock entries the Pyodide lock lacks: {name: (imports, depends)}
MARIMO_NEW = {
    "marimo-base": (["marimo"], ["jedi", "markdown", "pymdown-extensions", "pygments", "tomlkit",
                                 "python-multipart", "docutils", "itsdangerous", "narwhals",
                                 "packaging", "msgspec", "pyyaml"]),
    "markdown": (["markdown"], []), "pymdown-extensions": (["pymdownx"], ["markdown", "pyyaml"]),
    "tomlkit": (["tomlkit"], []), "python-multipart": (["multipart", "python_multipart"], []),
    "itsdangerous": (["itsdangerous"], []), DISTRIBUTION: (["tensorgrad"], []),
}
MARIMO_TAG = '<marimo-wasm hidden="">'


def _pip_download(cache: Path, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache), *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _wasm_wheel(cache: Path, name: str, version: str) -> Path:
    """PyPI's pyemscripten_2026_0 (Pyodide 314) wheel of a compiled package."""
    pattern = f"{re.sub(r'[-_.]+', '_', name)}-{version}-cp314-cp314-pyemscripten_2026_0_wasm32.whl"
    if not (cache / pattern).exists():
        _pip_download(cache, ["--only-binary=:all:", "--platform", "pyemscripten_2026_0_wasm32",
                              "--implementation", "cp", "--python-version", "3.14",
                              f"{name}=={version}"])
    return cache / pattern


def pure_pyyaml_wheel(cache: Path) -> Path:
    """A py3-none-any wheel of PyYAML's pure-Python package (lib/yaml of its PyPI sdist)."""
    out = cache / f"pyyaml-{PYYAML}-py3-none-any.whl"
    if out.exists():
        return out
    sdist = cache / f"pyyaml-{PYYAML}.tar.gz"
    if not sdist.exists():
        _pip_download(cache, ["--no-binary=:all:", "--no-build-isolation", f"pyyaml=={PYYAML}"])
    import tarfile

    files: dict[str, bytes] = {}
    with tarfile.open(sdist) as tf:
        for member in tf.getmembers():
            parts = member.name.split("/")
            if parts[1:3] == ["lib", "yaml"] and member.name.endswith(".py"):
                files["yaml/" + "/".join(parts[3:])] = tf.extractfile(member).read()
    if "yaml/__init__.py" not in files:
        raise SystemExit(f"{sdist.name} has no lib/yaml/__init__.py")
    info = f"pyyaml-{PYYAML}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: PyYAML\nVersion: {PYYAML}\n".encode()
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: tensorgrad litebundle.py\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    write_wheel(out, files, info)
    return out


def write_wheel(path: Path, files: dict[str, bytes], info: str) -> None:
    """Write `files` ({archive name: bytes}) as a wheel at `path`, reproducibly (fixed dates
    and modes) with `info`/RECORD (the sha256 and size of every file) added last."""
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files = {**files, f"{info}/RECORD": ("\n".join([*record, f"{info}/RECORD,,"]) +
                                         "\n").encode()}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(entry, data)


def _marimo_core(cache: Path) -> Path:
    """npm's pyodide@MARIMO_PYODIDE package folder (npm pack, unpacked once)."""
    folder = cache / f"pyodide-{MARIMO_PYODIDE}"
    if not (folder / "package" / "pyodide-lock.json").exists():
        import tarfile

        folder.mkdir(parents=True, exist_ok=True)
        cmd = ["npm", "pack", f"pyodide@{MARIMO_PYODIDE}", "--silent",
               "--pack-destination", str(folder)]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        with tarfile.open(folder / f"pyodide-{MARIMO_PYODIDE}.tgz") as tf:
            tf.extractall(folder, filter="data")
    return folder / "package"


def _marimo_lock(core: Path, npm_core: Path, wheels: list[Path]) -> None:
    """The served lock: Pyodide's, with every package the page loads pointed at `wheels`."""
    lock = json.loads((npm_core / "pyodide-lock.json").read_text())
    packages = lock["packages"]
    by_name = {_norm(k): k for k in packages}
    for whl in wheels:
        name, version = whl.name.split("-")[:2]
        key = by_name.get(_norm(name), _norm(name))
        new = MARIMO_NEW.get(_norm(name))
        entry = packages.get(key) or {
            "name": key, "install_dir": "site", "package_type": "package",
            "unvendored_tests": False, "imports": new[0], "depends": new[1]}
        if _norm(name) == "pyyaml":
            entry["imports"] = ["yaml"]
        shutil.copy2(whl, core / whl.name)
        entry.update(version=version, file_name=whl.name, sha256=_sha256(whl))
        packages[key] = entry
    (core / "pyodide-lock.json").write_text(json.dumps(lock))


def build_marimo(web: Path, root: Path, wheel: Path, cache: Path) -> Path:
    """`marimo export html-wasm` of notebooks/marimo_mlp.py into `web`/marimo/, with its
    Pyodide and every package it loads served from there (see the notes above)."""
    work = web / f".marimo.{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    cmd = [sys.executable, "-m", "marimo", "export", "html-wasm",
           str(root / "notebooks" / "marimo_mlp.py"), "-o", str(work), "--mode", "run"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "MARIMO_SKIP_UPDATE_CHECK": "1"})
    (work / "CLAUDE.md").unlink(missing_ok=True)  # marimo's note for coding agents
    npm_core = _marimo_core(cache)
    core = work / "pyodide"
    core.mkdir()
    for name in ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip"):
        shutil.copy2(npm_core / name, core / name)
    wheels = [fetch_pypi_wheel(cache, n, v) for n, v in MARIMO_PYPI.items()]
    wheels += [_wasm_wheel(cache, n, v) for n, v in MARIMO_WASM.items()]
    wheels += [pure_pyyaml_wheel(cache), wheel]
    _marimo_lock(core, npm_core, wheels)
    page = (work / "index.html").read_text()
    if page.count(MARIMO_TAG) != 1:
        raise SystemExit(f"marimo's page has no single {MARIMO_TAG}: its runtime's URLs "
                         "cannot be set (another marimo version?)")
    (work / "index.html").write_text(page.replace(MARIMO_TAG, (
        '<marimo-wasm hidden="" data-pyodide-index-url="./pyodide/" '
        'data-pyodide-lockfile-url="./pyodide/pyodide-lock.json">')))
    final, old = web / "marimo", web / f".marimo-old.{os.getpid()}"
    if final.exists():
        os.replace(final, old)
    os.replace(work, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
