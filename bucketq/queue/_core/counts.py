"""What the queue counts and reports: the size queries (ready, scheduled, leased
items), the drain report and the stats counters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...bucket.times import to_datetime
from .claims import not_leased


def ready_filter(now: float) -> dict[str, Any]:
    dnow = to_datetime(now)
    return {"mature": {"$lte": dnow}, **not_leased(dnow)}


def sched_filter(now: float) -> dict[str, Any]:
    dnow = to_datetime(now)
    return {"mature": {"$gt": dnow}, **not_leased(dnow)}


def leased_filter(now: float) -> dict[str, Any]:
    return {"lease.until": {"$gt": to_datetime(now)}}


def live_sum_pipeline(flt: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"$match": flt}, {"$group": {"_id": None, "n": {"$sum": "$live"}}}]


def sum_result(rows: Iterable[dict[str, Any]]) -> int:
    for r in rows:
        return int(r.get("n") or 0)
    return 0


#: What ``Queue.drain()``/``close()`` report: buckets written and items NOT stored by
#: the call (as ``StreamQueue.close()`` reports), items served to reserve() while it
#: drained, buckets released and items released unserved.
DRAIN_REPORT = ("buckets_written", "push_failed", "served", "released_buckets", "released_items")


def new_stats() -> dict[str, int]:
    return dict.fromkeys(
        (
            "pushed", "buckets_written", "insert_retries", "push_failed", "reserved", "committed",
            "rolled_back", "dead_lettered", "lease_losses", "claims", "takeovers", "state_flushes",
            "released", "reclaims", "write_concern_unconfirmed", "dead_letter_failed",
            "state_flush_errors", "quarantined", "loop_errors", "held_on_write",
            # The change-stream watcher's (bucket/_async/wake.py); 0 with change_streams=False.
            "change_stream_events", "change_stream_errors", "change_stream_fallbacks",
        ),
        0,
    )  # fmt: skip
