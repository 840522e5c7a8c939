"""Request bodies decoded within limits: every limit holds while the body is decoded,
before work proportional to what it carries. Pure: no I/O.

- :func:`decompress`: ``Content-Encoding`` gzip (every member) or deflate, in bounded
  steps with an output cap; a truncated or corrupt stream is a 400, more than the body
  limit a 413, another encoding a 415.
- :func:`json_records`: the records array of a JSON API body (the C decoder, once the
  values are counted): more than ``max_records`` is a 413; a record's field nested
  deeper than ``max_depth`` is refused naming the field (422); NaN and Infinity (not
  JSON), invalid UTF-8 and nesting too deep for the decoder (about 1,000 levels) are a
  400 "Malformed JSON" with the reason.
- :func:`json_document`: a whole JSON document (OTLP JSON) under the same rules.
- Both count the values a body holds before decoding it (:func:`check_values`): more
  than :data:`VALUES_PER_RECORD` per record the request may carry is a 413.
- :func:`protobuf_budget`: a walk of OTLP protobuf's wire format that counts records and
  fields and stops at the first one past its limit, before the message is parsed.
"""

from __future__ import annotations

import json
import re
import zlib
from json.scanner import make_scanner
from typing import Any, cast

from ._http_errors import ApiError, BodyTooLarge

#: Bytes decompressed per step (the output cap is checked between steps).
_STEP = 256 * 1024
_WS = re.compile(r"[ \t\n\r]*")
#: A JSON string (skipped whole) or one of the characters that start or follow a value.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[,\[{]')
#: Values (objects, arrays and items) a JSON body may hold per record it may carry.
VALUES_PER_RECORD = 128
ENCODINGS = ("identity", "gzip", "x-gzip", "deflate")


def malformed(why: str) -> ApiError:
    return ApiError(400, "Malformed JSON", f"The body is not valid JSON: {why}.")


def too_many(limit: int, what: str = "records") -> ApiError:
    return ApiError(
        413,
        "Too many records",
        f"More than {limit} {what} in one request; at most {limit} (BUCKETQ_MAX_RECORDS). "
        "Send them in smaller requests.",
    )


# -- Content-Encoding -------------------------------------------------------------------------


def encoding_of(header: str | None) -> str:
    """The one supported ``Content-Encoding`` named by ``header``, else a 415."""
    enc = (header or "identity").strip().lower() or "identity"
    if enc not in ENCODINGS:
        raise ApiError(
            415,
            "Unsupported media type",
            f"Content-Encoding {header!r} is not supported; send gzip, deflate or no encoding.",
        )
    return "gzip" if enc == "x-gzip" else enc


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` without its ``encoding`` (from :func:`encoding_of`): every gzip member,
    at most ``limit`` bytes (else :class:`BodyTooLarge`); a truncated or corrupt stream,
    or bytes after it, is a 400."""
    if encoding == "identity":
        return body
    out = bytearray()
    data = body
    while True:
        d = zlib.decompressobj(wbits=31 if encoding == "gzip" else _deflate_wbits(data))
        try:
            while data:
                out += d.decompress(data, min(_STEP, limit + 1 - len(out)))
                if len(out) > limit:
                    raise BodyTooLarge(limit)
                data = d.unconsumed_tail
                if d.eof:
                    break
        except zlib.error as exc:
            raise ApiError(
                400, "Bad request", f"The body is not valid {encoding}: {exc}."
            ) from None
        if not d.eof:
            raise ApiError(400, "Bad request", f"The {encoding} body is truncated.")
        data = d.unused_data
        if not data:
            return bytes(out)
        if encoding != "gzip" or data[:2] != b"\x1f\x8b":
            raise ApiError(400, "Bad request", f"The body has bytes after its {encoding} stream.")


def _deflate_wbits(data: bytes) -> int:
    """``deflate`` is the zlib format (RFC 9110), but some clients send raw deflate
    (no header): a zlib header is one whose method is 8 and whose two bytes are a
    multiple of 31; anything else is read as raw deflate."""
    zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    return 15 if zlib_header else -15


# -- JSON -----------------------------------------------------------------------------------


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_SCAN = cast(Any, make_scanner)(json.JSONDecoder(parse_constant=_refuse))


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise malformed(f"it is not UTF-8 ({exc.reason} at byte {exc.start})") from None


def too_many_values(budget: int) -> ApiError:
    return ApiError(
        413,
        "Payload too large",
        f"The body holds more than {budget} values (objects, arrays and the items in "
        f"them: {VALUES_PER_RECORD} per record of BUCKETQ_MAX_RECORDS); send smaller requests.",
    )


def few_values(body: bytes, budget: int) -> bool:
    """Whether ``body`` surely holds at most ``budget`` JSON values (commas and brackets
    bound them; one C pass each)."""
    return body.count(b",") + body.count(b"[") + body.count(b"{") <= budget


def check_values(text: str, budget: int) -> None:
    """413 when the JSON ``text`` holds more than ``budget`` values, before it is
    decoded: commas and brackets bound them (one C pass); only when they are more than
    the budget are strings skipped to count the real ones, stopping at the first past it."""
    if text.count(",") + text.count("[") + text.count("{") <= budget:
        return
    n = 0
    for m in _TOKEN.finditer(text):
        if m.end() - m.start() == 1:
            n += 1
            if n > budget:
                raise too_many_values(budget)


def depth(value: Any, limit: int) -> int:
    """Levels of objects and arrays in ``value``, counted up to ``limit + 1``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            if level > limit:
                return level
            stack.extend(
                (v, level + 1) for v in (node.values() if isinstance(node, dict) else node)
            )
    return deepest


def _document(text: str) -> Any:
    """The one JSON value ``text`` holds (whitespace around it allowed), else a 400."""
    start = _WS.match(text, 0).end()  # type: ignore[union-attr]
    try:
        value, end = _SCAN(text, start)
    except StopIteration:
        try:  # the C scanner does not say where; the full decoder does (bounded: counted)
            json.loads(text)
        except (ValueError, RecursionError) as exc:
            where = f" at character {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
            raise malformed(f"{getattr(exc, 'msg', exc)}{where}") from None
        raise malformed(f"expecting a value at character {start}") from None
    except json.JSONDecodeError as exc:
        raise malformed(f"{exc.msg} at character {exc.pos}") from None
    except ValueError as exc:  # NaN, Infinity
        raise malformed(str(exc)) from None
    except RecursionError:
        raise malformed("it is nested too deeply to decode") from None
    end = _WS.match(text, end).end()  # type: ignore[union-attr]
    if end != len(text):
        raise malformed(f"extra data at character {end}")
    return value


def json_records(body: bytes, field: str, *, max_records: int, max_depth: int) -> Any:
    """The value of ``field`` of the JSON object ``body`` (None when the body is not an
    object or has no ``field``: the model refuses that with a 422). Its values are
    counted before it is decoded (:func:`check_values`, 413); more than ``max_records``
    records is a 413; a record's field nested more than ``max_depth`` levels is a 422
    naming ``field[i].key``."""
    text = _text(body)
    check_values(text, VALUES_PER_RECORD * max_records)
    doc = _document(text)
    items = doc.get(field) if isinstance(doc, dict) else None
    if isinstance(items, list):
        if len(items) > max_records:
            raise too_many(max_records)
        for i, rec in enumerate(items):
            if type(rec) is dict:
                for k, v in rec.items():
                    check_depth(v, max_depth, field, i, k)
    return items


def check_depth(value: Any, max_depth: int, field: str, index: int, name: str) -> None:
    """A 422 naming ``field[index].name`` when ``value`` nests more than ``max_depth``
    levels."""
    # Only a container holding a container may be deeper than one level.
    t = type(value)
    for x in value.values() if t is dict else value if t is list else ():
        if type(x) is dict or type(x) is list:
            if depth(value, max_depth) > max_depth:
                raise too_deep(f"{field}[{index}].{name}", index, max_depth)
            return


def too_deep(name: str, index: int | None, max_depth: int) -> ApiError:
    """The 422 for a field nested past ``max_depth``."""
    message = f"nested more than {max_depth} levels deep (BUCKETQ_MAX_DEPTH)"
    return ApiError(
        422,
        "Validation error",
        f"{name}: {message}. Nothing of this request was stored.",
        details=[{"index": index, "field": name, "message": message}],
    )


def json_document(body: bytes, *, budget: int) -> Any:
    """The JSON document ``body`` (for OTLP JSON), refused (413) before it is decoded
    when it holds more than ``budget`` values."""
    text = _text(body)
    check_values(text, budget)
    return _document(text)


# -- OTLP protobuf wire format --------------------------------------------------------------

# The message fields of the OTLP export requests (field number -> the nested message's
# schema, or a tuple (schema, "record") for the repeated record field). Fields not named
# here are scalars, strings or bytes: skipped by their length.
_ANY: dict[int, Any] = {}
_KV: dict[int, Any] = {2: _ANY}
_ANY.update({5: {1: _ANY}, 6: {1: _KV}})  # array_value, kvlist_value
_RESOURCE = {1: _KV, 3: {}}
_SCOPE = {3: _KV}
_LOG = {5: _ANY, 6: _KV}
_SPAN = {9: _KV, 11: {3: _KV}, 13: {4: _KV}, 15: {}}
PROTOBUF_SCHEMAS = {
    "logs": {1: {1: _RESOURCE, 2: {1: _SCOPE, 2: (_LOG, "record")}}},
    "traces": {1: {1: _RESOURCE, 2: {1: _SCOPE, 2: (_SPAN, "record")}}},
}
#: Protobuf fields an OTLP body may hold per record it may carry.
FIELDS_PER_RECORD = 256
_WIRE_BAD = "The body is not a valid OTLP protobuf message"


def _varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    shift = 0
    value = 0
    while True:
        if i >= end or shift > 63:
            raise ApiError(400, "Bad request", f"{_WIRE_BAD}: a varint is truncated.")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def protobuf_budget(kind: str, body: bytes, *, max_records: int, max_fields: int) -> int:
    """Walk the wire format of an OTLP export request of ``kind`` without parsing it:
    the record past ``max_records`` (413) or the field past ``max_fields`` (413) stops
    the walk; a malformed frame is a 400. Depth first: its memory is the nesting's, not
    the body's. Returns the number of records."""
    records = 0
    fields = 0
    buf = body
    stack: list[tuple[int, int, dict[int, Any]]] = []
    schema: dict[int, Any] = PROTOBUF_SCHEMAS[kind]
    i, end = 0, len(body)
    while True:
        while i < end:
            fields += 1
            if fields > max_fields:
                raise ApiError(413, "Payload too large",
                               f"The body holds more than {max_fields} protobuf fields "
                               f"({FIELDS_PER_RECORD} per record of BUCKETQ_MAX_RECORDS); "
                               "send smaller requests.")  # fmt: skip
            if buf[i] < 0x80:
                tag = buf[i]
                i += 1
            else:
                tag, i = _varint(buf, i, end)
            wire = tag & 7
            if wire == 0:
                _, i = _varint(buf, i, end)
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            elif wire == 2:
                n, i = _varint(buf, i, end)
                start, i = i, i + n
                sub = schema.get(tag >> 3)
                if sub is not None and i <= end:
                    if isinstance(sub, tuple):
                        records += 1
                        if records > max_records:
                            raise too_many(max_records)
                        sub = sub[0]
                    stack.append((i, end, schema))  # on after the sub-message
                    i, end, schema = start, i, sub
                    continue
            else:
                raise ApiError(400, "Bad request", f"{_WIRE_BAD}: wire type {wire} at byte {i}.")
            if i > end:
                raise ApiError(400, "Bad request", f"{_WIRE_BAD}: a field runs past its end.")
        if i > end:
            raise ApiError(400, "Bad request", f"{_WIRE_BAD}: a field runs past its end.")
        if not stack:
            return records
        i, end, schema = stack.pop()
