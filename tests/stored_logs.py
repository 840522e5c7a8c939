"""The log records a store holds, read straight from its bucket documents (what a user
would find in the database): ``stored_logs(db, {"project_id": p})`` with a pymongo
database, ``await astored_logs(adb, ...)`` with an async one. A filter is equality per
field, ``{"$regex": ...}`` or ``{"$in": [...]}`` (what the tests ask)."""

from __future__ import annotations

import re
from typing import Any

from bucketq.reservoir import unpack_bucket

#: The collection of ``MongoReservoir``'s log buckets (no prefix).
BUCKETS = "log_buckets"


def _matches(rec: dict[str, Any], flt: dict[str, Any]) -> bool:
    for k, want in flt.items():
        got = rec.get(k)
        if isinstance(want, dict) and "$regex" in want:
            if not isinstance(got, str) or not re.search(want["$regex"], got):
                return False
        elif isinstance(want, dict) and "$in" in want:
            if got not in want["$in"]:
                return False
        elif got != want:
            return False
    return True


def _bucket_filter(flt: dict[str, Any]) -> dict[str, Any]:
    p = flt.get("project_id")
    return {"p": p} if isinstance(p, str) else {}


def stored_logs(db: Any, flt: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    flt = flt or {}
    return [
        r
        for b in db[BUCKETS].find(_bucket_filter(flt))
        for r in unpack_bucket(b)
        if _matches(r, flt)
    ]


async def astored_logs(adb: Any, flt: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    flt = flt or {}
    return [
        r
        for b in await adb[BUCKETS].find(_bucket_filter(flt)).to_list(None)
        for r in unpack_bucket(b)
        if _matches(r, flt)
    ]


def count_logs(db: Any, flt: dict[str, Any] | None = None) -> int:
    return len(stored_logs(db, flt))
