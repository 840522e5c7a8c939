"""Damaged buckets, with no I/O: what makes a stored bucket unusable, the record that
keeps it aside, and which of its items can still be recovered.

A bucket is damaged when its document cannot be what a writer wrote: the items binary
does not decode, its item count is not ``n``, a field is missing or of the wrong type.
Such a bucket is never delivered and never deleted silently: a consumer that claims it
moves it to the queue's quarantine collection ``<queue>.quarantine`` (insert there
first, then delete it from the queue, fenced by the claim), so the claims, sizes and
indexes of the queue stay those of good buckets. From there an operator lists it,
re-queues what can be recovered (the items that still decode, in a new bucket) or
removes it (``Queue.quarantined()`` and friends, or ``bucketq quarantine``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

import bson

from ..errors import DamagedBucket
from .document import done_bytes, is_consumed

__all__ = [
    "QUARANTINE_SUFFIX",
    "Recovery",
    "bucket_damage",
    "check_items",
    "quarantine_document",
    "quarantine_name",
    "recover",
    "summary",
]

QUARANTINE_SUFFIX = ".quarantine"


def quarantine_name(queue: str) -> str:
    return queue + QUARANTINE_SUFFIX


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _index_key(k: Any, n: int) -> bool:
    return isinstance(k, str) and k.isdigit() and int(k) < n


def bucket_damage(doc: dict[str, Any]) -> str | None:
    """Why a bucket queue's document cannot be served (None: its fields are sound).

    The items binary itself is checked when it is decoded (:func:`check_items`)."""
    n = doc.get("n")
    if not _is_int(n) or n < 1:
        return f"its item count n is {n!r}, not a whole number >= 1"
    if not isinstance(doc.get("items"), bytes):
        return f"its items field is {type(doc.get('items')).__name__}, not binary"
    if not isinstance(doc.get("mature"), datetime):
        return f"its mature field is {type(doc.get('mature')).__name__}, not a date"
    live = doc.get("live", n)
    if not _is_int(live) or not 0 <= live <= n:
        return f"its live count is {live!r}, not a whole number from 0 to n={n}"
    done = doc.get("done")
    if done is not None and (not isinstance(done, bytes) or len(done) != done_bytes(n)):
        return f"its done bitmap is not {done_bytes(n)} bytes of binary"
    tries = doc.get("tries")
    if tries is not None and (
        not isinstance(tries, dict)
        or not all(_index_key(k, n) and _is_int(v) and v >= 0 for k, v in tries.items())
    ):
        return "its tries map is not item indexes to whole numbers"
    nxt = doc.get("next")
    if nxt is not None and (
        not isinstance(nxt, dict)
        or not all(_index_key(k, n) and isinstance(v, datetime) for k, v in nxt.items())
    ):
        return "its next map is not item indexes to dates"
    lease = doc.get("lease")
    if lease is not None and not isinstance(lease, dict):
        return f"its lease is {type(lease).__name__}, not a document"
    return None


def check_items(items: list[Any], n: int, where: str) -> None:
    """Raise :class:`DamagedBucket` unless ``items`` are ``n`` item documents."""
    reason = None
    if len(items) != n:
        reason = f"it holds {len(items)} items but says n={n}"
    else:
        for i, it in enumerate(items):
            h = it.get("h")
            if "p" not in it:
                reason = f"its item {i} has no payload"
            elif h is not None and not isinstance(h, dict):
                reason = f"its item {i} has headers of type {type(h).__name__}"
            else:
                continue
            break
    if reason is not None:
        raise DamagedBucket(f"{where} is damaged: {reason}.", reason=reason)


def quarantine_document(
    doc: dict[str, Any], reason: str, at: datetime, source: str, owner: str
) -> dict[str, Any]:
    """The record kept in ``<queue>.quarantine``: the bucket as it was, and why."""
    return {"_id": doc["_id"], "bucket": doc, "reason": reason, "at": at, "source": source,
            "owner": owner}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Recovery:
    """What can be taken out of a damaged bucket: ``items`` (encoded, as pushed), in
    order, less those already consumed; ``lost`` counts the items that cannot be
    (as far as the bucket's own count tells)."""

    items: list[bytes]
    lost: int


def _walk(blob: bytes) -> list[bytes]:
    """The leading item documents of an items binary that decode, up to the first that
    does not (after damage the lengths that follow cannot be trusted)."""
    out: list[bytes] = []
    pos, end = 0, len(blob)
    while pos + 5 <= end:
        size = int.from_bytes(blob[pos : pos + 4], "little", signed=True)
        if size < 5 or pos + size > end:
            break
        chunk = blob[pos : pos + size]
        try:
            item = bson.decode(chunk)
        except Exception:  # noqa: BLE001 - any decoding failure ends the readable prefix
            break
        if "p" not in item:
            break
        out.append(chunk)
        pos += size
    return out


def recover(bucket: dict[str, Any]) -> Recovery:
    """The recoverable items of a quarantined bucket document."""
    blob = bucket.get("items")
    found = _walk(blob) if isinstance(blob, bytes) else []
    stored_n = bucket.get("n")
    n = stored_n if _is_int(stored_n) and stored_n >= 0 else len(found)
    done = bucket.get("done")
    if isinstance(done, bytes) and len(done) == done_bytes(n):
        consumed = {i for i in range(n) if is_consumed(done, i)}
    else:
        consumed = set()
    items = [it for i, it in enumerate(found) if i not in consumed]
    wanted = n - len(consumed)
    return Recovery(items, max(0, wanted - len(items)))


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """One quarantined bucket as ``quarantined()`` lists it."""
    bucket = record.get("bucket") or {}
    rec = recover(bucket)
    out = {
        "id": str(record["_id"]),
        "source": record.get("source"),
        "reason": record.get("reason"),
        "at": record.get("at"),
        "owner": record.get("owner"),
        "n": bucket.get("n"),
        "recoverable": len(rec.items),
        "lost": rec.lost,
    }
    if "requeued" in record:
        out["requeued"] = record["requeued"]
    return out
