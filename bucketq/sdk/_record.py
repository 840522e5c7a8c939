"""Records: what the caller's thread keeps (cheap), and the wire form the server takes.

Pure: no I/O. What the caller's thread queues is as little as it can be:

- a ``logging`` record without exception or stack info: a :data:`Captured` tuple
  (:func:`capture`): its time, level number, logger name, the message formatted at call
  time (``record.getMessage()``: ``args`` are often mutable objects the caller changes
  next, and formatting costs a fraction of a microsecond) and its ``extra=``
  attributes appended to the same tuple (found by counting the record's attributes). The record itself is not kept: every object that outlives the call
  counts towards the next garbage collection in the caller's thread, and a record
  with its ``__dict__`` and ``args`` is three of them where this tuple is one, and one
  the collector stops tracking (see :func:`extra_of`). The server's level, ``trace_id``/``span_id``/``service`` and the
  metadata are worked out by a sender (:func:`wire`);
- a record with exception or stack info: an :data:`Item` built at once
  (:func:`from_log_record`), so the traceback is text and its frames are not held;
- ``Client.log``: an :data:`Item` (:func:`from_fields`).

A sender thread turns either into the JSON object of ``POST /api/v1/ingest`` with
:func:`wire`.
"""

from __future__ import annotations

import json
import logging
import math
import traceback
from datetime import UTC, datetime
from json.encoder import c_encode_basestring, c_make_encoder  # type: ignore[attr-defined]
from typing import Any

from ..errors import ConfigurationError

#: (created, level, message, service, metadata or None, trace_id or None, span_id or None)
Item = tuple[float, str, str, str, dict[str, Any] | None, str | None, str | None]
#: (created, levelno, logger name, message, k1, .., kn, v1, .., vn): see :func:`capture`;
#: its length is even (4 + 2n), an :data:`Item`'s is 7
Captured = tuple[Any, ...]
#: what the queue holds
Queued = Item | Captured

LEVELS = ("debug", "info", "warn", "error", "critical")
#: each level by its own name, and the stdlib's names for two of them
_LEVEL_ALIASES = {**{name: name for name in LEVELS}, "warning": "warn", "fatal": "critical"}

# The attributes every LogRecord has; everything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
_TOP_LEVEL = ("trace_id", "span_id", "service")
#: how many attributes a record made without ``extra=`` has (this Python's LogRecord)
_PLAIN = len(vars(logging.LogRecord("", 0, "", 0, "", None, None)))


def wire_level(levelno: int) -> str:
    """The server's level for a stdlib level number (custom levels round down)."""
    if levelno >= logging.CRITICAL:
        return "critical"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    if levelno >= logging.INFO:
        return "info"
    return "debug"


def level_name(level: object) -> str:
    """Normalise ``Client.log``'s level: a stdlib number or a name (``warning`` → ``warn``)."""
    if isinstance(level, int) and not isinstance(level, bool):
        return wire_level(level)
    if isinstance(level, str):
        name = _LEVEL_ALIASES.get(level.lower())
        if name is not None:
            return name
    raise ConfigurationError(
        f"level must be one of {', '.join(LEVELS)} (or a logging level number); got {level!r}."
    )


def format_exception(exc_info: Any) -> dict[str, str]:
    """``{"type", "message", "traceback"}`` for a ``sys.exc_info()`` triple."""
    etype, value, tb = exc_info
    return {
        "type": getattr(etype, "__qualname__", str(etype)),
        "message": str(value),
        "traceback": "".join(traceback.format_exception(etype, value, tb)).rstrip("\n"),
    }


def extra_of(record: logging.LogRecord) -> tuple[Any, ...] | None:
    """The record's ``extra=`` attributes as one flat tuple ``(k1, .., kn, v1, .., vn)``
    (values by reference), None when it has none.

    A tuple, not a dict: a tuple holding only strings, numbers and such is untracked by
    the garbage collector at its first collection, so queued records are never promoted
    to the old generation and never make a full collection (a walk over every object of
    the program) come sooner; a tuple holding a dict stays tracked."""
    d = record.__dict__
    if len(d) <= _PLAIN:
        return None
    keys = tuple(d.keys() - _STANDARD)  # one set operation in C, not a loop over ~25 names
    if not keys:
        return None
    return keys + tuple(map(d.__getitem__, keys))


def capture(record: logging.LogRecord) -> Captured:
    """What the caller's thread keeps of a record without exception or stack info: one
    tuple, the ``extra=`` attributes appended to it (one object outliving the call, not
    two: each one brings the next garbage collection in the caller's thread closer)."""
    head = (record.created, record.levelno, record.name, record.getMessage())
    extra = extra_of(record)
    return head if extra is None else head + extra


def _split(name: str, extra: tuple[Any, ...] | None, service: str
           ) -> tuple[dict[str, Any], str, str | None, str | None]:  # fmt: skip
    """(metadata, service, trace_id, span_id) of a record's ``extra=`` attributes (the
    flat tuple of :func:`extra_of`)."""
    meta: dict[str, Any] = {"logger": name}
    trace_id = span_id = None
    if not extra:
        return meta, service, None, None
    n = len(extra) // 2
    for k, v in zip(extra[:n], extra[n:], strict=True):
        if k == "trace_id":
            trace_id = None if v is None else str(v)
        elif k == "span_id":
            span_id = None if v is None else str(v)
        elif k == "service":
            if isinstance(v, str) and 0 < len(v) <= 100:
                service = v
        else:
            meta[k] = v
    return meta, service, trace_id, span_id


def from_log_record(record: logging.LogRecord, service: str) -> Item:
    """The :data:`Item` of a stdlib record: ``extra=`` fields become metadata (``trace_id``,
    ``span_id`` and ``service`` go to the top level), exception info goes to
    ``metadata["exception"]``, the logger's name to ``metadata["logger"]``."""
    meta, service, trace_id, span_id = _split(record.name, extra_of(record), service)
    if record.exc_info and record.exc_info[0] is not None:
        meta["exception"] = format_exception(record.exc_info)
    elif record.exc_text:
        meta["exception"] = {"traceback": record.exc_text}
    if record.stack_info:
        meta["stack"] = record.stack_info
    return (record.created, wire_level(record.levelno), record.getMessage() or "(empty)",
            service, meta, trace_id, span_id)  # fmt: skip


def needs_item(record: logging.LogRecord) -> bool:
    """True when the caller's thread builds the whole :data:`Item` (exception or stack
    info: formatted at once, so no traceback and its frames are held in the queue)."""
    return bool(record.exc_info or record.exc_text or record.stack_info)


def from_fields(
    created: float, level: object, message: object, service: str, fields: dict[str, Any]
) -> Item:
    """The :data:`Item` of ``Client.log(level, message, **fields)``."""
    lvl = level_name(level)
    text = str(message) or "(empty)"
    trace_id = fields.pop("trace_id", None)
    span_id = fields.pop("span_id", None)
    svc = fields.pop("service", None)
    if isinstance(svc, str) and 0 < len(svc) <= 100:
        service = svc
    return (created, lvl, text, service, fields or None,
            None if trace_id is None else str(trace_id),
            None if span_id is None else str(span_id))  # fmt: skip


_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text


def iso_time(created: float) -> str:
    """``created`` (seconds since the epoch) as ISO 8601 UTC with milliseconds, the
    precision the server stores (a MongoDB date), cut like ``datetime.isoformat``. The
    text of the whole second is kept and reused: the senders format a batch of records
    from the same second at a fraction of ``datetime``'s cost."""
    global _second
    sec = int(created // 1)
    us = round((created - sec) * 1e6)
    if us >= 1_000_000:
        sec, us = sec + 1, us - 1_000_000
    cached = _second  # one tuple, replaced whole: a thread never sees half of an update
    if cached[0] != sec:
        cached = _second = (sec, datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{cached[1]}.{us // 1000:03d}+00:00"


def to_wire(item: Item) -> dict[str, Any]:
    """The JSON object of one log in ``POST /api/v1/ingest``'s ``logs`` array."""
    created, level, message, service, meta, trace_id, span_id = item
    out: dict[str, Any] = {
        "time": iso_time(created),
        "service": service,
        "level": level,
        "message": message,
    }
    if meta:
        out["metadata"] = meta
    if trace_id is not None:
        out["trace_id"] = trace_id
    if span_id is not None:
        out["span_id"] = span_id
    return out


def wire(item: Queued, service: str) -> dict[str, Any]:
    """The ingest JSON object of a queued entry (an :data:`Item` or a :data:`Captured`;
    ``service`` is the configuration's)."""
    if len(item) == 7:
        return to_wire(item)
    created, levelno, name, message = item[:4]
    meta, service, trace_id, span_id = _split(name, item[4:], service)
    out: dict[str, Any] = {
        "time": iso_time(created),
        "service": service,
        "level": wire_level(levelno),
        "message": message or "(empty)",
        "metadata": meta,
    }
    if trace_id is not None:
        out["trace_id"] = trace_id
    if span_id is not None:
        out["span_id"] = span_id
    return out


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)``: what JSON cannot carry is sent as its text, never dropped."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a broken __str__ still leaves a trace
        return f"<unprintable {type(value).__qualname__}>"


_MAX_DEPTH = 32


def sanitize(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` that JSON can carry: keys as text, NaN and infinities as text,
    containers as lists, anything else (and anything nested deeper than 32 levels, which
    also ends a reference cycle) as its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth >= _MAX_DEPTH:
        return json_default(value) if not isinstance(value, dict | list) else "<too deep>"
    if isinstance(value, dict):
        return {str(k): sanitize(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [sanitize(v, depth + 1) for v in value]
    return sanitize(json_default(value), depth + 1) if not isinstance(value, str) else value


# One encoder built once: json.dumps with options builds a JSONEncoder on every call,
# and JSONEncoder.encode builds its C encoder on every call; the C encoder itself is
# reusable (no circular-reference markers, so it holds no state: a cycle ends in
# RecursionError, which dumps answers with sanitize).
_c_encoder = (
    None
    if c_make_encoder is None or c_encode_basestring is None  # no C accelerator
    else c_make_encoder(
        None, json_default, c_encode_basestring, None, ":", ",", False, False, False
    )  # fmt: skip
)
_py_encoder = json.JSONEncoder(default=json_default, ensure_ascii=False, allow_nan=False,
                               separators=(",", ":"))  # fmt: skip


def _encode(value: Any) -> str:
    if _c_encoder is not None:
        return "".join(_c_encoder(value, 0))
    return _py_encoder.encode(value)  # pragma: no cover


def dumps(value: Any) -> str:
    """Compact JSON of ``value``; what JSON cannot carry (odd keys, NaN, cycles, objects) is
    sent as text instead of failing the whole batch."""
    try:
        return _encode(value)
    except (TypeError, ValueError, RecursionError, RuntimeError):
        # RuntimeError: an ``extra=`` dict or list changed by its thread while encoded.
        return json.dumps(sanitize(value), default=str, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":"))  # fmt: skip
