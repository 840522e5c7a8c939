# GENERATED from bucketq/queue/_async/dead_letters.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""A queue's dead letters as an operation on the queue: put them back in the queue
they came from, or delete them for good (``bucketq queues dead``, the console and the
Inspector call it).

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import time
from typing import Any

from bson import ObjectId
from pymongo import ReturnDocument

from ...bucket import CLAIM_SORT, not_leased
from ...bucket.codec import collection
from ...bucket.document import parse_item_id
from ...bucket.options import DLQ_SUFFIX, check_name
from ...bucket.times import to_datetime
from ...bucket.writes import durable_write_concern
from .. import _core as core
from .queue import Queue

_now = time.time
#: Owner of the lease taken on a dead-letter bucket while its items move.
ADMIN_OWNER = "bucketq-admin"
#: That lease, in seconds: longer than moving one bucket's items takes.
ADMIN_LEASE = 60.0


class DeadLetters:
    """The dead letters of queue ``name`` (its ``<name>.dlq``) in ``db`` (a pymongo
    ``Database``). Each move returns a report: ``items`` and ``buckets`` moved,
    ``busy`` buckets a consumer holds (skipped), ``missing`` ids."""

    def __init__(self, db: Any, name: str) -> None:
        self.db = db
        self.name = check_name(name)

    def _col(self, name: str) -> Any:
        # A dead letter's move (requeue, purge) writes on disk, as the queues do.
        return collection(self.db, name, durable_write_concern(None, self.db.write_concern))

    def requeue(self, ids: list[str] | None = None) -> dict[str, int]:
        """Put these dead letters (or all) back in the queue they came from
        (``x-source-queue``, else ``name``) with their own headers and no tries.

        Each dead-letter bucket is leased first (a consumer of the dead-letter queue
        cannot take it meanwhile), its items are pushed durably, then marked consumed
        with a write fenced on that lease: an item is never lost, and a crash in between
        can only leave a copy in both queues. A bucket a consumer holds is skipped
        (``busy``)."""
        return self._move_dead(self.name, ids, requeue=True)

    def purge(self, ids: list[str] | None = None) -> dict[str, int]:
        """Delete these dead letters (or all) for good."""
        return self._move_dead(self.name, ids, requeue=False)

    def _move_dead(self, name: str, ids: list[str] | None, *, requeue: bool) -> dict[str, int]:
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
            bucket_ids = [d["_id"] for d in col.find({}, {"_id": 1}).sort(CLAIM_SORT)]
        targets: dict[str, Any] = {}
        try:
            for bid in bucket_ids:
                self._move_bucket(col, name, bid, wanted, requeue, targets, report)
        finally:
            for q in targets.values():
                q.close()
        return report

    def _move_bucket(
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
        doc = col.find_one_and_update(
            {"_id": bid, **not_leased(dnow)},
            {"$set": {"lease": {"tok": token, "owner": ADMIN_OWNER,
                                "until": to_datetime(now + ADMIN_LEASE)}}},
            return_document=ReturnDocument.BEFORE,
        )  # fmt: skip
        if doc is None:
            exists = col.find_one({"_id": bid}, {"_id": 1})
            report["busy" if exists else "missing"] += 1
            return
        doc["lease"] = None  # ours now: no takeover try is counted
        b = core.HeldBucket(doc, token, now, ADMIN_LEASE)
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
                    targets[target] = Queue(self.db, target)
                receipts.append(
                    targets[target].push(
                        items[i].get("p"), headers=core.requeued_headers(headers), durable=True
                    )
                )
            for r in receipts:
                r.wait()
        for i in pick:
            b.dead(i)  # stored elsewhere (or purged): consumed here
        col.bulk_write([core.state_write(b, _now(), ADMIN_LEASE, release=True)])
        report["items"] += len(pick)
        report["buckets"] += 1
