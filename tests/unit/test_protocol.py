"""The worker protocol has one table (tensorgrad/web/protocol.py): the worker handles exactly
its kinds, and the two page clients (web/tensorgrad.js, tensorgrad/web/client.py) send only
its kinds with its fields. (At run time both clients and the worker also check every message
against the table; the browser tests exercise that.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tensorgrad.errors import ProtocolError
from tensorgrad.web.protocol import MESSAGES, as_json, check_payload
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
    import json

    table = json.loads(as_json())
    assert set(table) == set(MESSAGES)
    assert table["compile"] == {"required": ["model", "loss", "inputs"],
                                "optional": ["optimizer", "seed"]}
