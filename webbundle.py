"""What makes the browser bundle start fast (build.py's `web` step calls these).

- Bytecode. The npm Pyodide's python_stdlib.zip holds only .py sources, so every import
  compiles in wasm: Pyodide's own start-up imports ~190 modules (asyncio, ast, inspect, typing,
  ...), 3-5 s of a 4-6 s start on a 2-core machine. Pyodide itself, run under Node at build
  time, compiles them (and tensorgrad's modules) to unchecked-hash .pyc files, which zipimport
  and site-packages imports load without looking at the source; the sources stay, for
  tracebacks. Cached in dist/.cache/pyc by content: Node runs when the stdlib or a module
  changes.
- A memory snapshot. Headless Chromium runs the bundle's worker with ?snapshot=make: Pyodide's
  memory after `import tensorgrad.web.worker`, gzipped. The worker restores it instead of
  starting Python and importing (see web/worker.mjs for when it may). Cached in
  dist/.cache/snapshot by the inputs' hashes; skipped where Playwright or Chromium is missing.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


_PYC_COMPILE = r"""
import importlib._bootstrap_external as be, importlib.util, json, sys, zipfile
job = json.load(open("/job/job.json"))
tag = sys.implementation.cache_tag
def pyc(data, filename):
    code = compile(data, filename, "exec", dont_inherit=True)
    return bytes(be._code_to_hash_pyc(code, importlib.util.source_hash(data), checked=False))
if job["stdlib"]:
    src = "/lib/python%d%d.zip" % sys.version_info[:2]
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(job["stdlib"], "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, data, zipfile.ZIP_DEFLATED)
            try:
                code = info.filename.endswith(".py") and pyc(data, f"{src}/{info.filename}")
            except SyntaxError:  # (none today) keep the source only
                code = None
            if code:
                out = zipfile.ZipInfo(info.filename + "c", date_time=info.date_time)
                zout.writestr(out, code, zipfile.ZIP_DEFLATED)
for name in job["sources"]:
    with open(f"/job/src/{name}", "rb") as f:
        data = f.read()
    with open(f"/job/out/{name}c", "wb") as f:
        f.write(pyc(data, name))
json.dump({"cache_tag": tag}, open("/job/result.json", "w"))
"""
_PYC_NODE = """
import { readFileSync } from "node:fs";
const [pyodideDir, jobDir, stdLibURL] = process.argv.slice(2);
const { loadPyodide } = await import(pyodideDir + "/pyodide.mjs");
const pyodide = await loadPyodide({ indexURL: pyodideDir + "/", ...(stdLibURL ? { stdLibURL } : {}) });
pyodide.mountNodeFS("/job", jobDir);
pyodide.runPython(readFileSync(jobDir + "/compile.py", "utf8"));
"""


def _run_pyodide_compile(cache: Path, npm_core: Path, stdlib_out: Path | None,
                         stdlib_in: Path | None, sources: dict[str, bytes]
                         ) -> tuple[str, dict[str, bytes]]:
    """Compile `sources` (name -> .py bytes) and, when `stdlib_out`, the whole stdlib zip, in
    Pyodide under Node; (cache tag, name -> .pyc bytes)."""
    job = cache / f"pyc-job.{os.getpid()}"
    shutil.rmtree(job, ignore_errors=True)
    for name, data in sources.items():
        (job / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (job / "out" / name).parent.mkdir(parents=True, exist_ok=True)
        (job / "src" / name).write_bytes(data)
    job.mkdir(parents=True, exist_ok=True)
    (job / "out").mkdir(exist_ok=True)
    (job / "compile.py").write_text(_PYC_COMPILE)
    (job / "run.mjs").write_text(_PYC_NODE)
    stdlib_tmp = "/job/stdlib.zip" if stdlib_out else None
    (job / "job.json").write_text(json.dumps({"stdlib": stdlib_tmp, "sources": sorted(sources)}))
    try:
        _run(["node", str(job / "run.mjs"), str(npm_core), str(job),
             str(stdlib_in) if stdlib_in else ""])
        tag = json.loads((job / "result.json").read_text())["cache_tag"]
        if stdlib_out:
            (job / "stdlib.zip").chmod(0o644)
            os.replace(job / "stdlib.zip", stdlib_out)
        return tag, {name: (job / "out" / f"{name}c").read_bytes() for name in sources}
    finally:
        shutil.rmtree(job, ignore_errors=True)


def pyodide_bytecode(cache_root: Path, npm_core: Path, sources: dict[str, bytes]
                     ) -> tuple[Path, dict[str, bytes]] | None:
    """The stdlib zip with .pyc beside every .py, and {path/__pycache__/mod.TAG.pyc: bytes} for
    `sources` (paths -> .py bytes), compiled by this Pyodide under Node; None without Node."""
    if not shutil.which("node"):
        print("build.py: no node: the browser bundle gets Pyodide's stdlib without bytecode "
              "(slower start-up)", flush=True)
        return None
    cache = cache_root / "pyc"
    cache.mkdir(parents=True, exist_ok=True)
    stdlib_src = npm_core / "python_stdlib.zip"
    key = hashlib.sha256(stdlib_src.read_bytes() + (npm_core / "pyodide.asm.wasm").read_bytes())
    key = key.hexdigest()[:16]
    stdlib = cache / f"python_stdlib-{key}.zip"
    tag_file = cache / f"cache_tag-{key}"

    def cached(data: bytes) -> Path:
        return cache / f"{key}-{hashlib.sha256(data).hexdigest()[:24]}.pyc"

    missing = {name: data for name, data in sources.items() if not cached(data).exists()}
    if missing or not stdlib.exists() or not tag_file.exists():
        out = None if stdlib.exists() else stdlib
        try:
            tag, compiled = _run_pyodide_compile(cache_root, npm_core, out,
                                                 stdlib if out is None else None, missing)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"build.py: compiling bytecode in Pyodide under Node failed ({exc}): the "
                  "bundle gets none (slower start-up)", flush=True)
            return None
        tag_file.write_text(tag)
        for name, data in compiled.items():
            cached(sources[name]).write_bytes(data)
    tag = tag_file.read_text()
    pycs = {}
    for name, data in sources.items():
        folder, _, module = name.rpartition("/")
        pycs[f"{folder}/__pycache__/{module[:-3]}.{tag}.pyc"] = cached(data).read_bytes()
    return stdlib, pycs


def web_wheel(wheel: Path, dest: Path, extra: dict[str, bytes]) -> Path:
    """`wheel` copied into `dest` with the files `extra` added (and listed in its RECORD)."""
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        infos = zin.infolist()
        record = next(i for i in infos if i.filename.endswith(".dist-info/RECORD"))
        lines = zin.read(record).decode().splitlines()
        for info in infos:
            if info is not record:
                zout.writestr(info, zin.read(info))
        for arc, data in sorted(extra.items()):
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr, info.compress_type = 0o644 << 16, zipfile.ZIP_DEFLATED
            zout.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            lines.insert(-1, f"{arc},sha256={digest.decode()},{len(data)}")
        zout.writestr(record, "\n".join(lines) + "\n")
    return out


_MAKE_SNAPSHOT = """() => new Promise((resolve, reject) => {
  const worker = new Worker("/worker.mjs?snapshot=make", { type: "module" });
  const fail = (message) => { worker.terminate(); reject(new Error(message)); };
  worker.onerror = (e) => fail(`the worker failed: ${e.message}`);
  worker.onmessage = (e) => {
    const m = e.data;
    if (m.kind === "progress" && m.stage === "error") fail(m.error.message + "\\n" + m.error.traceback);
    if (m.kind !== "snapshot") return;
    worker.terminate();
    const reader = new FileReader();
    reader.onload = () => resolve({ data: reader.result.split(",")[1], size: m.size,
                                    features: m.features, loadedPackages: m.loadedPackages });
    reader.readAsDataURL(new Blob([m.data]));
  };
})"""


def make_snapshot(web: Path, cache_root: Path, inputs: list[Path], chromium: Path,
                  chromium_args: list[str]) -> dict[str, Any] | None:
    """Pyodide's memory after `import tensorgrad.web.worker`, made by the worker of the bundle
    in `web` in headless Chromium, gzipped into `web`; the manifest's entry {file, size,
    features, loadedPackages}, or None (with a note) where Playwright or Chromium is missing.
    Cached by the hashes of `inputs` (the files that shape that memory) and of Chromium. Made in
    a child process (`python webbundle.py snapshot ...`): the caller may be driving Playwright
    itself (the browser tests build the bundle), and its sync API does not nest."""
    if importlib.util.find_spec("playwright") is None:
        print("build.py: no Playwright: the bundle gets no Pyodide snapshot (slower start-up)",
              flush=True)
        return None
    if not chromium.exists():
        print(f"build.py: no Chromium at {chromium}: the bundle gets no Pyodide snapshot",
              flush=True)
        return None
    digest = hashlib.sha256()
    for path in [*inputs, chromium]:
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    key = digest.hexdigest()[:16]
    cache = cache_root / "snapshot"
    data_file, meta_file = cache / f"{key}.bin.gz", cache / f"{key}.json"
    if not (data_file.exists() and meta_file.exists()):
        cache.mkdir(parents=True, exist_ok=True)
        tmp = data_file.with_name(f".{data_file.name}.{os.getpid()}")
        try:
            _run([sys.executable, str(Path(__file__).resolve()), "snapshot", str(web), str(tmp),
                  str(chromium), json.dumps(chromium_args)])
        except subprocess.CalledProcessError as exc:
            print(f"build.py: making the Pyodide snapshot failed ({exc}): the bundle gets none "
                  "(slower start-up)", flush=True)
            return None
        meta = json.loads(tmp.with_suffix(".json").read_text())
        tmp.with_suffix(".json").unlink()
        os.replace(tmp, data_file)
        meta_file.write_text(json.dumps(meta))
        print(f"build.py: Pyodide snapshot {meta['size'] >> 20} MiB "
              f"({data_file.stat().st_size >> 20} MiB gzipped)", flush=True)
    name = f"pyodide-snapshot-{key}.bin.gz"
    shutil.copy2(data_file, web / name)
    return {"file": name, **json.loads(meta_file.read_text())}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Static files for the snapshot's page, without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def _snapshot_main(web: Path, out: Path, chromium: Path, chromium_args: list[str]) -> None:
    """The child process: serve `web` on 127.0.0.1, have the worker in `chromium` make the
    snapshot; write it to `out` and its {size, features, loadedPackages} beside it (`out`
    with suffix .json)."""
    from playwright.sync_api import sync_playwright

    handler = functools.partial(_QuietHandler, directory=str(web))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(chromium), args=chromium_args)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
            got = page.evaluate(_MAKE_SNAPSHOT)
            browser.close()
    finally:
        server.shutdown()
    out.write_bytes(base64.b64decode(got.pop("data")))
    out.with_suffix(".json").write_text(json.dumps(got))


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] != "snapshot":
        raise SystemExit("usage: python webbundle.py snapshot WEB_DIR OUT_FILE CHROMIUM "
                         "CHROMIUM_ARGS_JSON")
    _snapshot_main(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]),
                   json.loads(sys.argv[5]))
