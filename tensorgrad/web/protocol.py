"""The worker protocol: every message kind, its payload fields and the shape of its reply.

    page → worker   {id, kind, payload}               payload: an object with the fields below
    worker → page   {id, ok: true, result}            result: as `reply` says
                    {id, ok: false, error: {name, message, traceback}}
                    {kind: "progress", stage, ms, ...} stage: loading-pyodide | installing |
                                                       ready (with `protocol`: this table) | error
                    {kind: "post", id, data}          from tensorgrad.web.post() in a script

This table is the one description of the protocol: the worker validates every payload against
it (:func:`check_payload`), the page client ``web/tensorgrad.js`` receives it in the "ready"
message and validates every request before sending it, and a test checks that the worker's
handlers, the JS client and the Python page client use exactly these kinds and fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ProtocolError

__all__ = ["EVENTS", "MESSAGES", "Message", "as_json", "check_payload"]


@dataclass(frozen=True)
class Message:
    """One message kind: required and optional payload fields, and the reply's shape (the
    result object's fields, or a description of a plain value)."""

    kind: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    reply: tuple[str, ...] | str = "null"
    doc: str = ""

    @property
    def fields(self) -> tuple[str, ...]:
        return self.required + self.optional


_GRAPH = ("graphId", "paramNames", "paramShapes", "paramCount")
_STEP_REPLY = "{kind: completed, loss, captures, captureShapes} | {kind: aborted} | " \
              "{kind: failed, error}"
_RUN_REPLY = "{kind: completed, output, outputShape, captures, captureShapes} | " \
             "{kind: aborted} | {kind: failed, error}"

MESSAGES: dict[str, Message] = {m.kind: m for m in (
    Message("ping", (), ("value",), ("pong", "python", "platform", "kinds"),
            "a round trip; which Python runs the worker, and the kinds it takes"),
    Message("exec", ("source",), ("filename",), "repr of the last expression, or null",
            "run Python source in the worker's namespace (top-level await allowed)"),
    Message("load", ("url",), (), "repr of the last expression, or null",
            "fetch Python source from a URL and run it like exec"),
    Message("runScript", ("source",), ("filename",), "main()'s value (JSON-like) or its repr",
            "run source defining async def main() and await it; post() streams to the page"),
    Message("compile", ("model", "loss", "inputs"), ("optimizer", "seed"),
            (*_GRAPH, "kernelCount"),
            "compile a training step: model, loss and optimizer are Python expressions in the "
            "namespace; optimizer may also be plain data {kind: 'adam' | 'adamw' | 'sgd', lr, "
            "...} with lr a number or a schedule {kind: 'linear', ...}"),
    Message("step", ("graphId", "inputs"), (), _STEP_REPLY,
            "one training step; inputs {name: typed array}"),
    Message("run", ("graphId", "inputs"), (), _RUN_REPLY, "run a forward graph"),
    Message("attach", ("graphId", "forward", "inputs"), ("output",), _GRAPH,
            "a forward graph sharing a training graph's params (one None dim per input)"),
    Message("uploadParams", ("graphId", "params"), ("partial",), "null",
            "write params {name: Float32Array}; every param unless partial"),
    Message("downloadParams", ("graphId",), (), "{name: Float32Array}",
            "every param, flat (shapes come with compile/attach as paramShapes)"),
    Message("reset", ("graphId",), ("params", "optimizer"), "null",
            "re-initialise params (same seed) and/or optimizer state (both by default)"),
    Message("setLR", ("graphId", "lr"), (), "null",
            "a new learning rate: a number, a schedule as plain data, or an expression"),
    Message("replaceModel", ("graphId", "model"), ("seed", "optimizer"),
            (*_GRAPH[1:], "kernelCount"),
            "recompile for a new model; pending calls on the graph resolve aborted"),
    Message("destroy", ("graphId",), (), "null",
            "free a graph and the forward graphs attached to it"),
)}

# Messages the worker sends on its own: kind -> fields.
EVENTS: dict[str, tuple[str, ...]] = {
    "progress": ("stage", "ms"),
    "post": ("id", "data"),
}


def check_payload(kind: Any, payload: Any) -> Message:
    """The table's entry for `kind`; ProtocolError naming the kind and the fields when the
    kind is unknown or `payload` is not an object with exactly the table's fields."""
    message = MESSAGES.get(kind) if isinstance(kind, str) else None
    if message is None:
        raise ProtocolError(f"unknown message kind {kind!r} (known: {', '.join(MESSAGES)})")
    expected = ", ".join([*message.required, *(f"{f}?" for f in message.optional)]) or "none"
    if payload is None and not message.required:
        return message
    if not isinstance(payload, Mapping):
        raise ProtocolError(f"{kind}: the payload must be an object {{{expected}}}, got "
                            f"{type(payload).__name__}")
    missing = [f for f in message.required if payload.get(f) is None]
    unknown = sorted(set(payload) - set(message.fields))
    if missing or unknown:
        parts = ([f"missing {missing}"] if missing else []) + (
            [f"unknown {unknown}"] if unknown else [])
        raise ProtocolError(f"{kind}: payload field(s) {' and '.join(parts)}; expected "
                            f"{{{expected}}}")
    return message


def as_json() -> str:
    """The table as JSON, as the JS client receives it: {kind: {required, optional}}."""
    return json.dumps({k: {"required": list(m.required), "optional": list(m.optional)}
                       for k, m in MESSAGES.items()})
