# GENERATED from bucketq/admin/_async/inspect.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""What the operator's tools read and do (``bucketq queues``, the metrics collector,
the console): list queues and streams with their counts, peek at items without
reserving them, and list, requeue or purge a queue's dead letters.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..._validate import printable
from ...bucket import CLAIM_SORT
from ...bucket.codec import collection
from ...bucket.damage import quarantine_name
from ...bucket.options import DLQ_SUFFIX, check_name
from ...bucket.writes import durable_write_concern
from ...errors import ConfigurationError
from ...queue import DeadLetters
from ...stream.core import META_SUFFIX
from .. import _core as core

log = logging.getLogger("bucketq.admin")

_now = time.time


class Inspector:
    """The operator's view of one database (a pymongo ``Database``)."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def _col(self, name: str) -> Any:
        # A dead letter's move (requeue, purge) writes on disk, as the queues do.
        return collection(self.db, name, durable_write_concern(None, self.db.write_concern))

    def names(self) -> tuple[list[str], list[str]]:
        """(bucket queues, streams) in the database, by name."""
        all_names = self.db.list_collection_names()
        candidates, streams = core.classify(all_names)
        queues = []
        for n in candidates:
            col = self._col(n)
            doc = col.find_one({}, {"mature": 1, "n": 1, "live": 1})
            if core.looks_like_bucket(doc):
                queues.append(n)
            elif doc is None and core.has_claim_index((col.list_indexes()).to_list()):
                queues.append(n)
        return queues, streams

    def queues(self, only: list[str] | None = None) -> list[core.QueueRow]:
        """One row per queue and stream (``only``: these names, queues or streams)."""
        queues, streams = self.names()
        if only is not None:
            queues = [q for q in queues if q in only]
            streams = [s for s in streams if s in only]
        rows = [self.queue_row(q) for q in queues]
        rows += [self.stream_row(s) for s in streams]
        return sorted(rows, key=lambda r: r.name)

    def queue_row(self, name: str) -> core.QueueRow:
        now = _now()
        col = self._col(name)
        row = core.QueueRow(name, "queue")
        core.apply_counts(row, (col.aggregate(core.counts_pipeline(now))).to_list())
        flt, sort = core.next_mature_query(now)
        doc = col.find_one(flt, {"mature": 1}, sort=sort)
        row.next_mature = doc["mature"] if doc else None
        flt, sort = core.head_query(now)
        doc = col.find_one(flt, {"mature": 1}, sort=sort)
        row.oldest_ready_s = core.age(now, doc["mature"]) if doc else None
        row.consumers = sorted(
            str(o) for o in col.distinct("lease.owner", core.leased_query(now)) if o
        )
        row.dead = self._live(name + DLQ_SUFFIX)
        row.quarantined = self._col(quarantine_name(name)).count_documents({})
        return row

    def stream_row(self, name: str) -> core.QueueRow:
        now = _now()
        meta = self._col(name + META_SUFFIX).find_one(core.meta_filter()) or {}
        acked = int(meta.get("acked", 0))
        row = core.QueueRow(name, "stream", next_seq=int(meta.get("next", 0)), acked=acked)
        col = self._col(name)
        res = (col.aggregate(core.stream_pending_pipeline(acked))).to_list()
        r = res[0] if res else {}
        row.buckets = int(r.get("buckets") or 0)
        row.ready = int(r.get("items") or 0)
        first = col.find_one(
            {"_id": {"$gt": acked}, "hole": {"$exists": False}, "stg": {"$exists": False}},
            {"at": 1},
            sort=[("_id", 1)],
        )
        row.oldest_ready_s = core.age(now, first.get("at")) if first else None
        row.quarantined = self._col(quarantine_name(name)).count_documents({})
        return row

    def _live(self, name: str) -> int:
        rows = (self._col(name).aggregate(core.live_sum_pipeline())).to_list()
        return int(rows[0].get("n") or 0) if rows else 0

    def is_stream(self, name: str) -> bool:
        return self._col(name + META_SUFFIX).find_one(core.meta_filter()) is not None

    def peek(self, name: str, n: int = 10) -> list[core.ItemView]:
        """The first ``n`` items of a queue in claim order (leased buckets too, marked)
        or of a stream after its acknowledged seq; nothing is reserved or changed."""
        n = _check_n(n)
        check_name(name)
        now = _now()
        stream = self.is_stream(name)
        if stream:
            meta = self._col(name + META_SUFFIX).find_one(core.meta_filter()) or {}
            flt: dict[str, Any] = {
                "_id": {"$gt": int(meta.get("acked", 0))},
                "hole": {"$exists": False},
                "stg": {"$exists": False},  # staged (Spark) buckets: not in the stream yet
            }
            sort: list[tuple[str, int]] = [("_id", 1)]
        else:
            flt, sort = {}, CLAIM_SORT
        out: list[core.ItemView] = []
        for doc in self._col(name).find(flt, sort=sort, batch_size=4):
            out.extend(core.item_views(doc, now, stream=stream))
            if len(out) >= n:
                break
        return out[:n]

    # -- dead letters ------------------------------------------------------------------------

    def dead(self, name: str, n: int = 100) -> list[core.ItemView]:
        """The dead letters of queue ``name`` (its ``<name>.dlq``), oldest first; their
        ``tries`` are those they had in ``name`` (``x-tries``)."""
        return [core.as_dead(v) for v in self.peek(check_name(name) + DLQ_SUFFIX, n)]

    def requeue_dead(self, name: str, ids: list[str] | None = None) -> dict[str, int]:
        """Put dead letters of ``name`` (these ids, or all) back in the queue they came
        from (``x-source-queue``, else ``name``) with their own headers and no tries.

        Each dead-letter bucket is leased by this call first (a consumer of the dead-letter
        queue cannot take it meanwhile), its items are pushed durably, then marked consumed
        with a write fenced on that lease: an item is never lost, and a crash in between
        can only leave a copy in both queues. A bucket a consumer holds is skipped
        (``busy``)."""
        return self._move_dead(name, ids, requeue=True)

    def purge_dead(self, name: str, ids: list[str] | None = None) -> dict[str, int]:
        """Delete dead letters of ``name`` (these ids, or all) for good."""
        return self._move_dead(name, ids, requeue=False)

    def _move_dead(self, name: str, ids: list[str] | None, *, requeue: bool) -> dict[str, int]:
        dead = DeadLetters(self.db, name)
        report = dead.requeue(ids) if requeue else dead.purge(ids)
        if report["items"]:
            log.info(
                "queue %s: %s %d dead letters", printable(name), "requeued" if requeue else "purged",
                report["items"],
            )  # fmt: skip
        return report


def _check_n(n: Any) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= core.MAX_PEEK:
        raise ConfigurationError(f"n must be a whole number from 1 to {core.MAX_PEEK}; got {n!r}.")
    return n
