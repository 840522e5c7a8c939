# GENERATED from bucketq/bucket/_async/quarantine.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""The quarantine collection of a queue or stream (pymongo ``MongoClient``).

Damaged buckets are kept here, never deleted silently: ``put`` stores one (the caller
then deletes it from the queue), ``list``/``remove``/``requeue`` serve the operator.
Decisions (what is damaged, the record, what can be recovered) live in ``_damage``.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from bson import ObjectId
from bson.errors import InvalidId
from pymongo.errors import DuplicateKeyError

from ..._validate import printable
from ...errors import ConfigurationError
from .. import damage, options, times
from ..codec import collection

log = logging.getLogger("bucketq.queue")

_now = time.time

#: Stores recovered items (encoded, in order) as one new bucket with the given id
#: (a coroutine function in the async flavour).
Put = Callable[[ObjectId, list[bytes]], Any]


def parse_bucket_id(value: Any) -> Any:
    """A bucket id as the CLI or a caller gives it: an ObjectId (bucket queue) or a
    stream's seq (an int)."""
    if isinstance(value, ObjectId | int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value.isdigit():
            return int(value)
        try:
            return ObjectId(value)
        except InvalidId:
            pass
    raise ConfigurationError(
        f"bucket_id must be a bucket's id (24 hex digits) or a stream's seq; got {value!r}."
    )


class Quarantine:
    """``<name>.quarantine`` beside the queue or stream ``name`` in ``db``."""

    def __init__(self, db: Any, name: str, write_concern: Any = None) -> None:
        self.source = name
        self.name = damage.quarantine_name(name)
        self._col = collection(db, self.name, write_concern)

    def put(self, doc: dict[str, Any], reason: str, owner: str) -> None:
        """Keep a damaged bucket (idempotent: an earlier attempt that landed is kept)."""
        record = damage.quarantine_document(
            doc, reason, times.to_datetime(_now()), self.source, owner
        )
        try:
            self._col.insert_one(record)
        except DuplicateKeyError:
            pass

    def _filter(self, bucket_id: Any) -> dict[str, Any]:
        return {} if bucket_id is None else {"_id": parse_bucket_id(bucket_id)}

    def summaries(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The quarantined buckets, oldest first: id, reason, when, how many items can
        be recovered and how many cannot."""
        cursor = self._col.find({}).sort("at", 1)
        if limit is not None:
            cursor = cursor.limit(options.check_max_items(limit))
        return [damage.summary(r) for r in cursor]

    def count(self) -> int:
        return self._col.count_documents({})

    def remove(self, bucket_id: Any = None) -> int:
        """Delete quarantined buckets (one, or all): their items are gone for good."""
        res = self._col.delete_many(self._filter(bucket_id))
        if res.deleted_count:
            log.warning(
                "queue %s: removed %d quarantined buckets",
                printable(self.source),
                res.deleted_count,
            )
        return res.deleted_count

    def requeue(self, put: Put, bucket_id: Any = None) -> dict[str, int]:
        """Store what can be recovered of quarantined buckets (one, or all) as new
        buckets through ``put``. A bucket fully recovered leaves the quarantine; one with
        items lost stays, marked ``requeued``, until removed. Each record is marked with
        the new bucket's id before it is stored, so a retry after a crash stores it
        under the same id (at least once, never lost)."""
        report = {"buckets": 0, "items": 0, "lost": 0, "kept": 0}
        flt = {**self._filter(bucket_id), "requeued": {"$exists": False}}
        for record in self._col.find(flt):
            rec = damage.recover(record.get("bucket") or {})
            if rec.items:
                new_id = record.get("requeued_as") or ObjectId()
                self._col.update_one({"_id": record["_id"]}, {"$set": {"requeued_as": new_id}})
                put(new_id, rec.items)
            if rec.lost:
                self._col.update_one({"_id": record["_id"]}, {"$set": {"requeued": len(rec.items)}})
                report["kept"] += 1
            else:
                self._col.delete_one({"_id": record["_id"]})
            report["buckets"] += 1
            report["items"] += len(rec.items)
            report["lost"] += rec.lost
            log.warning(
                "queue %s: re-queued %d items of quarantined bucket %s (%d lost)",
                printable(self.source),
                len(rec.items),
                record["_id"],
                rec.lost,
            )
        return report
