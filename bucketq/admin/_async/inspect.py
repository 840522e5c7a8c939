"""What the operator's tools read and do (``bucketq queues``, the metrics collector,
the console): list queues and streams with their counts, peek at items without
reserving them, and list, requeue or purge a queue's dead letters.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from bson import ObjectId
from pymongo import ReturnDocument

from ..._validate import printable
from ...bucket import CLAIM_SORT, not_leased
from ...bucket.codec import collection
from ...bucket.damage import quarantine_name
from ...bucket.document import parse_item_id
from ...bucket.options import DLQ_SUFFIX, check_name
from ...bucket.times import to_datetime
from ...bucket.writes import durable_write_concern
from ...errors import ConfigurationError
from ...queue import AsyncQueue
from ...queue._core.held import HeldBucket, state_write
from ...stream.core import META_SUFFIX
from .. import _core as core

log = logging.getLogger("bucketq.admin")

_now = time.time
#: Owner of the lease this module takes on a dead-letter bucket while it moves its items.
ADMIN_OWNER = "bucketq-admin"
#: That lease, in seconds: longer than moving one bucket's items takes.
ADMIN_LEASE = 60.0


class AsyncInspector:
    """The operator's view of one database (a pymongo ``AsyncDatabase``)."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def _col(self, name: str) -> Any:
        # A dead letter's move (requeue, purge) writes on disk, as the queues do.
        return collection(self.db, name, durable_write_concern(None, self.db.write_concern))

    async def names(self) -> tuple[list[str], list[str]]:
        """(bucket queues, streams) in the database, by name."""
        all_names = await self.db.list_collection_names()
        candidates, streams = core.classify(all_names)
        queues = []
        for n in candidates:
            col = self._col(n)
            doc = await col.find_one({}, {"mature": 1, "n": 1, "live": 1})
            if core.looks_like_bucket(doc):
                queues.append(n)
            elif doc is None and core.has_claim_index(await (await col.list_indexes()).to_list()):
                queues.append(n)
        return queues, streams

    async def queues(self, only: list[str] | None = None) -> list[core.QueueRow]:
        """One row per queue and stream (``only``: these names, queues or streams)."""
        queues, streams = await self.names()
        if only is not None:
            queues = [q for q in queues if q in only]
            streams = [s for s in streams if s in only]
        rows = [await self.queue_row(q) for q in queues]
        rows += [await self.stream_row(s) for s in streams]
        return sorted(rows, key=lambda r: r.name)

    async def queue_row(self, name: str) -> core.QueueRow:
        now = _now()
        col = self._col(name)
        row = core.QueueRow(name, "queue")
        core.apply_counts(row, await (await col.aggregate(core.counts_pipeline(now))).to_list())
        flt, sort = core.next_mature_query(now)
        doc = await col.find_one(flt, {"mature": 1}, sort=sort)
        row.next_mature = doc["mature"] if doc else None
        flt, sort = core.head_query(now)
        doc = await col.find_one(flt, {"mature": 1}, sort=sort)
        row.oldest_ready_s = core.age(now, doc["mature"]) if doc else None
        row.consumers = sorted(
            str(o) for o in await col.distinct("lease.owner", core.leased_query(now)) if o
        )
        row.dead = await self._live(name + DLQ_SUFFIX)
        row.quarantined = await self._col(quarantine_name(name)).count_documents({})
        return row

    async def stream_row(self, name: str) -> core.QueueRow:
        now = _now()
        meta = await self._col(name + META_SUFFIX).find_one(core.meta_filter()) or {}
        acked = int(meta.get("acked", 0))
        row = core.QueueRow(name, "stream", next_seq=int(meta.get("next", 0)), acked=acked)
        col = self._col(name)
        res = await (await col.aggregate(core.stream_pending_pipeline(acked))).to_list()
        r = res[0] if res else {}
        row.buckets = int(r.get("buckets") or 0)
        row.ready = int(r.get("items") or 0)
        first = await col.find_one(
            {"_id": {"$gt": acked}, "hole": {"$exists": False}, "stg": {"$exists": False}},
            {"at": 1},
            sort=[("_id", 1)],
        )
        row.oldest_ready_s = core.age(now, first.get("at")) if first else None
        row.quarantined = await self._col(quarantine_name(name)).count_documents({})
        return row

    async def _live(self, name: str) -> int:
        rows = await (await self._col(name).aggregate(core.live_sum_pipeline())).to_list()
        return int(rows[0].get("n") or 0) if rows else 0

    async def is_stream(self, name: str) -> bool:
        return await self._col(name + META_SUFFIX).find_one(core.meta_filter()) is not None

    async def peek(self, name: str, n: int = 10) -> list[core.ItemView]:
        """The first ``n`` items of a queue in claim order (leased buckets too, marked)
        or of a stream after its acknowledged seq; nothing is reserved or changed."""
        n = _check_n(n)
        check_name(name)
        now = _now()
        stream = await self.is_stream(name)
        if stream:
            meta = await self._col(name + META_SUFFIX).find_one(core.meta_filter()) or {}
            flt: dict[str, Any] = {
                "_id": {"$gt": int(meta.get("acked", 0))},
                "hole": {"$exists": False},
                "stg": {"$exists": False},  # staged (Spark) buckets: not in the stream yet
            }
            sort: list[tuple[str, int]] = [("_id", 1)]
        else:
            flt, sort = {}, CLAIM_SORT
        out: list[core.ItemView] = []
        async for doc in self._col(name).find(flt, sort=sort, batch_size=4):
            out.extend(core.item_views(doc, now, stream=stream))
            if len(out) >= n:
                break
        return out[:n]

    # -- dead letters ------------------------------------------------------------------------

    async def dead(self, name: str, n: int = 100) -> list[core.ItemView]:
        """The dead letters of queue ``name`` (its ``<name>.dlq``), oldest first."""
        return await self.peek(check_name(name) + DLQ_SUFFIX, n)

    async def requeue_dead(self, name: str, ids: list[str] | None = None) -> dict[str, int]:
        """Put dead letters of ``name`` (these ids, or all) back in the queue they came
        from (``x-source-queue``, else ``name``) with their own headers and no tries.

        Each dead-letter bucket is leased by this call first (a consumer of the dead-letter
        queue cannot take it meanwhile), its items are pushed durably, then marked consumed
        with a write fenced on that lease: an item is never lost, and a crash in between
        can only leave a copy in both queues. A bucket a consumer holds is skipped
        (``busy``)."""
        return await self._move_dead(name, ids, requeue=True)

    async def purge_dead(self, name: str, ids: list[str] | None = None) -> dict[str, int]:
        """Delete dead letters of ``name`` (these ids, or all) for good."""
        return await self._move_dead(name, ids, requeue=False)

    async def _move_dead(
        self, name: str, ids: list[str] | None, *, requeue: bool
    ) -> dict[str, int]:
        dlq = check_name(name) + DLQ_SUFFIX
        col = self._col(dlq)
        wanted: dict[ObjectId, set[int]] | None = None
        if ids is not None:
            wanted = {}
            for i in ids:
                bid, index = parse_item_id(i)
                wanted.setdefault(bid, set()).add(index)
        report = {"items": 0, "buckets": 0, "busy": 0, "missing": 0}
        if wanted is not None:
            bucket_ids: list[Any] = list(wanted)
        else:
            bucket_ids = [d["_id"] async for d in col.find({}, {"_id": 1}).sort(CLAIM_SORT)]
        targets: dict[str, Any] = {}
        try:
            for bid in bucket_ids:
                await self._move_bucket(col, name, bid, wanted, requeue, targets, report)
        finally:
            for q in targets.values():
                await q.close()
        if report["items"]:
            log.info(
                "queue %s: %s %d dead letters", printable(name), "requeued" if requeue else "purged",
                report["items"],
            )  # fmt: skip
        return report

    async def _move_bucket(
        self,
        col: Any,
        name: str,
        bid: Any,
        wanted: dict[ObjectId, set[int]] | None,
        requeue: bool,
        targets: dict[str, Any],
        report: dict[str, int],
    ) -> None:
        now = _now()
        token = ObjectId()
        dnow = to_datetime(now)
        doc = await col.find_one_and_update(
            {"_id": bid, **not_leased(dnow)},
            {"$set": {"lease": {"tok": token, "owner": ADMIN_OWNER,
                                "until": to_datetime(now + ADMIN_LEASE)}}},
            return_document=ReturnDocument.BEFORE,
        )  # fmt: skip
        if doc is None:
            exists = await col.find_one({"_id": bid}, {"_id": 1})
            report["busy" if exists else "missing"] += 1
            return
        doc["lease"] = None  # ours now: no takeover try is counted
        b = HeldBucket(doc, token, now, ADMIN_LEASE)
        items = b.items or []
        pick = [
            i for i in range(b.n)
            if not b.is_done(i) and (wanted is None or i in wanted.get(bid, ()))
        ]  # fmt: skip
        if wanted is not None:
            report["missing"] += len(wanted.get(bid, ())) - len(pick)
        if requeue:
            receipts = []
            for i in pick:
                headers = items[i].get("h")
                target = core.dead_source(name, headers)
                if target not in targets:
                    targets[target] = AsyncQueue(self.db, target)
                receipts.append(
                    await targets[target].push(
                        items[i].get("p"), headers=core.requeued_headers(headers), durable=True
                    )
                )
            for r in receipts:
                await r.wait()
        for i in pick:
            b.dead(i)  # stored elsewhere (or purged): consumed here
        await col.bulk_write([state_write(b, _now(), ADMIN_LEASE, release=True)])
        report["items"] += len(pick)
        report["buckets"] += 1


def _check_n(n: Any) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= core.MAX_PEEK:
        raise ConfigurationError(f"n must be a whole number from 1 to {core.MAX_PEEK}; got {n!r}.")
    return n
