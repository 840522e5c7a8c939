"""The log store: log records packed into bucket documents with summaries (the rules are
in ``_logbuckets``), the writes that store each record once, and the reads that cost
what their page costs.

One job a module, each class built on the one below: what the store holds and its
writes (``_logwrites``), its reads (``_logreads``); this module keeps
:class:`LogStore`, with retention (it deletes whole buckets) and the conversion of
the old layout (one document per record).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import WriteConcern

from . import _logbuckets as lb
from ._logreads import LogReads

log = logging.getLogger("bucketq.reservoir.logs")


class LogStore(LogReads):
    """Log records of every project in one collection of bucket documents (``name``).

    Writes: :meth:`write`. Reads, each bounded by its page or its budget: :meth:`page`,
    :meth:`record`, :meth:`trace`, :meth:`count`, :meth:`aggregate`. Retention:
    :meth:`expire`. A store written by an earlier release (one document per record in
    ``legacy``) is converted by :meth:`convert_legacy`.

    ``write_concern`` is every bucket insert's (default: the database's with ``j: true``
    added, ``bucketq.bucket.writes.durable_write_concern``: acknowledged once in the
    journal). ``retention_days`` is how long a project's records are kept
    (a number for every project, or a function of the project; None: kept forever).
    """

    # -- retention ------------------------------------------------------------------------

    async def expire(self, now: datetime | None = None, projects: Sequence[str] = ()) -> int:
        """Delete the buckets whose expiry passed (whole buckets: nothing per record), and
        for each of ``projects`` the buckets whose newest record and writing are older
        than its retention now (a shortened setting applies to buckets already written).
        Returns the buckets deleted."""
        now = now or datetime.now(UTC)
        deleted = 0
        with self._bounded("deleting expired logs"):
            res = await self.buckets.delete_many({"x": {"$lt": now}})
            deleted += res.deleted_count
            for p in projects:
                days = self.retention(p)
                if days is None:
                    continue
                cutoff = now - timedelta(days=days)
                res = await self.buckets.delete_many(
                    {"p": p, "t1": {"$lt": cutoff}, "w": {"$lt": cutoff}}
                )
                deleted += res.deleted_count
        return deleted

    # -- the old layout -------------------------------------------------------------------

    async def legacy_left(self) -> int:
        """Records still in the old layout (one document per record)."""
        with self._bounded("counting old-layout log records"):
            return int(await self.legacy.estimated_document_count())

    async def convert_legacy(
        self, *, batch: int = 1000, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Move the records of the old layout into buckets, ``batch`` at a time, each
        keeping its id; calls ``progress(converted, left)`` after each batch and returns
        the records this call converted. Stopped anywhere, it resumes: a batch written
        again is stored once (its records' groups find their links), and its documents
        are deleted from the old collection only once their buckets are stored."""
        state = self.db.get_collection(
            self.buckets.name + ".converted", write_concern=WriteConcern(j=True)
        )
        done = 0
        while True:
            with self._bounded("converting old-layout log records"):
                docs = await self.legacy.find({}).limit(batch).to_list(None)
            if not docs:
                return done
            records: list[dict[str, Any]] = []
            positions: list[int] = []
            bad: list[Any] = []
            for d in docs:
                rec = dict(d)
                rec["_id"] = str(d["_id"])
                if not isinstance(rec.get("project_id"), str) or not rec["project_id"]:
                    bad.append(d["_id"])
                    continue
                if not isinstance(rec.get("time"), datetime):
                    rec["time"] = lb.MIN_TIME
                positions.append(len(records))
                records.append(rec)
            errors = await self.write(records, positions)
            if errors:
                raise RuntimeError(
                    f"Converting old-layout log records stopped: record {records[errors[0]['index']]['_id']!r} "
                    f"was not stored ({errors[0]['error']}). Run the conversion again; what it "
                    "stored stays stored once."
                )
            if bad:
                log.warning(
                    "%d old-layout documents without a project were left in %s",
                    len(bad),
                    self.legacy.name,
                )
            with self._bounded("converting old-layout log records"):
                await self.legacy.delete_many(
                    {"_id": {"$in": [d["_id"] for d in docs if d["_id"] not in bad]}}
                )
                mark = await state.find_one_and_update(
                    {"_id": "legacy"},
                    {"$inc": {"converted": len(records)}},
                    upsert=True,
                    return_document=True,
                )
            done += len(records)
            if progress is not None:
                progress(int(mark["converted"]), await self.legacy_left())
            if bad and len(bad) == len(docs):
                return done
