"""``GET /api/v1/logs`` and the console's log pages: a page's filter and cursor (pure),
and :func:`read_page`, the one read of a page (the log store's, bounded by its page)."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from bson import ObjectId

from ..reservoir import LogCount, LogFilter, LogPage, PageBudget, log_sort_key

#: Stored bytes (BSON) one page may hold: a page of ``limit`` records of up to 1 MB
#: messages each would otherwise be built whole in memory (1,000 of them: gigabytes).
PAGE_BYTES = 4 * 1024 * 1024


async def read_page(svc: Any, project: str, flt: LogFilter, limit: int, budget_s: float) -> LogPage:
    """One page of ``project``'s records, as one of its reads (``svc.reads``: a project's
    readers beyond its limit wait a moment, then are refused), every query under
    pymongo's deadline of ``budget_s`` (the server gives up on it too: ``maxTimeMS``)."""
    from pymongo import timeout as mongo_timeout

    async with svc.reads.admit(project, budget_s):
        with mongo_timeout(budget_s):
            page: LogPage = await svc.storage.logstore.page(
                project, flt, limit=limit, max_bytes=PAGE_BYTES
            )
            return page


#: The most records offset paging reaches (``offset + limit``); past it, ``cursor`` goes on.
MAX_OFFSET = 10_000
#: Most pages an offset page reads to skip ``offset`` records (each is one store page).
OFFSET_READS = 32
#: What ``total`` reads at most: bucket summaries (and records unpacked, with ``q``, or at
#: the edges of a time range); past it the total is a lower bound (``total_exact`` false).
TOTAL_BUCKETS = 1000
TOTAL_RECORDS = 20_000


async def read_offset_page(
    svc: Any, project: str, flt: LogFilter, limit: int, offset: int, budget_s: float
) -> tuple[list[dict[str, Any]], tuple[datetime, str] | None, LogCount]:
    """The ``limit`` records after the first ``offset`` that ``flt`` keeps (newest first),
    the cursor of what follows them (None: nothing does), and how many ``flt`` keeps (a
    count bounded by :data:`TOTAL_BUCKETS`: exact, or a lower bound that says so), as
    one of ``project``'s reads under pymongo's deadline of ``budget_s``."""
    from pymongo import timeout as mongo_timeout

    from ._config import DEFAULT_QUERY_MAX_LIMIT

    store = svc.storage.logstore
    out: list[dict[str, Any]] = []
    nxt: tuple[datetime, str] | None = None
    skip = offset
    async with svc.reads.admit(project, budget_s):
        with mongo_timeout(budget_s):
            f = flt
            for _ in range(OFFSET_READS):
                ask = min(skip + limit - len(out), DEFAULT_QUERY_MAX_LIMIT)
                page: LogPage = await store.page(project, f, limit=ask, max_bytes=PAGE_BYTES)
                recs = page.records[skip:]
                skip = max(0, skip - len(page.records))
                room = limit - len(out)
                out.extend(recs[:room])
                if len(recs) > room or (out and page.next_before is not None):
                    nxt = log_sort_key(out[-1])
                if len(out) >= limit or page.next_before is None:
                    break
                if out and len(page.records) < ask:
                    break  # cut by its bytes or its read budget: the cursor goes on
                f = replace(flt, before=page.next_before)
            else:
                nxt = log_sort_key(out[-1]) if out else page.next_before
            total: LogCount = await store.count(
                project, flt, budget=PageBudget(buckets=TOTAL_BUCKETS, records=TOTAL_RECORDS)
            )
    return out, nxt, total


class CursorError(ValueError):
    """The cursor is not one this service handed out."""


def encode_cursor(before: tuple[datetime, str]) -> str:
    """The cursor of the page that starts below ``before`` (a page's ``next_before``)."""
    t, rid = before
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    raw = {"t": t.isoformat(), "i": rid}
    return base64.urlsafe_b64encode(json.dumps(raw, separators=(",", ":")).encode()).decode()


def decode_cursor(text: str) -> tuple[datetime, str]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(text.encode() + b"=" * (-len(text) % 4)))
        t = datetime.fromisoformat(raw["t"])
        oid = str(ObjectId(raw["i"]) if raw.get("o") else raw["i"])
        if t.tzinfo is None:
            raise ValueError
        # in UTC, as handed out: a forged offset past year 1 or 9999 fails here (not as
        # the query's encoding, which was answered as storage failing: 503)
        t = t.astimezone(UTC)
    except Exception:  # noqa: BLE001 - any damage means "not ours"
        raise CursorError(
            "cursor is not valid; pass the next_cursor of the previous page"
        ) from None
    return t, oid


def _one_or_any(values: str | Sequence[str] | None) -> str | frozenset[str] | None:
    if values is None or isinstance(values, str):
        return values or None
    kept = frozenset(v for v in values if v)
    if len(kept) > 1:
        return kept
    return next(iter(kept), None)


def logs_filter(
    *,
    service: str | Sequence[str] | None = None,
    level: str | Sequence[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    q: str | None = None,
    cursor: tuple[datetime, str] | None = None,
) -> LogFilter:
    """The filter of one page: ``since <= time < until``, the service and level (one, or
    any of several), ``q`` a case-insensitive substring of the message, older than
    ``cursor``."""
    levels = [level] if isinstance(level, str) else level
    return LogFilter(service=_one_or_any(service),
                     level=_one_or_any([x.lower() for x in levels] if levels else None),
                     since=since, until=until, q=q or None, before=cursor)  # fmt: skip


#: Levels of a stored value shown by a read; deeper parts are replaced by a note (the
#: ingest refuses deeper metadata, but other writers may have stored it).
SHOWN_DEPTH = 64
_SCALARS = (str, int, bool, type(None))


#: Fields every record shows (None when not stored), besides ``id``, ``time``, ``metadata``.
_SHOWN = ("service", "level", "message", "trace_id", "span_id", "session_id", "hostname")
#: LogTide's names of the fields whose bucketq names differ: a record shows both.
LOGTIDE_NAMES = {"trace_id": "traceId", "span_id": "spanId", "session_id": "sessionId"}
_NOT_SHOWN = frozenset({"_id", "time", "project_id", "metadata"})


def log_out(doc: dict[str, Any], project: str | None = None) -> dict[str, Any]:
    """A stored log document as the API shows it, whatever was stored: ``time`` an aware
    datetime (None when the stored one is not a time), every other value one JSON can
    carry (times in metadata as ISO 8601, other BSON types as text), nesting cut at
    :data:`SHOWN_DEPTH`, metadata that is not an object under ``value``. Every stored
    field is shown; the ids also under LogTide's names (``traceId``...), and ``project``
    as ``projectId``."""
    t = doc.get("time")
    time = (t if t.tzinfo else t.replace(tzinfo=UTC)) if isinstance(t, datetime) else None
    meta = doc.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        meta = {"value": meta}
    out: dict[str, Any] = {"id": str(doc.get("_id")), "time": time}
    for k in _SHOWN:
        v = doc.get(k)
        out[k] = v if v is None or isinstance(v, str) else str(plain(v, 1))
    out["metadata"] = None if meta is None else plain(meta, 1)
    for k, v in doc.items():  # a field another writer stored: shown, never dropped
        if isinstance(k, str) and k not in out and k not in _NOT_SHOWN:
            out[k] = plain(v, 1)
    for ours, theirs in LOGTIDE_NAMES.items():
        out[theirs] = out[ours]
    if project is not None:
        out["projectId"] = project
    return out


def render(body: dict[str, Any]) -> bytes:
    """``body`` as compact JSON (records' times made ISO 8601 by the caller)."""
    try:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate stored by another writer
        return json.dumps(body, separators=(",", ":")).encode()


def shown(doc: dict[str, Any], project: str) -> dict[str, Any]:
    """:func:`log_out` with ``time`` as ISO 8601 text."""
    rec = log_out(doc, project)
    rec["time"] = rec["time"].isoformat() if rec["time"] is not None else None
    return rec


def plain(v: Any, level: int) -> Any:
    """``v`` as JSON can carry it (see :func:`log_out`)."""
    if isinstance(v, _SCALARS):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, dict | list | tuple) and level > SHOWN_DEPTH:
        return f"(nested deeper than {SHOWN_DEPTH} levels: not shown)"
    if isinstance(v, dict):
        return {str(k): plain(x, level + 1) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x, level + 1) for x in v]
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).isoformat()
    if isinstance(v, bytes):
        return v.hex()
    return str(v)
