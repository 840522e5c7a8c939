"""OTLP/HTTP: decode export requests (protobuf or OTLP JSON) and map them onto the
service's records; encode the answers. Pure: no I/O.

Mapping: resource ``service.name`` -> ``service``; the other resource attributes ->
``metadata.resource``; severity number (or text) -> ``level``; body -> ``message``
(a non-string body as JSON); attributes -> ``metadata`` (spans: ``attributes``);
trace and span ids -> lower-case hex. A record that cannot be mapped (an id of the wrong
length, a service name, span name or message longer than the JSON API takes) is rejected
and counted in the answer's ``partial_success``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from ._models import LogIn, SpanIn

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: The google.rpc.Code of an error answer's Status, by HTTP status: google/rpc/code.proto's
#: own mapping (PERMISSION_DENIED is 403's, INVALID_ARGUMENT 400's), and for the statuses
#: it has none for, the nearest code (413 and 431, too large: RESOURCE_EXHAUSTED, as gRPC
#: answers a message over its limit; 405: UNIMPLEMENTED; 408: DEADLINE_EXCEEDED; 415 and
#: 422: INVALID_ARGUMENT); any other status UNKNOWN.
HTTP_TO_RPC = {400: code_pb2.INVALID_ARGUMENT, 401: code_pb2.UNAUTHENTICATED,
               403: code_pb2.PERMISSION_DENIED, 404: code_pb2.NOT_FOUND,
               405: code_pb2.UNIMPLEMENTED, 408: code_pb2.DEADLINE_EXCEEDED,
               409: code_pb2.ABORTED, 413: code_pb2.RESOURCE_EXHAUSTED,
               415: code_pb2.INVALID_ARGUMENT, 422: code_pb2.INVALID_ARGUMENT,
               429: code_pb2.RESOURCE_EXHAUSTED, 431: code_pb2.RESOURCE_EXHAUSTED,
               499: code_pb2.CANCELLED, 500: code_pb2.INTERNAL, 501: code_pb2.UNIMPLEMENTED,
               502: code_pb2.UNAVAILABLE, 503: code_pb2.UNAVAILABLE,
               504: code_pb2.DEADLINE_EXCEEDED}  # fmt: skip
_ID_KEYS = {"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"}
_SPAN_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
_STATUS = ("unset", "ok", "error")
_SEVERITY = ((4, "trace"), (8, "debug"), (12, "info"), (16, "warn"), (20, "error"), (24, "fatal"))
_TEXT_LEVELS = {"trace", "debug", "info", "warn", "warning", "error", "fatal", "critical"}


class OtlpError(ValueError):
    """The request cannot be decoded (HTTP 400) or is of an unsupported type (415)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def media_type(content_type: str | None) -> str | None:
    """``PROTOBUF`` or ``JSON`` for a Content-Type header, else None."""
    base = (content_type or "").split(";")[0].strip().lower()
    if base in (PROTOBUF, "application/protobuf"):
        return PROTOBUF
    if base == JSON:
        return JSON
    return None


def _hex_to_b64(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in _ID_KEYS and isinstance(v, str):
                try:
                    out[k] = base64.b64encode(bytes.fromhex(v)).decode()
                except ValueError:
                    raise OtlpError(f"{path}{k} must be a hex string; got {v[:80]!r}") from None
            else:
                out[k] = _hex_to_b64(v, f"{path}{k}.")
        return out
    if isinstance(node, list):
        return [_hex_to_b64(v, path) for v in node]
    return node


def _request_class(kind: str) -> Any:
    if kind == "logs":
        return logs_service_pb2.ExportLogsServiceRequest
    return trace_service_pb2.ExportTraceServiceRequest


def parse_protobuf(kind: str, body: bytes) -> Message:
    """The export request of ``kind`` ("logs" or "traces") from protobuf ``body``."""
    cls = _request_class(kind)
    msg = cls()
    try:
        msg.ParseFromString(body)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise OtlpError(f"The body is not a valid OTLP protobuf {cls.__name__}: {exc}") from None
    return msg


def from_json(kind: str, data: Any) -> Message:
    """The export request of ``kind`` from a decoded OTLP JSON document."""
    cls = _request_class(kind)
    if not isinstance(data, dict):
        raise OtlpError(f"The body must be a JSON object ({cls.__name__}).")
    msg = cls()
    try:
        json_format.ParseDict(_hex_to_b64(data), msg, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise OtlpError(f"The body is not a valid OTLP JSON {cls.__name__}: {exc}") from None
    return msg


def decode(kind: str, body: bytes, mtype: str) -> Message:
    """The export request of ``kind`` from ``body`` (no limits: the service decodes with
    ``_decode`` first)."""
    if mtype == PROTOBUF:
        return parse_protobuf(kind, body)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise OtlpError(f"The body is not valid JSON: {exc}") from None
    return from_json(kind, data)


_JSON_PATHS = {
    "logs": (("resourceLogs", "resource_logs"), ("scopeLogs", "scope_logs"),
             ("logRecords", "log_records")),
    "traces": (("resourceSpans", "resource_spans"), ("scopeSpans", "scope_spans"),
               ("spans",)),
}  # fmt: skip


def json_record_count(kind: str, data: Any) -> int:
    """How many records an OTLP JSON document carries (lengths only: nothing is mapped);
    a part of the wrong shape counts nothing (the mapping refuses it)."""

    def items(node: Any, names: tuple[str, ...]) -> list[Any]:
        if isinstance(node, dict):
            for n in names:
                v = node.get(n)
                if isinstance(v, list):
                    return v
        return []

    top, mid, leaf = _JSON_PATHS[kind]
    return sum(len(items(scope, leaf)) for group in items(data, top) for scope in items(group, mid))


class TooDeep(ValueError):
    """An attribute value nested past the service's depth limit."""


def _value(v: Any, depth: int, limit: int) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which in ("array_value", "kvlist_value") and depth >= limit:
        raise TooDeep(f"nested more than {limit} levels deep (BUCKETQ_MAX_DEPTH)")
    if which == "array_value":
        return [_value(x, depth + 1, limit) for x in v.array_value.values]
    if which == "kvlist_value":
        return _attrs(v.kvlist_value.values, depth + 1, limit)
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which)


def _attrs(kvs: Any, depth: int = 1, limit: int = 64) -> dict[str, Any]:
    """Attributes as a dict at nesting ``depth`` (1: a record's own); a value nested
    past ``limit`` raises :class:`TooDeep` naming its key."""
    out = {}
    for kv in kvs:
        if kv.key:
            try:
                out[kv.key] = _value(kv.value, depth, limit)
            except TooDeep as exc:
                raise TooDeep(f"attribute {kv.key[:100]!r} {exc}") from None
    return out


def _time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


def _level(number: int, text: str) -> str:
    if number > 0:
        for top, name in _SEVERITY:
            if number <= top:
                return name
        return "fatal"
    t = text.strip().lower()
    return t if t in _TEXT_LEVELS else "info"


def _max_length(model: Any, field: str) -> int:
    """The JSON API's ``max_length`` of ``model.field``: OTLP records get the same."""
    return next(
        m.max_length for m in model.model_fields[field].metadata if hasattr(m, "max_length")
    )


MAX_SERVICE = _max_length(LogIn, "service")
MAX_MESSAGE = _max_length(LogIn, "message")
MAX_SPAN_NAME = _max_length(SpanIn, "name")


def _too_long(what: str, text: str, limit: int) -> str:
    """Why a record is rejected when ``text`` is longer than ``limit``, else ``""``."""
    return f"{what} is longer than {limit} characters" if len(text) > limit else ""


def _resource(resource: Any, limit: int) -> tuple[str, dict[str, Any]]:
    attrs = _attrs(resource.attributes, 2, limit)  # stored under metadata.resource
    service = attrs.pop("service.name", None)
    return (str(service) if service else "unknown"), attrs


#: What a record converter gives back: the stored record, or why the record is rejected.
_Converted = dict[str, Any] | str


def _convert(
    resources: Any, scopes: str, items: str, limit: int,
    one: Callable[[Any, str, dict[str, Any], Any], _Converted],
) -> tuple[list[dict[str, Any]], int, str]:  # fmt: skip
    """(records, rejected, why): ``one(item, service, resource attributes, scope)`` for
    every item under every resource's ``scopes`` and every scope's ``items``; ``why`` is
    the first rejection's reason. Resource attributes nested past ``limit`` reject the
    resource's records."""
    out: list[dict[str, Any]] = []
    rejected = 0
    why = ""
    for group in resources:
        try:
            service, res = _resource(group.resource, limit)
            bad = _too_long("service.name", service, MAX_SERVICE)
        except TooDeep as exc:
            service, res, bad = "", {}, f"resource {exc}"
        for scope in getattr(group, scopes):
            for item in getattr(scope, items):
                try:
                    rec = bad or one(item, service, res, scope.scope)
                except TooDeep as exc:
                    rec = str(exc)
                if isinstance(rec, str):
                    rejected += 1
                    why = why or rec
                else:
                    out.append(rec)
    return out, rejected, why


def log_records(
    msg: Any, project: str, now: datetime, max_depth: int = 64
) -> tuple[list[dict[str, Any]], int, str]:
    """(records, rejected, why) for an ExportLogsServiceRequest; attribute values nested
    more than ``max_depth`` levels reject their record."""

    def one(lr: Any, service: str, res: dict[str, Any], scope: Any) -> _Converted:
        if len(lr.trace_id) not in (0, 16) or len(lr.span_id) not in (0, 8):
            return "trace_id must be 16 bytes and span_id 8 bytes"
        ns = lr.time_unix_nano or lr.observed_time_unix_nano
        try:
            body = _value(lr.body, 0, max_depth) if lr.HasField("body") else None
        except TooDeep as exc:
            return f"body {exc}"
        message = (
            body
            if isinstance(body, str)
            else ("" if body is None else json.dumps(body, default=str))
        )
        if len(message) > MAX_MESSAGE:
            return _too_long("body", message, MAX_MESSAGE)
        meta = _attrs(lr.attributes, 1, max_depth)
        if res:
            meta["resource"] = res
        if scope.name:
            meta["scope"] = scope.name
        rec: dict[str, Any] = {
            "project_id": project,
            "time": _time(ns) if ns else now,
            "service": service,
            "level": _level(lr.severity_number, lr.severity_text),
            "message": message,
        }
        if meta:
            rec["metadata"] = meta
        if lr.trace_id:
            rec["trace_id"] = lr.trace_id.hex()
        if lr.span_id:
            rec["span_id"] = lr.span_id.hex()
        return rec

    return _convert(msg.resource_logs, "scope_logs", "log_records", max_depth, one)


def span_records(
    msg: Any, project: str, now: datetime, max_depth: int = 64
) -> tuple[list[dict[str, Any]], int, str]:
    """(records, rejected, why) for an ExportTraceServiceRequest (``max_depth`` as for logs)."""

    def one(sp: Any, service: str, res: dict[str, Any], scope: Any) -> _Converted:
        if len(sp.trace_id) != 16 or len(sp.span_id) != 8:
            return "a span needs a 16-byte trace_id and an 8-byte span_id"
        if len(sp.name) > MAX_SPAN_NAME:
            return _too_long("name", sp.name, MAX_SPAN_NAME)
        t0, t1 = sp.start_time_unix_nano, sp.end_time_unix_nano
        if t0 and t1 and t1 < t0:
            return "a span's end_time_unix_nano is before its start_time_unix_nano"
        attrs = _attrs(sp.attributes, 1, max_depth)
        if res:
            attrs["resource"] = res
        # Without a start, the span starts at its end (duration 0), else at its arrival.
        start = _time(t0 or t1) if t0 or t1 else now
        rec: dict[str, Any] = {
            "project_id": project,
            "trace_id": sp.trace_id.hex(),
            "span_id": sp.span_id.hex(),
            "service": service,
            "name": sp.name or "unnamed",
            "kind": _SPAN_KINDS[sp.kind] if 0 <= sp.kind < len(_SPAN_KINDS) else "unspecified",
            "start_time": start,
            "status": {
                "code": _STATUS[sp.status.code] if 0 <= sp.status.code < 3 else "unset",
                **({"message": sp.status.message} if sp.status.message else {}),
            },
        }
        if sp.parent_span_id:
            rec["parent_span_id"] = sp.parent_span_id.hex()
        if t1:
            rec["end_time"] = _time(t1)
            rec["duration_ms"] = (t1 - (t0 or t1)) / 1e6
        if attrs:
            rec["attributes"] = attrs
        return rec

    return _convert(msg.resource_spans, "scope_spans", "spans", max_depth, one)


def success(kind: str, rejected: int, why: str, mtype: str) -> bytes:
    """The export response: ``partial_success`` only when something was rejected."""
    if kind == "logs":
        resp: Any = logs_service_pb2.ExportLogsServiceResponse()
        if rejected:
            resp.partial_success.rejected_log_records = rejected
    else:
        resp = trace_service_pb2.ExportTraceServiceResponse()
        if rejected:
            resp.partial_success.rejected_spans = rejected
    if rejected:
        resp.partial_success.error_message = why
    return encode(resp, mtype)


def status(http_status: int, message: str, mtype: str) -> bytes:
    """A google.rpc.Status body for an error answer."""
    return encode(
        status_pb2.Status(code=HTTP_TO_RPC.get(http_status, code_pb2.UNKNOWN), message=message),
        mtype,
    )


def encode(msg: Message, mtype: str) -> bytes:
    if mtype == PROTOBUF:
        return msg.SerializeToString()
    return json.dumps(json_format.MessageToDict(msg)).encode()
