"""Stored records from validated request items, and the checks every ingest route makes
before it hands records to the reservoir: the count limit and BSON encodability."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import bson

from ._http_errors import ApiError
from ._models import LogIn, MetricIn, SpanIn


def iso(t: datetime) -> str:
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).isoformat()


def check_count(n: int, limit: int) -> None:
    if n > limit:
        raise ApiError(
            413,
            "Too many records",
            f"{n} records in one request; at most {limit} (BUCKETQ_MAX_RECORDS).",
        )


#: What one request may store beyond its decoded body, per record: room for what OTLP
#: copies into every record (resource and scope attributes).
STORED_PER_RECORD = 8 * 1024


def encoded(records: list[dict[str, Any]]) -> tuple[int, list[tuple[int, str, str]]]:
    """(BSON bytes of the records BSON can encode, (index, field, why) of each record
    it cannot: a NUL in a key, a lone surrogate in a string, an integer over 64 bits),
    found here, before anything is queued, instead of failing at storage time."""
    total = 0
    bad = []
    for i, r in enumerate(records):
        try:
            total += len(bson.encode(r))
        except Exception as exc:  # noqa: BLE001 - InvalidDocument, UnicodeEncodeError, OverflowError
            field = next((k for k, v in r.items() if not _encodes({k: v})), "")
            bad.append((i, field, f"cannot be stored: {type(exc).__name__}: {exc}"[:300]))
    return total, bad


def _encodes(doc: dict[str, Any]) -> bool:
    try:
        bson.encode(doc)
        return True
    except Exception:  # noqa: BLE001
        return False


def check_amplification(stored: int, decoded: int, records: int) -> None:
    """413 when the records would take more than twice the decoded body plus
    :data:`STORED_PER_RECORD` per record: a small body must not fill the storage."""
    allowed = 2 * decoded + STORED_PER_RECORD * records
    if stored > allowed:
        raise ApiError(
            413,
            "Payload too large",
            f"Stored, these {records} records would take {stored} bytes from a body of "
            f"{decoded} bytes; at most {allowed} (twice the body plus "
            f"{STORED_PER_RECORD} per record). Put less in attributes shared by many "
            "records (OTLP resource and scope attributes are stored with every record), "
            "or send fewer records per request.",
        )


def check_storable(name: str, records: list[dict[str, Any]], decoded: int) -> None:
    """422 naming the first record BSON cannot store; 413 past :func:`check_amplification`."""
    size, bad = encoded(records)
    if bad:
        details = [
            {"index": i, "field": f"{name}[{i}].{f}" if f else f"{name}[{i}]", "message": why}
            for i, f, why in bad[:100]
        ]
        first = details[0]
        raise ApiError(422, "Validation error",
                       f"{first['field']} (record {first['index']}): {first['message']}. "
                       "Nothing of this request was stored.", details=details)  # fmt: skip
    check_amplification(size, decoded, len(records))


_HEX = re.compile(r"^[0-9a-fA-F]+$")


def text_id(v: str) -> str:
    """A trace or span id as stored: hex in lower case (one id whatever its case), any
    other text as given."""
    return v.lower() if _HEX.match(v) else v


def log_record(project: str, r: LogIn) -> dict[str, Any]:
    # Times stay datetimes (aware, UTC: the model made them so): storage keeps them as
    # they are, instead of parsing back the ISO text they would be made into here.
    rec = {"project_id": project, "time": r.time, "service": r.service, "level": r.level,
           "message": r.message}  # fmt: skip
    if r.metadata is not None:
        rec["metadata"] = r.metadata
    if r.trace_id is not None:
        rec["trace_id"] = text_id(r.trace_id)
    if r.span_id is not None:
        rec["span_id"] = text_id(r.span_id)
    if r.session_id is not None:
        rec["session_id"] = r.session_id
    if r.hostname is not None:
        rec["hostname"] = r.hostname
    return rec


def span_record(project: str, s: SpanIn) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "project_id": project, "trace_id": s.trace_id.lower(), "span_id": s.span_id.lower(),
        "service": s.service, "name": s.name, "kind": s.kind, "start_time": s.start_time,
    }  # fmt: skip
    if s.parent_span_id:
        rec["parent_span_id"] = s.parent_span_id.lower()
    if s.end_time is not None:
        rec["end_time"] = s.end_time
    if s.status is not None:
        rec["status"] = s.status.model_dump(exclude_none=True)
    if s.attributes is not None:
        rec["attributes"] = s.attributes
    return rec


def metric_record(project: str, m: MetricIn) -> dict[str, Any]:
    rec = {"project_id": project, "time": m.time, "service": m.service, "name": m.name,
           "type": m.type, "value": m.value}  # fmt: skip
    if m.labels is not None:
        rec["labels"] = m.labels
    return rec
