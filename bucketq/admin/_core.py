"""What an operator is shown about queues and streams, with no I/O: which collections
of a database are bucketq queues and streams, the queries behind their counts, one
row per queue, and items as ``peek`` shows them.

Counts come from one aggregation per queue over its bucket documents (the fields
``mature``, ``lease`` and ``live``; the items binary is never decoded), so they are
exact per bucket as stored: items a consumer committed but has not flushed yet (at
most ``state_flush_period``, 0.5 s) still count as leased.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from ..bucket import CLAIM_SORT, not_leased
from ..bucket.codec import decode_items
from ..bucket.convert import jsonable
from ..bucket.damage import QUARANTINE_SUFFIX
from ..bucket.document import is_consumed, item_id
from ..bucket.options import DLQ_SUFFIX
from ..bucket.times import to_datetime
from ..stream.core import META_ID, META_SUFFIX

__all__ = [
    "ItemView",
    "QueueRow",
    "Rates",
    "classify",
    "counts_pipeline",
    "item_views",
    "shorten",
]

#: Characters of a payload ``peek`` shows.
PREVIEW_CHARS = 200
#: Most items ``peek`` and ``dead list`` return at once.
MAX_PEEK = 1000
_AUX = (DLQ_SUFFIX, QUARANTINE_SUFFIX, META_SUFFIX)


@dataclass
class QueueRow:
    """One queue or stream as ``bucketq queues list`` shows it. Item counts; ``None``
    where a figure does not apply to the kind (a stream has no leases or mature times)."""

    name: str
    kind: str  # "queue" or "stream"
    buckets: int = 0
    ready: int = 0
    scheduled: int = 0
    leased: int = 0
    dead: int = 0
    quarantined: int = 0
    next_mature: datetime | None = None
    oldest_ready_s: float | None = None
    consumers: list[str] = field(default_factory=list)
    #: Streams: the last seq handed out and the last acknowledged (lag = the difference).
    next_seq: int | None = None
    acked: int | None = None

    @property
    def total(self) -> int:
        return self.ready + self.scheduled + self.leased

    @property
    def lag(self) -> int | None:
        return None if self.next_seq is None else self.next_seq - (self.acked or 0)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["total"] = self.total
        out["lag"] = self.lag
        out["next_mature"] = self.next_mature.isoformat() if self.next_mature else None
        return out


@dataclass
class ItemView:
    """One stored item as ``peek`` shows it, without reserving it."""

    id: str
    payload: str  # shortened
    size: int  # bytes of the encoded item
    headers: dict[str, Any] | None
    tries: int
    mature: datetime | None
    leased_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["mature"] = self.mature.isoformat() if self.mature else None
        out["headers"] = jsonable(self.headers)
        return out


def classify(names: list[str]) -> tuple[list[str], list[str]]:
    """(candidate bucket queues, streams) among a database's collection names: a stream
    is a name with ``<name>.meta``; the dead-letter (``.dlq``) queues of listed queues,
    quarantine and metadata collections are not rows of their own."""
    have = set(names)
    streams = sorted(n[: -len(META_SUFFIX)] for n in names if n.endswith(META_SUFFIX))
    stream_set = set(streams)
    queues = []
    for n in sorted(names):
        if n.startswith("system.") or n in stream_set or n.endswith(_AUX[1:]):
            continue
        if n.endswith(DLQ_SUFFIX) and n[: -len(DLQ_SUFFIX)] in have:
            continue
        queues.append(n)
    return queues, [s for s in streams if s in have or s + META_SUFFIX in have]


def looks_like_bucket(doc: dict[str, Any] | None) -> bool:
    return doc is not None and "mature" in doc and "n" in doc and "live" in doc


def has_claim_index(indexes: list[dict[str, Any]]) -> bool:
    return any(list(ix.get("key", {}).keys()) == [k for k, _ in CLAIM_SORT] for ix in indexes)


def counts_pipeline(now: float) -> list[dict[str, Any]]:
    """One pass over a queue's buckets: buckets, and items ready, leased and in all."""
    dnow = to_datetime(now)
    leased = {"$gt": ["$lease.until", dnow]}
    ready = {"$and": [{"$lte": ["$mature", dnow]}, {"$not": [leased]}]}
    return [
        {
            "$group": {
                "_id": None,
                "buckets": {"$sum": 1},
                "total": {"$sum": "$live"},
                "leased": {"$sum": {"$cond": [leased, "$live", 0]}},
                "ready": {"$sum": {"$cond": [ready, "$live", 0]}},
            }
        }
    ]


def apply_counts(row: QueueRow, rows: list[dict[str, Any]]) -> None:
    r = rows[0] if rows else {}
    row.buckets = int(r.get("buckets") or 0)
    row.ready = int(r.get("ready") or 0)
    row.leased = int(r.get("leased") or 0)
    row.scheduled = max(0, int(r.get("total") or 0) - row.ready - row.leased)


def live_sum_pipeline() -> list[dict[str, Any]]:
    return [{"$group": {"_id": None, "n": {"$sum": "$live"}}}]


def next_mature_query(now: float) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The first bucket no consumer holds that is not mature yet (its time is the next)."""
    dnow = to_datetime(now)
    return {"mature": {"$gt": dnow}, **not_leased(dnow)}, CLAIM_SORT


def head_query(now: float) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The first ready bucket in claim order (how long it has been claimable)."""
    dnow = to_datetime(now)
    return {"mature": {"$lte": dnow}, **not_leased(dnow)}, CLAIM_SORT


def leased_query(now: float) -> dict[str, Any]:
    return {"lease.until": {"$gt": to_datetime(now)}}


def stream_pending_pipeline(acked: int) -> list[dict[str, Any]]:
    """A stream's written buckets after ``acked`` (not holes, not staged) and their items."""
    return [
        {"$match": {"_id": {"$gt": acked}, "hole": {"$exists": False}, "stg": {"$exists": False}}},
        {"$group": {"_id": None, "buckets": {"$sum": 1}, "items": {"$sum": "$n"}}},
    ]


def meta_filter() -> dict[str, Any]:
    return {"_id": META_ID}


def age(now: float, t: datetime | None) -> float | None:
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return max(0.0, round(now - t.timestamp(), 3))


def shorten(value: Any, limit: int = PREVIEW_CHARS) -> str:
    text = json.dumps(jsonable(value), ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def item_views(doc: dict[str, Any], now: float, *, stream: bool = False) -> list[ItemView]:
    """The items of one bucket document not yet consumed, in push order. A bucket
    whose items do not decode yields one view saying so (a consumer will quarantine it)."""
    bid = doc["_id"]
    try:
        items = decode_items(doc.get("items") or b"")
    except Exception as exc:  # noqa: BLE001 - any damage is shown, not raised
        return [ItemView(f"{bid}", f"<damaged bucket: {exc}>", 0, None, 0, doc.get("mature"))]
    lease = doc.get("lease") or {}
    until = lease.get("until")
    holder = lease.get("owner") if until is not None and (age(now, until) or 0) == 0 else None
    tries = doc.get("tries") or {}
    nexts = doc.get("next") or {}
    views = []
    for i, it in enumerate(items):
        if not stream and is_consumed(doc.get("done"), i):
            continue
        payload = it.get("p")
        views.append(
            ItemView(
                id=f"{bid}.{i}" if stream else item_id(bid, i),
                payload=shorten(payload),
                size=len(json.dumps(jsonable(payload), default=str)),
                headers=it.get("h"),
                tries=int(tries.get(str(i), 0)),
                mature=nexts.get(str(i)) or (doc.get("at") if stream else doc.get("mature")),
                leased_by=holder,
            )
        )
    return views


def as_dead(view: ItemView) -> ItemView:
    """A dead letter's view with the tries it had in its queue (its ``x-tries`` header),
    not those in the dead-letter queue, where nobody took it yet."""
    tries = (view.headers or {}).get("x-tries")
    return replace(view, tries=tries) if isinstance(tries, int) else view


@dataclass
class Rates:
    """Per-second change of a queue's counts between two snapshots (``watch``, the console)."""

    total: float = 0.0
    ready: float = 0.0
    dead: float = 0.0

    @staticmethod
    def between(old: QueueRow | None, new: QueueRow, seconds: float) -> Rates:
        if old is None or seconds <= 0:
            return Rates()
        return Rates(
            round((new.total - old.total) / seconds, 2),
            round((new.ready - old.ready) / seconds, 2),
            round((new.dead - old.dead) / seconds, 2),
        )
