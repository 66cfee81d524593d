"""tensorgrad in the browser: the worker's message loop, the page clients and their protocol.

    protocol.py   the message table (kinds, typed payload fields, reply shapes) every side checks
    worker.py     the Python loop of tensorgrad's Web Worker (web/worker.mjs calls handle())
    client.py     the page client for Python on the page (PyScript): start(), check_webgpu()
    script.py     script mode: post() to the page, train_steps(), import_source()
    convert.py    values across the JS↔Python boundary

The JS side lives in ``web/`` (``tensorgrad.js``, the page client; ``worker.mjs``) and in
``tensorgrad/gpu/browser.mjs`` (the GPU adapter).
"""

from ..gpu import in_pyodide
from .client import RemoteForward, RemoteTraining, Session, check_webgpu, start
from .convert import flat_buffer, from_js, plain, to_js_value
from .script import TrainingRun, current_request, import_source, post, set_sink, train_steps

__all__ = ["RemoteForward", "RemoteTraining", "Session", "TrainingRun", "check_webgpu",
           "current_request", "flat_buffer", "from_js", "import_source", "in_pyodide", "plain",
           "post", "set_sink", "start", "to_js_value", "train_steps"]
