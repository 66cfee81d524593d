"""The worker protocol has one table (tensorgrad/web/protocol.py): the worker handles exactly
its kinds, and the two page clients (web/tensorgrad.js, tensorgrad/web/client.py) send only
its kinds with its fields, of its types. check_payload checks every field's type. (At run time
both clients and the worker also check every message against the table; the browser tests
exercise that, and that the JS checks agree with these on the values the worker receives.)"""

from __future__ import annotations

import array
import ast
import inspect
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorgrad.errors import ProtocolError
from tensorgrad.web import client
from tensorgrad.web.protocol import (
    EVENTS,
    MESSAGES,
    TYPES,
    as_json,
    check_event,
    check_field,
    check_payload,
)
from tensorgrad.web.worker import HANDLERS

ROOT = Path(__file__).resolve().parents[2]


def _js_requests() -> list[tuple[str, set[str]]]:
    """(kind, literal payload fields) of every request("kind", {...}) in tensorgrad.js."""
    source = (ROOT / "web" / "tensorgrad.js").read_text()
    found = []
    for m in re.finditer(r'request\("(\w+)"(?:,\s*\{([^{}]*)\})?', source):
        fields = set()
        for part in (m.group(2) or "").split(","):
            part = part.strip()
            if part:
                fields.add(re.match(r"[A-Za-z_$][\w$]*", part).group(0))
        found.append((m.group(1), fields))
    return found


def _python_requests() -> list[tuple[str, set[str]]]:
    """(kind, payload fields) of every request(...) / _request(...) call in client.py with a
    literal kind (`_request` adds graphId)."""
    tree = ast.parse((ROOT / "tensorgrad" / "web" / "client.py").read_text())
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("request", "_request") and node.args
                and isinstance(node.args[0], ast.Constant)):
            continue
        fields: set[str] = set()
        if node.func.attr == "_request":
            fields = {"graphId", *(k.arg for k in node.keywords if k.arg)}
        elif len(node.args) > 1 and isinstance(node.args[1], ast.Dict):
            fields = {k.value for k in node.args[1].keys if isinstance(k, ast.Constant)}
        found.append((node.args[0].value, fields))
    return found


def test_the_worker_handles_exactly_the_tables_kinds():
    assert set(HANDLERS) == set(MESSAGES)


@pytest.mark.parametrize("client", ["js", "python"])
def test_clients_send_only_the_tables_kinds_and_fields(client):
    requests = _js_requests() if client == "js" else _python_requests()
    assert len(requests) >= 10
    for kind, fields in requests:
        assert kind in MESSAGES, f"{client} client sends unknown kind {kind!r}"
        extra = fields - set(MESSAGES[kind].fields)
        assert not extra, f"{client} client sends {kind} with fields {extra} not in the table"
    if client == "js":  # the JS client covers the whole protocol
        assert {k for k, _ in requests} == set(MESSAGES)


def test_check_payload_messages():
    with pytest.raises(ProtocolError, match=r"unknown message kind 'nope' \(known: ping, exec"):
        check_payload("nope", {})
    with pytest.raises(ProtocolError, match=r"^step: payload field\(s\) missing \['graphId'\] "
                       r"and unknown \['input'\]; expected \{graphId, inputs\}$"):
        check_payload("step", {"input": {}, "inputs": {}})
    with pytest.raises(ProtocolError, match=r"^exec: the payload must be an object "
                       r"\{source, filename\?\}, got str$"):
        check_payload("exec", "print(1)")
    assert check_payload("ping", None).kind == "ping"  # no required fields: no payload needed


def test_the_table_travels_as_json():
    table = json.loads(as_json())
    assert set(table["messages"]) == set(MESSAGES) and set(table["events"]) == set(EVENTS)
    assert table["messages"]["compile"] == {
        "required": ["model", "loss", "inputs"], "optional": ["optimizer", "seed"],
        "types": {"model": "expression", "loss": "expression", "inputs": "inputDecls",
                  "optimizer": "optimizer", "seed": "integer"}}
    assert table["types"]["bool"] == {"doc": "a bool"}
    assert table["types"]["params"] == {"doc": "a record {name: Float32Array}",
                                        "record": "float32Array"}
    assert table["types"]["lr"]["anyOf"] == ["number", "plainData", "expression"]


# -- field types ------------------------------------------------------------------------------
F32 = array.array("f", [1.0, 2.0])
GOOD: dict[str, dict[str, Any]] = {  # a valid payload of every kind
    "ping": {"value": [1, "two", None]},
    "exec": {"source": "1 + 1", "filename": "<cell>"},
    "load": {"url": "model.py"},
    "runScript": {"source": "async def main(): pass", "filename": "main.py"},
    "compile": {"model": "MLP()", "loss": "loss_fn",
                "inputs": {"x": [4, 2], "y": [[4], "i32"], "z": {"shape": [4], "dtype": "f32"},
                           "n": 3},
                "optimizer": {"kind": "adam", "lr": {"kind": "linear", "peak": 1e-3}},
                "seed": 0},
    "step": {"graphId": 1, "inputs": {"x": F32, "y": array.array("i", [1]),
                                      "z": np.zeros((2, 2), np.float32), "w": memoryview(F32)}},
    "run": {"graphId": 2, "inputs": {"x": np.zeros(3, np.int32), "b": bytes(4)}},
    "attach": {"graphId": 1, "forward": "lambda m, x: m(x)", "inputs": {"x": [None, 2]},
               "output": "logits"},
    "uploadParams": {"graphId": 1, "params": {"fc.W": F32, "fc.b": np.ones(2, np.float32)},
                     "partial": False},
    "downloadParams": {"graphId": 1},
    "reset": {"graphId": 1, "params": True, "optimizer": False},
    "setLR": {"graphId": 1, "lr": 1e-3},
    "replaceModel": {"graphId": 1, "model": "MLP(8)", "seed": -3,
                     "optimizer": "tg.optim.SGD(lr=0.1)"},
    "destroy": {"graphId": 2 ** 53 - 1},
}

# (kind, field, bad value, what the message says came). Every one passed check_payload before
# it checked types (it checked only that fields were present).
BAD: list[tuple[str, str, Any, str]] = [
    ("exec", "source", 5, "int 5"),
    ("exec", "filename", 3, "int 3"),
    ("load", "url", ["a.py"], "list ['a.py']"),
    ("runScript", "source", b"x = 1", "bytes b'x = 1'"),
    ("runScript", "filename", True, "bool True"),
    ("compile", "model", 1, "int 1"),
    ("compile", "loss", ["loss_fn"], "list ['loss_fn']"),
    ("compile", "inputs", [[2, 3]], "list [[2, 3]]"),
    ("compile", "inputs", {"x": "2, 3"}, "str '2, 3' for 'x'"),
    ("compile", "inputs", {"x": [2.5, 3]}, "list [2.5, 3] for 'x'"),
    ("compile", "inputs", {"x": [2, math.nan]}, "list [2, nan] for 'x'"),
    ("compile", "inputs", {"x": [True, 3]}, "list [True, 3] for 'x'"),
    ("compile", "inputs", {"x": [[2], 32]}, "list [[2], 32] for 'x'"),
    ("compile", "inputs", {"x": {"shape": [2], "dtype": 32}},
     "dict {'dtype': 32, 'shape': [2]} for 'x'"),
    ("compile", "inputs", {1: [2]}, "a key int 1"),
    ("compile", "optimizer", 0.01, "float 0.01"),
    ("compile", "optimizer", {"lr": 0.1}, "dict {'lr': 0.1}"),
    ("compile", "seed", 1.5, "float 1.5"),
    ("compile", "seed", "3", "str '3'"),
    ("compile", "seed", True, "bool True"),
    ("compile", "seed", math.nan, "float nan"),
    ("step", "graphId", math.nan, "float nan"),
    ("step", "graphId", math.inf, "float inf"),
    ("step", "graphId", -math.inf, "float -inf"),
    ("step", "graphId", 1.5, "float 1.5"),
    ("step", "graphId", 1.0, "float 1.0"),
    ("step", "graphId", "1", "str '1'"),
    ("step", "graphId", True, "bool True"),
    ("step", "graphId", 2 ** 60, "int 1152921504606846976"),
    ("step", "inputs", "zeros", "str 'zeros'"),
    ("step", "inputs", {"x": "zeros"}, "str 'zeros' for 'x'"),
    ("step", "inputs", {"x": [1.0, 2.0]}, "list [1.0, 2.0] for 'x'"),
    ("step", "inputs", {"x": array.array("q", [1])}, "array of format 'q' (1 items) for 'x'"),
    ("step", "inputs", {"x": np.zeros(2, np.float16)}, "ndarray of format 'e' (2 items) for 'x'"),
    ("run", "graphId", -math.inf, "float -inf"),
    ("run", "inputs", {"x": 1.5}, "float 1.5 for 'x'"),
    ("attach", "graphId", "1", "str '1'"),
    ("attach", "forward", 3, "int 3"),
    ("attach", "inputs", {"x": [None, "4"]}, "list [None, '4'] for 'x'"),
    ("attach", "output", 1, "int 1"),
    ("uploadParams", "graphId", math.nan, "float nan"),
    ("uploadParams", "params", {"fc.W": array.array("d", [1.0])},
     "array of format 'd' (1 items) for 'fc.W'"),
    ("uploadParams", "params", {"fc.W": np.zeros(2, np.int32)},
     "ndarray of format 'i' (2 items) for 'fc.W'"),
    ("uploadParams", "params", {"fc.W": [1.0]}, "list [1.0] for 'fc.W'"),
    ("uploadParams", "partial", "no", "str 'no'"),
    ("uploadParams", "partial", 0, "int 0"),
    ("uploadParams", "partial", 1, "int 1"),
    ("downloadParams", "graphId", math.inf, "float inf"),
    ("reset", "graphId", math.nan, "float nan"),
    ("reset", "params", "false", "str 'false'"),
    ("reset", "params", 0, "int 0"),
    ("reset", "optimizer", "true", "str 'true'"),
    ("reset", "optimizer", 1, "int 1"),
    ("setLR", "graphId", 1.5, "float 1.5"),
    ("setLR", "lr", math.nan, "float nan"),
    ("setLR", "lr", math.inf, "float inf"),
    ("setLR", "lr", True, "bool True"),
    ("setLR", "lr", [0.1], "list [0.1]"),
    ("setLR", "lr", {"peak": 1}, "dict {'peak': 1}"),
    ("replaceModel", "graphId", [1], "list [1]"),
    ("replaceModel", "model", 5, "int 5"),
    ("replaceModel", "seed", 2.5, "float 2.5"),
    ("replaceModel", "optimizer", 3, "int 3"),
    ("destroy", "graphId", "one", "str 'one'"),
]


def test_good_payloads_pass():
    assert set(GOOD) == set(MESSAGES)
    for kind, payload in GOOD.items():
        assert check_payload(kind, payload).kind == kind
        assert set(payload) == set(MESSAGES[kind].fields), kind  # every field exercised


@pytest.mark.parametrize(("kind", "field", "value", "got"), BAD,
                         ids=[f"{k}.{f}={v!r}"[:60] for k, f, v, _ in BAD])
def test_a_field_of_the_wrong_type_is_a_protocol_error(kind, field, value, got):
    doc = TYPES[MESSAGES[kind].types[field]].doc
    with pytest.raises(ProtocolError, match="^" + re.escape(
            f"{kind}: field '{field}' must be {doc}, got {got}") + "$"):
        check_payload(kind, {**GOOD[kind], field: value})


def test_every_typed_field_has_a_bad_case():
    covered = {(kind, field) for kind, field, _, _ in BAD}
    typed = {(kind, field) for kind, m in MESSAGES.items() for field, t in m.types.items()
             if t != "any"}
    assert typed - covered == set()


def test_the_messages_the_brief_names():
    with pytest.raises(ProtocolError, match=r"^reset: field 'params' must be a bool, got str "
                                            r"'false'$"):
        check_payload("reset", {"graphId": 1, "params": "false"})
    with pytest.raises(ProtocolError, match=r"^uploadParams: field 'partial' must be a bool, "
                                            r"got str 'no'$"):
        check_payload("uploadParams", {"graphId": 1, "params": {}, "partial": "no"})
    with pytest.raises(ProtocolError, match=r"^destroy: field 'graphId' must be an integer "
                                            r"id, got float nan$"):
        check_payload("destroy", {"graphId": math.nan})


def test_null_optional_fields_are_absent_and_null_required_ones_missing():
    check_payload("reset", {"graphId": 1, "params": None, "optimizer": None})
    with pytest.raises(ProtocolError, match=r"^reset: payload field\(s\) missing \['graphId'\]"):
        check_payload("reset", {"graphId": None})


def test_every_field_and_event_field_has_a_type_of_the_vocabulary():
    for table in (MESSAGES, EVENTS):
        for m in table.values():
            assert set(m.types) == set(m.fields) and set(m.types.values()) <= set(TYPES)
    for t in TYPES.values():
        parts = [t.test is not None, t.record is not None, bool(t.any_of)]
        assert sum(parts) == 1, t.name
        assert {t.record, *t.any_of} - {None} <= set(TYPES), t.name


def _js_field_checks() -> set[str]:
    source = (ROOT / "web" / "tensorgrad.js").read_text()
    body = re.search(r"export const FIELD_CHECKS = \{(.*?)\n\};", source, re.DOTALL).group(1)
    return set(re.findall(r"^  (\w+):", body, re.MULTILINE))


def test_the_js_client_checks_every_primitive_type_and_the_docstring_lists_every_type():
    primitives = {name for name, t in TYPES.items() if t.test is not None}
    assert _js_field_checks() == primitives
    from tensorgrad.web import protocol

    documented = set(re.findall(r"^    (\w+) {2,}", protocol.__doc__, re.MULTILINE))
    assert documented == set(TYPES)


def _js_defaults() -> list[tuple[str, str, Any]]:
    """(method, option, default) of the JS client's destructured defaults: `{ partial = false }`."""
    source = (ROOT / "web" / "tensorgrad.js").read_text()
    out = []
    for m in re.finditer(r"\n  (\w+)\([^)]*\{([^{}]*=[^{}]*)\} = \{\}\)", source):
        for name, value in re.findall(r"(\w+) = ([^,}]+)", m.group(2)):
            out.append((m.group(1), name, json.loads(value.strip())))
    return out


# The client methods that send a kind, by name.
_JS_METHODS = {"uploadParams": "uploadParams", "reset": "reset"}
_PY_METHODS = {"upload_params": "uploadParams", "reset": "reset", "ping": "ping",
               "compile": "compile", "replace_model": "replaceModel"}
_PY_FIELDS = {"lr": "lr"}


def test_the_clients_defaults_have_the_tables_types():
    js = [(m, f, v) for m, f, v in _js_defaults() if m in _JS_METHODS]
    assert {(m, f) for m, f, _ in js} == {("uploadParams", "partial"), ("reset", "params"),
                                         ("reset", "optimizer")}
    for method, field, value in js:
        check_field(method, field, MESSAGES[_JS_METHODS[method]].types[field], value)
    checked = 0
    for cls in (client.Session, client.RemoteForward, client.RemoteTraining):
        for name, kind in _PY_METHODS.items():
            fn = getattr(cls, name, None)
            if fn is None:
                continue
            for p in inspect.signature(fn).parameters.values():
                types = MESSAGES[kind].types
                if p.name in types and p.default is not inspect.Parameter.empty and \
                        p.default is not None:
                    check_field(kind, p.name, types[p.name], p.default)
                    checked += 1
    assert checked >= 3


def test_events_are_checked_too():
    check_event({"kind": "progress", "stage": "ready", "ms": 12.5, "timings": {"totalMs": 3},
                 "protocol": {}, "install": {}, "python": "0.29"})
    check_event({"kind": "post", "id": 3, "data": {"loss": 1.0}})
    with pytest.raises(ProtocolError, match=r"^progress: field 'ms' must be a finite number, "
                                            r"got float nan$"):
        check_event({"kind": "progress", "stage": "ready", "ms": math.nan})
    with pytest.raises(ProtocolError, match=r"^progress: field 'timings' must be a record "
                                            r"\{name: number\}, got str '3' for 'totalMs'$"):
        check_event({"kind": "progress", "stage": "ready", "ms": 1, "timings": {"totalMs": "3"}})
    with pytest.raises(ProtocolError, match=r"^unknown event kind 'snapshot'"):
        check_event({"kind": "snapshot"})


def _handler_reads() -> dict[str, list[tuple[str, Any]]]:
    """{kind: [(field, default)]} of what each worker handler reads from its payload:
    ``payload["f"]``, ``"f" in payload`` (default: the marker ...), ``payload.get("f", d)``
    (default d, None without one)."""
    tree = ast.parse((ROOT / "tensorgrad" / "web" / "worker.py").read_text())
    out: dict[str, list[tuple[str, Any]]] = {}
    for fn in tree.body:
        if not isinstance(fn, ast.AsyncFunctionDef):
            continue
        kinds = [d.args[0].value for d in fn.decorator_list if isinstance(d, ast.Call)
                 and getattr(d.func, "id", "") == "handler"]
        reads = out.setdefault(kinds[0], []) if kinds else None
        if reads is None:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "payload":
                reads.append((node.slice.value, ...))
            elif (isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In)
                  and getattr(node.comparators[0], "id", "") == "payload"):
                reads.append((node.left.value, ...))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and getattr(node.func.value, "id", "") == "payload"):
                default = ast.literal_eval(node.args[1]) if len(node.args) > 1 else None
                reads.append((node.args[0].value, default))
    return out


def test_the_handlers_read_the_tables_fields_with_defaults_of_their_types():
    reads = _handler_reads()
    assert set(reads) == set(MESSAGES)
    for kind, fields in reads.items():
        types = MESSAGES[kind].types
        for field, default in fields:
            assert field in types, f"the {kind} handler reads {field!r}, not in the table"
            if default is not None and default is not ...:
                check_field(kind, field, types[field], default)
    assert ("partial", False) in reads["uploadParams"] and ("params", True) in reads["reset"]
