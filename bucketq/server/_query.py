"""``GET /api/v1/logs``: the MongoDB filter, sort and cursor of one page (pure), and
:func:`find_page`, the one read of a page (bounded in records and in bytes)."""

from __future__ import annotations

import base64
import json
import math
import re
from datetime import UTC, datetime
from typing import Any

import bson
from bson import ObjectId
from bson.raw_bson import RawBSONDocument

#: Newest first; ``_id`` breaks ties so a page boundary never skips or repeats.
SORT = [("time", -1), ("_id", -1)]
#: Stored bytes (BSON) one page may hold: a page of ``limit`` records of up to 1 MB
#: messages each would otherwise be built whole in memory (1,000 of them: gigabytes).
PAGE_BYTES = 4 * 1024 * 1024


async def find_page(
    collection: Any, flt: dict[str, Any], limit: int, *, max_bytes: int = PAGE_BYTES
) -> tuple[list[dict[str, Any]], bool]:
    """The first records of ``collection`` matching ``flt`` in :data:`SORT` order: at
    most ``limit``, and no more than ``max_bytes`` of stored BSON (the first record is
    taken whatever its size); and whether more records follow. Each record is decoded
    only once it is taken: the driver holds one batch at a time, not the whole page."""
    opts = collection.codec_options
    raw = collection.with_options(codec_options=opts.with_options(document_class=RawBSONDocument))
    docs: list[dict[str, Any]] = []
    size = 0
    more = False
    cursor = raw.find(flt).sort(SORT).limit(limit + 1)
    try:
        async for doc in cursor:
            n = len(doc.raw)
            if len(docs) == limit or (docs and size + n > max_bytes):
                more = True
                break
            docs.append(bson.decode(doc.raw, opts))
            size += n
    finally:
        await cursor.close()
    return docs, more


class CursorError(ValueError):
    """The cursor is not one this service handed out."""


def encode_cursor(doc: dict[str, Any]) -> str:
    """The cursor after ``doc``. A stored time that is not a time (another writer's)
    makes a cursor after every time: the pages end there."""
    t = doc.get("time")
    if not isinstance(t, datetime):
        t = datetime.min.replace(tzinfo=UTC)
    elif t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    oid = doc["_id"]
    raw = {"t": t.isoformat(), "i": str(oid), "o": isinstance(oid, ObjectId)}
    return base64.urlsafe_b64encode(json.dumps(raw, separators=(",", ":")).encode()).decode()


def decode_cursor(text: str) -> tuple[datetime, Any]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(text.encode() + b"=" * (-len(text) % 4)))
        t = datetime.fromisoformat(raw["t"])
        oid = ObjectId(raw["i"]) if raw.get("o") else str(raw["i"])
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


def logs_filter(
    project: str,
    *,
    service: str | None = None,
    level: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    q: str | None = None,
    cursor: tuple[datetime, Any] | None = None,
) -> dict[str, Any]:
    """The filter of one page: the key's project only, ``since <= time < until``,
    ``q`` as a case-insensitive substring of the message, older than ``cursor``."""
    flt: dict[str, Any] = {"project_id": project}
    if service:
        flt["service"] = service
    if level:
        flt["level"] = level.lower()
    rng: dict[str, Any] = {}
    if since is not None:
        rng["$gte"] = since
    if until is not None:
        rng["$lt"] = until
    if rng:
        flt["time"] = rng
    if q:
        flt["message"] = {"$regex": re.escape(q), "$options": "i"}
    if cursor is not None:
        t, oid = cursor
        flt = {"$and": [flt, {"$or": [{"time": {"$lt": t}}, {"time": t, "_id": {"$lt": oid}}]}]}
    return flt


#: Levels of a stored value shown by a read; deeper parts are replaced by a note (the
#: ingest refuses deeper metadata, but other writers may have stored it).
SHOWN_DEPTH = 64
_SCALARS = (str, int, bool, type(None))


def log_out(doc: dict[str, Any]) -> dict[str, Any]:
    """A stored log document as the API shows it, whatever was stored: ``time`` an aware
    datetime (None when the stored one is not a time), every other value one JSON can
    carry (times in metadata as ISO 8601, other BSON types as text), nesting cut at
    :data:`SHOWN_DEPTH`, metadata that is not an object under ``value``."""
    t = doc.get("time")
    time = (t if t.tzinfo else t.replace(tzinfo=UTC)) if isinstance(t, datetime) else None
    meta = doc.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        meta = {"value": meta}
    out: dict[str, Any] = {"id": str(doc.get("_id")), "time": time}
    for k in ("service", "level", "message", "trace_id", "span_id"):
        v = doc.get(k)
        out[k] = v if v is None or isinstance(v, str) else str(plain(v, 1))
    out["metadata"] = None if meta is None else plain(meta, 1)
    return out


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
