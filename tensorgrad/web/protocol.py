"""The worker protocol: every message kind, its payload fields with their types, and the shape
of its reply.

    page → worker   {id, kind, payload}               payload: an object with the fields below
    worker → page   {id, ok: true, result}            result: as `reply` says
                    {id, ok: false, error: {name, message, traceback}}
                    {kind: "progress", stage, ms, ...} stage: loading-pyodide | installing |
                                                       ready (with `protocol`: this table) | error
                    {kind: "post", id, data}          from tensorgrad.web.post() in a script

This table is the one description of the protocol: the worker validates every payload against
it (:func:`check_payload`), the page client ``web/tensorgrad.js`` receives it in the "ready"
message (:func:`as_json`) and validates every request before sending it, the Python page
client (:mod:`tensorgrad.web.client`) calls :func:`check_payload` before sending, and tests
check that the worker's handlers and both clients use exactly these kinds, fields and types.

Field types (:data:`TYPES`; a JS value as the worker receives it in Python: a boolean is a
bool, an integral number an int, any other number a float, NaN ``nan``, an object a dict, an
array a list, a typed array a memoryview of its element format, null and undefined None)::

    any           any value
    bool          a bool: true or false (never "false", 0 or 1)
    id            an integer id: a safe integer, |n| < 2**53 (never NaN, Infinity, 1.5, true,
                  "1" or a BigInt; in Python exactly an int, so not 1.0 either)
    integer       an integer, as above
    number        a finite number (never NaN or Infinity, never a bool)
    string        a string
    source        Python source (a string)
    expression    a Python expression, evaluated in the worker's namespace (a string)
    typedArray    a typed array: Float32Array, Float64Array, Int8/16/32Array, Uint8/16/32Array,
                  Uint8ClampedArray (in Python, a buffer of such an element format)
    float32Array  a Float32Array (in Python, a buffer of format 'f')
    inputDecl     a shape [n, ...] (integers; null for one free dim of a forward input), one
                  integer, [shape, dtype] or {shape, dtype?}; dtype a string
    plainData     plain data {kind, ...}: a record with a string `kind`
    inputArrays   a record {name: typedArray}
    inputDecls    a record {name: inputDecl}
    params        a record {name: float32Array}
    numbers       a record {name: number}
    optimizer     plain data {kind: "adam" | "adamw" | "sgd", lr, ...} or an expression
    lr            a number, a schedule as plain data {kind: "linear", ...} or an expression

A record is an object with string keys (in JS a plain object; in Python a mapping). The JS
client is stricter than the worker only where a JS value reaches Python looking like a valid
one: an ArrayBuffer or DataView (bytes, as a Uint8Array) and a Map (a dict). A message Pyodide
cannot convert (a Float16Array in it) is answered with a ProtocolError too. A payload
field that is null or undefined counts as absent: a required one is missing, an optional one
takes its default. A field of the wrong type is a :class:`~tensorgrad.errors.ProtocolError`
naming the kind, the field, what was expected and what came, e.g. ``reset: field 'params' must
be a bool, got str 'false'`` (``got string 'false'`` from the JS client); for a record, the
entry that is wrong (``got memoryview of format 'd' (3 items) for 'fc.W'``). Values the table
leaves open (a model's input names and sizes, an optimizer's own fields) are checked by the
API they go to.
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProtocolError
from .convert import is_js, typed_array_name

__all__ = ["EVENTS", "MESSAGES", "TYPES", "FieldType", "Message", "as_json", "check_event",
           "check_field", "check_payload", "describe"]

SAFE_INTEGER = 2 ** 53 - 1  # JS's Number.MAX_SAFE_INTEGER: larger ints are not exact there
TYPED_ARRAYS = ("Float32Array", "Float64Array", "Int8Array", "Int16Array", "Int32Array",
                "Uint8Array", "Uint16Array", "Uint32Array", "Uint8ClampedArray")


# -- the vocabulary of field types ------------------------------------------------------------
@dataclass(frozen=True)
class FieldType:
    """One field type: its name, a human-readable description (it completes "must be ..."),
    and either a predicate (a primitive type; the JS client has one of the same name), the
    type of a record's entries, or the types it may be one of."""

    name: str
    doc: str
    test: Callable[[Any], bool] | None = None
    record: str | None = None
    any_of: tuple[str, ...] = ()

    def problem(self, value: Any) -> str | None:
        """None when `value` has this type, else what came: ``got str 'false'`` (for a
        record, ``got ... for 'name'`` naming the wrong entry)."""
        if self.record is not None:
            if not _is_record(value):
                return f"got {describe(value)}"
            entry = TYPES[self.record]
            for key, item in value.items():
                if not isinstance(key, str):
                    return f"got a key {describe(key)}"
                if entry.problem(item) is not None:
                    return f"got {describe(item)} for {key!r}"
            return None
        if self.any_of:
            ok = any(TYPES[name].problem(value) is None for name in self.any_of)
            return None if ok else f"got {describe(value)}"
        assert self.test is not None
        return None if self.test(value) else f"got {describe(value)}"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"doc": self.doc}
        if self.record is not None:
            out["record"] = self.record
        if self.any_of:
            out["anyOf"] = list(self.any_of)
        return out


def _is_record(value: Any) -> bool:
    return isinstance(value, Mapping) and not is_js(value)


def _is_integer(value: Any) -> bool:
    # Exactly int: a bool is no integer, nor a JS BigInt (it arrives as pyodide's JsBigInt, an
    # int subclass; the JS client refuses it too).
    return type(value) is int and abs(value) <= SAFE_INTEGER


def _is_number(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_integer(value)


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def _is_shape(value: Any, wildcards: bool = True) -> bool:
    if _is_integer(value):
        return True
    return isinstance(value, (list, tuple)) and all(
        _is_integer(d) or (wildcards and d is None) for d in value)


def _is_input_decl(value: Any) -> bool:
    if _is_record(value):
        return ("shape" in value and set(value) <= {"shape", "dtype"}
                and _is_shape(value["shape"])
                and (value.get("dtype") is None or _is_string(value["dtype"])))
    if isinstance(value, (list, tuple)) and len(value) == 2 and _is_string(value[1]):
        return _is_shape(value[0])
    return _is_shape(value)


def _is_plain_data(value: Any) -> bool:
    return _is_record(value) and _is_string(value.get("kind")) and all(
        isinstance(k, str) for k in value)


TYPES: dict[str, FieldType] = {t.name: t for t in (
    FieldType("any", "any value", lambda v: True),
    FieldType("bool", "a bool", lambda v: isinstance(v, bool)),
    FieldType("id", "an integer id", _is_integer),
    FieldType("integer", "an integer", _is_integer),
    FieldType("number", "a finite number", _is_number),
    FieldType("string", "a string", _is_string),
    FieldType("source", "Python source (a string)", _is_string),
    FieldType("expression", "a Python expression (a string)", _is_string),
    FieldType("typedArray", "a typed array (Float32Array, Int32Array, ...)",
              lambda v: typed_array_name(v) in TYPED_ARRAYS),
    FieldType("float32Array", "a Float32Array", lambda v: typed_array_name(v) == "Float32Array"),
    FieldType("inputDecl", "a shape [n, ...] or [shape, dtype]", _is_input_decl),
    FieldType("plainData", "plain data {kind, ...}", _is_plain_data),
    FieldType("inputArrays", "a record {name: typed array}", record="typedArray"),
    FieldType("inputDecls", "a record {name: shape or [shape, dtype]}", record="inputDecl"),
    FieldType("params", "a record {name: Float32Array}", record="float32Array"),
    FieldType("numbers", "a record {name: number}", record="number"),
    FieldType("optimizer", "an optimizer: plain data {kind, lr, ...} or a Python expression",
              any_of=("plainData", "expression")),
    FieldType("lr", "a learning rate: a number, a schedule {kind, ...} or a Python expression",
              any_of=("number", "plainData", "expression")),
)}

_short = reprlib.Repr()
_short.maxstring, _short.maxother, _short.maxlist, _short.maxdict, _short.maxlevel = (
    40, 40, 4, 3, 2)


def describe(value: Any) -> str:
    """A value's type and a short repr, for messages: ``str 'false'``, ``float nan``,
    ``memoryview of format 'd' (3 items)``, ``JS Float64Array(3)``."""
    if value is None:
        return "None"
    if is_js(value):
        name = typed_array_name(value) or str(getattr(getattr(value, "constructor", None),
                                                      "name", "") or "object")
        length = getattr(value, "length", None)
        return f"JS {name}" + (f"({length})" if isinstance(length, int) else "")
    if not isinstance(value, (str, bytes, bytearray)):
        try:
            mv = memoryview(value)
        except TypeError:
            pass
        else:
            return (f"{type(value).__name__} of format {mv.format!r} "
                    f"({mv.nbytes // max(1, mv.itemsize)} items)")
    return f"{type(value).__name__} {_short.repr(value)}"


# -- messages ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Message:
    """One message kind: its required and optional payload fields ({field: type name}), and
    the reply's shape (the result object's fields, or a description of a plain value)."""

    kind: str
    required: Mapping[str, str]
    optional: Mapping[str, str] = field(default_factory=dict)
    reply: tuple[str, ...] | str = "null"
    doc: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "required", dict(self.required))
        object.__setattr__(self, "optional", dict(self.optional))
        unknown = sorted({*self.required.values(), *self.optional.values()} - set(TYPES))
        if unknown:
            raise ValueError(f"{self.kind}: field type(s) {unknown} are not in TYPES")

    @property
    def fields(self) -> tuple[str, ...]:
        return (*self.required, *self.optional)

    @property
    def types(self) -> dict[str, str]:
        """{field: type name}, required fields first."""
        return {**self.required, **self.optional}

    def as_json(self) -> dict[str, Any]:
        return {"required": list(self.required), "optional": list(self.optional),
                "types": self.types}


_GRAPH = ("graphId", "paramNames", "paramShapes", "paramCount")
_STEP_REPLY = "{kind: completed, loss, captures, captureShapes} | {kind: aborted} | " \
              "{kind: failed, error}"
_RUN_REPLY = "{kind: completed, output, outputShape, captures, captureShapes} | " \
             "{kind: aborted} | {kind: failed, error}"
_GID = {"graphId": "id"}

MESSAGES: dict[str, Message] = {m.kind: m for m in (
    Message("ping", {}, {"value": "any"}, ("pong", "python", "platform", "kinds"),
            "a round trip; which Python runs the worker, and the kinds it takes"),
    Message("exec", {"source": "source"}, {"filename": "string"},
            "repr of the last expression, or null",
            "run Python source in the worker's namespace (top-level await allowed)"),
    Message("load", {"url": "string"}, {}, "repr of the last expression, or null",
            "fetch Python source from a URL and run it like exec"),
    Message("runScript", {"source": "source"}, {"filename": "string"},
            "main()'s value (JSON-like) or its repr",
            "run source defining async def main() and await it; post() streams to the page"),
    Message("compile", {"model": "expression", "loss": "expression", "inputs": "inputDecls"},
            {"optimizer": "optimizer", "seed": "integer"}, (*_GRAPH, "kernelCount"),
            "compile a training step: model and loss are Python expressions in the namespace; "
            "optimizer an expression or plain data {kind: 'adam' | 'adamw' | 'sgd', lr, ...} "
            "with lr a number or a schedule {kind: 'linear', ...}"),
    Message("step", {**_GID, "inputs": "inputArrays"}, {}, _STEP_REPLY,
            "one training step; inputs {name: typed array}"),
    Message("run", {**_GID, "inputs": "inputArrays"}, {}, _RUN_REPLY, "run a forward graph"),
    Message("attach", {**_GID, "forward": "expression", "inputs": "inputDecls"},
            {"output": "string"}, _GRAPH,
            "a forward graph sharing a training graph's params (one null dim per input)"),
    Message("uploadParams", {**_GID, "params": "params"}, {"partial": "bool"}, "null",
            "write params {name: Float32Array}; every param unless partial (default false)"),
    Message("downloadParams", _GID, {}, "{name: Float32Array}",
            "every param, flat (shapes come with compile/attach as paramShapes)"),
    Message("reset", _GID, {"params": "bool", "optimizer": "bool"}, "null",
            "re-initialise params (same seed) and/or optimizer state (both by default)"),
    Message("setLR", {**_GID, "lr": "lr"}, {}, "null",
            "a new learning rate: a number, a schedule as plain data, or an expression"),
    Message("replaceModel", {**_GID, "model": "expression"},
            {"seed": "integer", "optimizer": "optimizer"}, (*_GRAPH[1:], "kernelCount"),
            "recompile for a new model; pending calls on the graph resolve aborted"),
    Message("destroy", _GID, {}, "null",
            "free a graph and the forward graphs attached to it"),
)}

# Messages the worker sends on its own (the JS client reads `stage`, `ms` and the ready
# message's fields, and routes posts by `id`, the runScript request's own id).
EVENTS: dict[str, Message] = {m.kind: m for m in (
    Message("progress", {"stage": "string", "ms": "number"},
            {"indexURL": "string", "lifeLock": "bool", "wheels": "any", "path": "string",
             "timings": "numbers", "install": "any", "python": "string", "protocol": "any",
             "error": "any"}, doc="start-up: loading-pyodide | installing | ready | error"),
    Message("post", {}, {"id": "any", "data": "any"},
            doc="tensorgrad.web.post(data) in a runScript script (id: that request's id)"),
)}


def check_field(kind: str, name: str, type_name: str, value: Any) -> None:
    """ProtocolError naming the kind, the field `name`, its type and what came, unless `value`
    is of the field type `type_name`."""
    field_type = TYPES[type_name]
    problem = field_type.problem(value)
    if problem is not None:
        raise ProtocolError(f"{kind}: field {name!r} must be {field_type.doc}, {problem}")


def _check(message: Message, payload: Any, what: str) -> Message:
    kind = message.kind
    expected = ", ".join([*message.required, *(f"{f}?" for f in message.optional)]) or "none"
    if payload is None and not message.required:
        return message
    if not _is_record(payload):
        raise ProtocolError(f"{kind}: the {what} must be an object {{{expected}}}, got "
                            f"{type(payload).__name__}")
    missing = [f for f in message.required if payload.get(f) is None]
    unknown = sorted(str(k) for k in set(payload) - set(message.fields))
    if missing or unknown:
        parts = ([f"missing {missing}"] if missing else []) + (
            [f"unknown {unknown}"] if unknown else [])
        raise ProtocolError(f"{kind}: {what} field(s) {' and '.join(parts)}; expected "
                            f"{{{expected}}}")
    for name, type_name in message.types.items():
        if payload.get(name) is not None:
            check_field(kind, name, type_name, payload[name])
    return message


def check_payload(kind: Any, payload: Any) -> Message:
    """The table's entry for `kind`; ProtocolError naming the kind and the field when the kind
    is unknown, or `payload` is not an object with exactly the table's fields, each of its
    type (null or undefined: absent)."""
    message = MESSAGES.get(kind) if isinstance(kind, str) else None
    if message is None:
        raise ProtocolError(f"unknown message kind {kind!r} (known: {', '.join(MESSAGES)})")
    return _check(message, payload, "payload")


def check_event(event: Any) -> Message:
    """The table's entry for an event the worker sends ({kind: "progress" | "post", ...});
    ProtocolError as for :func:`check_payload` (fields beyond the table's: unknown)."""
    kind = event.get("kind") if _is_record(event) else None
    message = EVENTS.get(kind) if isinstance(kind, str) else None
    if message is None:
        raise ProtocolError(f"unknown event kind {kind!r} (known: {', '.join(EVENTS)})")
    return _check(message, {k: v for k, v in event.items() if k != "kind"}, "event")


def as_json() -> str:
    """The table as JSON, as the JS client receives it: ``{messages: {kind: {required,
    optional, types: {field: type}}}, events: {...}, types: {name: {doc, record?, anyOf?}}}``
    (a type with neither record nor anyOf is a primitive the JS client checks by its name)."""
    return json.dumps({"messages": {k: m.as_json() for k, m in MESSAGES.items()},
                       "events": {k: m.as_json() for k, m in EVENTS.items()},
                       "types": {k: t.as_json() for k, t in TYPES.items()}})
