#!/usr/bin/env python3
"""tensorgrad's one entry point.

    python build.py test                 install what the tests need, run every test
    python build.py serve [--port N]     build the wheel and the offline web bundle, serve it
    python build.py demo NAME            train a demo in headless Chromium, print its progress
    python build.py wheel                build dist/tensorgrad_webgpu-*.whl
    python build.py web                  assemble dist/web/
    python build.py docs                 build the documentation site into dist/docs/
    python build.py lite                 dist/web/ plus the notebooks: JupyterLite in
                                         dist/web/lite/, a marimo page in dist/web/marimo/
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import urllib.parse
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import litebundle  # the JupyterLite site (beside this file)
import webbundle  # the bundle's bytecode and Pyodide snapshot (beside this file)

ROOT = Path(__file__).resolve().parent
DIST = ROOT / "dist"


def run(cmd: list[str], **kwargs) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)


# System packages the tests need: the Vulkan loader and Mesa's lavapipe (native WebGPU on a
# machine without a GPU), Chromium (browser tests; it also ships SwiftShader's Vulkan driver).
TEST_APT_PACKAGES = ("libvulkan1", "mesa-vulkan-drivers", "chromium")


def _apt_missing(packages: tuple[str, ...]) -> list[str]:
    """The packages `dpkg -s` does not report as installed ([] where there is no dpkg)."""
    if not shutil.which("dpkg"):
        return []
    missing = []
    for name in packages:
        out = subprocess.run(["dpkg", "-s", name], check=False, capture_output=True, text=True)
        if out.returncode != 0 or "Status: install ok installed" not in out.stdout:
            missing.append(name)
    return missing


def ensure_apt_packages(packages: tuple[str, ...] = TEST_APT_PACKAGES) -> None:
    """`apt-get install` what is missing, as root; otherwise say what to install."""
    missing = _apt_missing(packages)
    if not missing:
        return
    command = f"apt-get update && apt-get install -y {' '.join(missing)}"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print(f"build.py: missing system packages {', '.join(missing)}: the native GPU and "
              f"browser tests need them. Install them as root:\n    {command}", flush=True)
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], env=env)
    run(["apt-get", "install", "-y", "-q", *missing], env=env)


def _requirement_met(requirement: str) -> bool:
    """True when a plain `name`, `name==version` or `name>=version` requirement is installed
    (others, or `>=` without the `packaging` module: False, so that pip decides)."""
    import importlib.metadata as md
    import re

    match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(?:(==|>=)\s*([A-Za-z0-9_.\-]+))?\s*",
                         requirement)
    if not match:
        return False
    try:
        installed = md.version(match[1])
    except md.PackageNotFoundError:
        return False
    if match[2] is None:
        return True
    if match[2] == "==":
        return installed.split("+")[0] == match[3]
    try:
        from packaging.version import Version
    except ImportError:
        return False
    return Version(installed) >= Version(match[3])


def _python_test_deps_met() -> bool:
    """True when tensorgrad is installed editable from this checkout and every requirement
    of the `test` extra is installed (so `pip install -e .[test]` can be skipped)."""
    import importlib.metadata as md
    from urllib.parse import unquote, urlparse

    def editable_here(dist: md.Distribution) -> bool:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        url = urlparse(direct.get("url", ""))
        return (bool(direct.get("dir_info", {}).get("editable")) and url.scheme == "file"
                and Path(unquote(url.path)).resolve() == ROOT)

    # (an in-tree *.egg-info is also a "distribution": look for the installed one)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    if not any(editable_here(d) for d in md.distributions(name=project["name"])):
        return False
    requirements = [*project.get("dependencies", []),
                    *project.get("optional-dependencies", {}).get("test", [])]
    return all(_requirement_met(r) for r in requirements)


def _uninstall_old_editable() -> None:
    """Uninstall an editable install of this project made under its old distribution name,
    `tensorgrad` (before 0.1.0 took `tensorgrad-webgpu`): its import finder would still map
    `tensorgrad` to whichever checkout made it. A non-editable `tensorgrad` (PyPI's
    tensor-network library) is left alone."""
    import importlib.metadata as md

    for dist in md.distributions(name="tensorgrad"):
        if json.loads(dist.read_text("direct_url.json") or "{}").get("dir_info", {}).get(
                "editable"):
            run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", "tensorgrad"])
            return


def install_test_deps() -> None:
    """Python packages, npm packages and Chromium (apt, when root and missing).

    Fast when everything is there: dpkg and package metadata are checked before pip or
    apt-get run."""
    ensure_apt_packages()
    if not _python_test_deps_met():
        _uninstall_old_editable()
        run([sys.executable, "-m", "pip", "install", "-q", "-e", ".[test]"], cwd=ROOT)
    install_browser_deps()  # npm packages (the Pyodide core) and Chromium


def pytest_arguments(argv: list[str]) -> list[str] | None:
    """The pytest arguments of `build.py test ARGS...`: ARGS verbatim, options with values
    such as `-p no:cacheprovider` included (argparse would reorder those). None when `argv`
    is another command or asks for the test command's help."""
    if argv[:1] != ["test"] or argv[1:2] in (["-h"], ["--help"]):
        return None
    return argv[1:]


def install_extra(extra: str) -> None:
    """pip install the requirements of pyproject's optional-dependencies `extra` that are
    missing (each pinned, so checked against the installed versions first)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project.get("optional-dependencies", {})[extra]
    missing = [r for r in wanted if not _requirement_met(r)]
    if missing:
        run([sys.executable, "-m", "pip", "install", "-q", *missing])


def cmd_test(args: argparse.Namespace) -> int:
    install_test_deps()
    return subprocess.call([sys.executable, "-m", "pytest", *args.pytest_args], cwd=ROOT)


# ---------------------------------------------------------------------------------------------
# Browser bundle: the wheel, dist/web/ (Pyodide core + micropip + tensorgrad), a dev server.

PYODIDE_VERSION = "314.0.8"  # must equal package.json / package-lock.json
PYODIDE_CORE = ("pyodide.mjs", "pyodide.mjs.map", "pyodide.asm.mjs", "pyodide.asm.wasm",
                "python_stdlib.zip")
# PyScript (npm @pyscript/core), served from dist/web/pyscript/ and configured per page to use
# the Pyodide above ("interpreter": ".../pyodide/pyodide.mjs"), so nothing comes from a CDN.
PYSCRIPT_VERSION = "0.7.31"  # must equal package.json / package-lock.json
# Pyodide lock entries served from PyPI's files (the lock's own files live on a CDN).
PYPI_WHEELS = {"micropip": "0.11.1", "packaging": "26.1"}
WEB = DIST / "web"
CACHE = DIST / ".cache"
CHROMIUM = Path("/usr/lib/chromium/chromium")
MIME_TYPES = {
    ".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm",
    ".json": "application/json", ".map": "application/json", ".whl": "application/zip",
    ".zip": "application/zip", ".html": "text/html", ".css": "text/css",
    ".py": "text/plain; charset=utf-8", ".txt": "text/plain; charset=utf-8",
    ".safetensors": "application/octet-stream",
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _node_modules_fresh() -> bool:
    """True when every package in package-lock.json is installed at its locked version."""
    lock = json.loads((ROOT / "package-lock.json").read_text())
    for key, entry in lock.get("packages", {}).items():
        if not key.startswith("node_modules/"):
            continue
        installed = ROOT / key / "package.json"
        if not installed.exists():
            return False
        if json.loads(installed.read_text()).get("version") != entry.get("version"):
            return False
    return True


def ensure_node_modules() -> None:
    """`npm ci` when node_modules is missing or differs from package-lock.json."""
    if _node_modules_fresh():
        return
    if not shutil.which("npm"):
        raise SystemExit("npm is needed to fetch the Pyodide core (apt-get install -y npm)")
    run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=ROOT)


def ensure_chromium() -> None:
    """Chromium for the browser tests and demos: apt when root and missing."""
    if CHROMIUM.exists():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        run(["apt-get", "update", "-q"])
        run(["apt-get", "install", "-y", "-q", "chromium"])
        if CHROMIUM.exists():
            return
    raise SystemExit(f"Chromium is missing at {CHROMIUM}: run `apt-get install -y chromium` as root"
                     " (Playwright's own browser download is not used)")


def install_browser_deps() -> None:
    """npm packages (the Pyodide core) and Chromium; a fast no-op when both are present."""
    ensure_node_modules()
    ensure_chromium()


PACKAGE = "tensorgrad"  # the import name; the distribution name is pyproject's project.name


def project_table() -> dict[str, Any]:
    """pyproject.toml's [project] table."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def wheel_stem(project: dict[str, Any]) -> str:
    """`name-version` as wheel and dist-info names spell it: the name normalized with runs of
    '-', '_', '.' as one '_' (tensorgrad-webgpu -> tensorgrad_webgpu), as pip and setuptools do."""
    import re

    return f"{re.sub(r'[-_.]+', '_', project['name']).lower()}-{project['version']}"


def wheel_metadata(project: dict[str, Any]) -> str:
    """The wheel's METADATA (core metadata 2.4) from pyproject's [project]: the fields
    setuptools writes, less the long description (the README: the browser fetches this wheel,
    and tests/unit/test_package.py checks the two builds agree)."""
    meta = ["Metadata-Version: 2.4", f"Name: {project['name']}",
            f"Version: {project['version']}", f"Summary: {project.get('description', '')}"]
    meta += [f"Author: {a['name']}" for a in project.get("authors", []) if "name" in a]
    if "license" in project:
        meta.append(f"License-Expression: {project['license']}")
    meta += [f"Project-URL: {k}, {v}" for k, v in project.get("urls", {}).items()]
    if project.get("keywords"):
        meta.append(f"Keywords: {','.join(project['keywords'])}")
    meta += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    meta.append(f"Requires-Python: {project.get('requires-python', '>=3.11')}")
    meta += [f"License-File: {f}" for f in project.get("license-files", [])]
    meta += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        meta.append(f"Provides-Extra: {extra}")
        meta += [f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps]
    return "\n".join(meta) + "\n"


def build_wheel() -> Path:
    """Write the pure-Python wheel dist/tensorgrad_webgpu-<ver>-py3-none-any.whl (zipfile,
    offline, reproducible): every file of tensorgrad/ and the license files (the same files
    as setuptools' wheel of pyproject.toml)."""
    project = project_table()
    stem = wheel_stem(project)
    dist_info = f"{stem}.dist-info"
    files: dict[str, bytes] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            files[path.relative_to(ROOT).as_posix()] = path.read_bytes()
    for name in project.get("license-files", []):
        files[f"{dist_info}/licenses/{name}"] = (ROOT / name).read_bytes()
    files[f"{dist_info}/METADATA"] = wheel_metadata(project).encode()
    files[f"{dist_info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: tensorgrad build.py\n"
                                   b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{dist_info}/top_level.txt"] = f"{PACKAGE}\n".encode()
    DIST.mkdir(exist_ok=True)
    out = DIST / f"{stem}-py3-none-any.whl"
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    litebundle.write_wheel(tmp, files, dist_info)
    os.replace(tmp, out)
    return out


def _pypi_wheel(name: str, version: str) -> Path:
    """PyPI's py3-none-any wheel of `name==version`, downloaded once into dist/.cache/pypi."""
    cache = CACHE / "pypi"
    found = sorted(cache.glob(f"{name}-{version}-py3-none-any.whl"))
    if not found:
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.14", "-d", str(cache), f"{name}=={version}"])
        found = sorted(cache.glob(f"{name}-{version}-py3-none-any.whl"))
    if not found:
        raise SystemExit(f"pip download {name}=={version} gave no py3-none-any wheel")
    return found[0]


def demo_names() -> list[str]:
    """The demos: folders of demos/ with a page (demos/common holds shared code)."""
    return sorted(p.parent.name for p in (ROOT / "demos").glob("*/index.html"))


def build_demo_data() -> list[Path]:
    """The demos' data files (demos/data/: pinned packages converted, cached in dist/.cache)."""
    import importlib.util

    path = ROOT / "demos" / "data" / "__init__.py"
    if not path.exists():
        return []
    spec = importlib.util.spec_from_file_location("tensorgrad_demo_data", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_all(CACHE / "data")


def copy_pyscript(dest: Path) -> None:
    """PyScript's browser files (npm @pyscript/core's dist/: core.js, core.css and the chunks
    they import) into `dest`, checked against the pinned version."""
    package = ROOT / "node_modules" / "@pyscript" / "core"
    version = json.loads((package / "package.json").read_text())["version"]
    if version != PYSCRIPT_VERSION:
        raise SystemExit(f"node_modules has @pyscript/core {version}, want {PYSCRIPT_VERSION} "
                         "(run npm ci)")
    shutil.copytree(package / "dist", dest)
    (dest / "VERSION").write_text(version + "\n")


def build_web(snapshot: bool = True) -> Path:
    """Assemble dist/web/: Pyodide core (its stdlib with bytecode), micropip + packaging,
    PyScript, the tensorgrad wheel (with bytecode), web/ files, demos/, manifest.json and, unless
    `snapshot` is false, a Pyodide memory snapshot (webbundle.py). Built beside and swapped in,
    so a running server never sees half."""
    ensure_node_modules()
    wheel = build_wheel()
    tmp = DIST / f".web.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    core = tmp / "pyodide"
    core.mkdir(parents=True)
    npm_core = ROOT / "node_modules" / "pyodide"
    for fname in PYODIDE_CORE:
        shutil.copy2(npm_core / fname, core / fname)
    with zipfile.ZipFile(wheel) as zf:
        sources = {n: zf.read(n) for n in zf.namelist() if n.endswith(".py")}
    bytecode = webbundle.pyodide_bytecode(CACHE, npm_core, sources)
    if bytecode:
        shutil.copy2(bytecode[0], core / "python_stdlib.zip")
    lock = json.loads((npm_core / "pyodide-lock.json").read_text())
    for name, version in PYPI_WHEELS.items():
        entry = lock["packages"][name]
        if entry["version"] != version:
            raise SystemExit(f"pyodide-lock.json has {name} {entry['version']}, want {version}")
        src = _pypi_wheel(name, version)
        shutil.copy2(src, core / src.name)
        entry["file_name"], entry["sha256"] = src.name, _sha256(src)
    (core / "pyodide-lock.json").write_text(json.dumps(lock))
    copy_pyscript(tmp / "pyscript")
    webbundle.web_wheel(wheel, tmp, bytecode[1] if bytecode else {})
    if (ROOT / "web").is_dir():
        shutil.copytree(ROOT / "web", tmp, dirs_exist_ok=True)
    demos: list[str] = []
    if (ROOT / "demos").is_dir():
        demos = demo_names()
        shutil.copytree(ROOT / "demos", tmp / "demos",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "data"))
    data = build_demo_data()
    if data:
        (tmp / "data").mkdir()
        for path in data:
            shutil.copy2(path, tmp / "data" / path.name)
    manifest = {"version": wheel.name.split("-")[1], "pyodide": PYODIDE_VERSION,
                "pyscript": PYSCRIPT_VERSION,
                "indexURL": "pyodide/", "wheel": wheel.name, "demos": demos,
                "data": sorted(p.name for p in data)}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    landing_page(tmp / "index.html", manifest)
    if snapshot:
        inputs = [tmp / wheel.name, *(core / f for f in PYODIDE_CORE), tmp / "worker.mjs"]
        entry = webbundle.make_snapshot(tmp, CACHE, inputs, CHROMIUM, CHROMIUM_ARGS)
        if entry:
            manifest["snapshot"] = entry
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    old = DIST / f".web-old.{os.getpid()}"
    if WEB.exists():
        os.replace(WEB, old)
    os.replace(tmp, WEB)
    shutil.rmtree(old, ignore_errors=True)
    return WEB


def landing_page(path: Path, manifest: dict[str, Any]) -> None:
    """Fill the landing page (web/index.html, copied to `path`) with the bundle's version,
    wheel and demos: its `{{version}}`, `{{wheel}}` and `{{demos}}` markers."""
    links = "\n".join(f'<li><a href="demos/{d}/">{d}</a></li>' for d in manifest["demos"])
    template = path.read_text() if path.exists() else (
        "<!doctype html><meta charset=utf-8><title>tensorgrad</title>\n"
        "<h1>tensorgrad {{version}}</h1>\n<ul>\n{{demos}}\n</ul>\n")
    path.write_text(template.replace("{{version}}", manifest["version"])
                    .replace("{{wheel}}", manifest["wheel"]).replace("{{demos}}", links))


# ---------------------------------------------------------------------------------------------
# The documentation site (mkdocs.yml; its reference pages are generated by docsite.py).

DOCS = DIST / "docs"


def ensure_docs_deps() -> None:
    """The pinned mkdocs packages of the `docs` extra (pip, when one is missing)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["optional-dependencies"]["docs"]
    missing = [r for r in wanted if not _requirement_met(r)]
    if missing:
        run([sys.executable, "-m", "pip", "install", "-q", *missing])


def build_docs(site: Path = DOCS) -> Path:
    """`mkdocs build --strict` into `site` (dist/docs/): built beside and swapped in. Every
    asset comes from the installed packages (mkdocs.yml turns off web fonts)."""
    ensure_docs_deps()
    tmp = site.with_name(f".{site.name}.{os.getpid()}")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    try:
        run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f",
             str(ROOT / "mkdocs.yml"), "-d", str(tmp)], cwd=ROOT, env=env)
    except subprocess.CalledProcessError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(f"the docs did not build (mkdocs exit status {err.returncode})")
    old = site.with_name(f".{site.name}-old.{os.getpid()}")
    if site.exists():
        os.replace(site, old)
    os.replace(tmp, site)
    shutil.rmtree(old, ignore_errors=True)
    return site


class _WebHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with the MIME types the browser needs, never cached (wheels keep names)."""

    extensions_map: ClassVar[dict[str, str]] = {
        **http.server.SimpleHTTPRequestHandler.extensions_map, **MIME_TYPES}
    quiet: ClassVar[bool] = False
    mounts: ClassVar[dict[str, str]] = {}  # URL prefix ("/docs/") -> the folder it serves

    def _route(self, path: str) -> tuple[str, str]:
        """(the folder that serves `path`, the path inside it): a mount whose prefix starts
        the path, else the served folder."""
        for prefix, folder in self.mounts.items():
            if path.startswith(prefix) or path == prefix.rstrip("/"):
                return folder, "/" + path[len(prefix):]
        return self.directory, path

    def translate_path(self, path: str) -> str:
        folder, inner = self._route(path)
        served, self.directory = self.directory, folder
        try:
            return super().translate_path(inner)
        finally:
            self.directory = served

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def send_head(self) -> Any:
        if self.path == "/favicon.ico":  # browsers ask for it on every page: no console 404
            self.send_response(204)
            self.end_headers()
            return None
        if "\0" in urllib.parse.unquote(self.path):  # no file name holds one: say so, calmly
            self.send_error(400, "Bad request: a NUL byte in the path")
            return None
        if not self._inside_root():
            self.send_error(404, "File not found")
            return None
        return super().send_head()

    def _inside_root(self) -> bool:
        """Only files under the served folder: the resolved path (symlinks followed) must lie
        inside it, whatever the request's '..' or %-encoded forms; a folder only with an
        index.html (no listings)."""
        root = os.path.realpath(self._route(self.path)[0])
        path = os.path.realpath(self.translate_path(self.path))
        if path != root and not path.startswith(root + os.sep):
            return False
        if os.path.isdir(path):
            return os.path.isfile(os.path.join(path, "index.html"))
        return True

    def log_message(self, format: str, *args: object) -> None:
        if not self.quiet:
            super().log_message(format, *args)


def serve_web(port: int = 0, directory: Path = WEB, quiet: bool = False,
              mounts: dict[str, Path] | None = None) -> http.server.ThreadingHTTPServer:
    """A server for `directory` on 127.0.0.1:`port` (0: a free port), serving in a thread.
    `mounts` serves other folders under URL prefixes: {"/docs/": DIST / "docs"}."""
    routes = {("/" + p.strip("/") + "/"): str(folder) for p, folder in (mounts or {}).items()}
    handler = type("Handler", (_WebHandler,), {"quiet": quiet, "mounts": routes})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", port), functools.partial(handler, directory=str(directory)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="tensorgrad-web", daemon=True).start()
    return server


def server_url(server: http.server.ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"


CHROMIUM_ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


NO_SNAPSHOT_HELP = "no Pyodide memory snapshot (it needs Chromium; the worker starts Python)"


def cmd_wheel(args: argparse.Namespace) -> int:
    print(build_wheel())
    return 0


def cmd_web(args: argparse.Namespace) -> int:
    print(build_web(snapshot=not args.no_snapshot))
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    print(build_docs())
    return 0


def build_lite() -> Path:
    """The notebook sites (litebundle.py) over an assembled dist/web/: JupyterLite in
    dist/web/lite/ and the marimo page in dist/web/marimo/; installs pyproject's `lite` extra
    first (pinned jupyterlite-core, its Pyodide kernel, marimo)."""
    install_extra("lite")
    manifest = json.loads((WEB / "manifest.json").read_text())
    wheel = DIST / manifest["wheel"]
    litebundle.build_marimo(WEB, ROOT, wheel, CACHE / "pypi")
    return litebundle.build_lite(WEB, ROOT, wheel, CACHE / "pypi")


def cmd_lite(args: argparse.Namespace) -> int:
    build_web(snapshot=not args.no_snapshot)
    print(build_lite())
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    build_web(snapshot=not args.no_snapshot)
    build_docs()
    if not args.no_lite:
        build_lite()
    server = serve_web(args.port, mounts={"/docs/": DOCS})
    url = server_url(server)
    print(f"serving {WEB} at {url}  (the docs at {url}docs/, the demos at {url}demos/"
          + ("" if args.no_lite else f", JupyterLite at {url}lite/, marimo at {url}marimo/")
          + "; Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


_DEMO_FAIL_FAST = """
const fail = (error) => { window.tgDemo = { done: true, ok: false, error: String(error) }; };
addEventListener("error", (e) => fail(e.message));
addEventListener("unhandledrejection", (e) => fail(e.reason?.stack ?? e.reason));
"""


def cmd_demo(args: argparse.Namespace) -> int:
    """Open demos/NAME/ in headless Chromium and print its console until it reports done.

    A demo page reports the end by setting `window.tgDemo = {done: true, ok: bool, error?}`;
    everything it logs to the console is printed here as it comes. An uncaught error or
    unhandled rejection on the page ends the demo as failed."""
    from playwright.sync_api import sync_playwright

    install_browser_deps()
    if args.name not in demo_names():
        known = ", ".join(demo_names())
        raise SystemExit(f"no demo '{args.name}' in demos/ (known: {known or 'none'})")
    build_web()
    server = serve_web(quiet=True)
    entries = [(k, v) for k, v in (("steps", args.steps), ("seed", args.seed)) if v is not None]
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"--set takes KEY=VALUE (e.g. --set every=50), got {item!r}")
        entries.append((key, value))
    query = "&".join(f"{k}={urllib.parse.quote(str(v))}" for k, v in entries)
    url = f"{server_url(server)}demos/{args.name}/" + (f"?autostart=1&{query}" if query else "")
    print(f"demo {args.name}: {url}", flush=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.on("console", lambda m: print(f"[{m.type}] {m.text}", flush=True))
        page.on("pageerror", lambda e: print(f"[pageerror] {e}", flush=True))
        page.add_init_script(_DEMO_FAIL_FAST)
        page.goto(url)
        page.wait_for_function("window.tgDemo && window.tgDemo.done", timeout=args.timeout * 1000)
        state = page.evaluate("window.tgDemo")
        browser.close()
    server.shutdown()
    if not state.get("ok"):
        print(f"demo {args.name} failed: {state.get('error')}", flush=True)
        return 1
    figures = state.get("figures") or {}
    print(f"demo {args.name}: done " + " ".join(f"{k}={v}" for k, v in figures.items()),
          flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("test", help="install test dependencies and run every test")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_test)
    p = sub.add_parser("serve", help="build the wheel, dist/web/ and the docs, serve them on "
                       "127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--no-snapshot", action="store_true", help=NO_SNAPSHOT_HELP)
    p.add_argument("--no-lite", action="store_true", help="skip the JupyterLite site (/lite/)")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("demo", help="train a demo in headless Chromium, print its progress")
    p.add_argument("name")
    p.add_argument("--timeout", type=float, default=900, help="seconds")
    p.add_argument("--steps", type=int, help="training steps (default: a short headless run)")
    p.add_argument("--seed", type=int, help="data and init seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other config entry of the demo (repeatable), e.g. --set every=50")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("wheel", help="build dist/tensorgrad_webgpu-*.whl")
    p.set_defaults(func=cmd_wheel)
    p = sub.add_parser("lite", help="assemble dist/web/ and the JupyterLite site dist/web/lite/")
    p.add_argument("--no-snapshot", action="store_true", help=NO_SNAPSHOT_HELP)
    p.set_defaults(func=cmd_lite)
    p = sub.add_parser("web", help="assemble dist/web/")
    p.add_argument("--no-snapshot", action="store_true", help=NO_SNAPSHOT_HELP)
    p.set_defaults(func=cmd_web)
    p = sub.add_parser("docs", help="build the documentation site into dist/docs/")
    p.set_defaults(func=cmd_docs)
    argv = sys.argv[1:] if argv is None else list(argv)
    pytest_args = pytest_arguments(argv)
    if pytest_args is not None:  # everything after `test` goes to pytest: build.py test -k x
        return cmd_test(argparse.Namespace(pytest_args=pytest_args))
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
