"""``GET /api/v1/logs``: the MongoDB filter, sort and cursor of one page. Pure."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime
from typing import Any

from bson import ObjectId

#: Newest first; ``_id`` breaks ties so a page boundary never skips or repeats.
SORT = [("time", -1), ("_id", -1)]


class CursorError(ValueError):
    """The cursor is not one this service handed out."""


def encode_cursor(doc: dict[str, Any]) -> str:
    t = doc["time"]
    if t.tzinfo is None:
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


def log_out(doc: dict[str, Any]) -> dict[str, Any]:
    """A stored log document as the API shows it."""
    out = {
        k: doc.get(k)
        for k in ("time", "service", "level", "message", "metadata", "trace_id", "span_id")
    }
    out["id"] = str(doc["_id"])
    if out["time"] is not None and out["time"].tzinfo is None:
        out["time"] = out["time"].replace(tzinfo=UTC)
    return out
