# GENERATED from bucketq/queue/_async/state_flush.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""The consumer's state flush: commits, rollbacks, lease renewals, releases and dead
letters written back to the server, by the flusher or on demand.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time

from bson import ObjectId
from pymongo.errors import BulkWriteError, PyMongoError

from ... import _validate as v
from ... import bucket
from ...bucket import deadline as deadlines
from ...bucket.concurrency import sleep
from .. import _core as core
from .dead_lettering import DeadLettering

log = logging.getLogger("bucketq.queue")

_now = time.time


class StateFlush(DeadLettering):
    """Writes the held buckets' state back (the flusher, ``flush_state``, ``release``)."""

    def _flusher_loop(self) -> None:
        period = self.options.state_flush_period
        while not self._runtime.is_closed():
            gen = self._flush_wake.gen
            self._flush_wake.wait(gen, period)
            if self._flush_wake.gen != gen:
                # Woken (a bucket finished, an item to dead-letter): gather what else
                # comes within FLUSH_GATHER, so finished buckets share a delete.
                sleep(core.FLUSH_GATHER)
            if self._runtime.is_closed():
                return
            try:
                self.flush_state()
            except PyMongoError as exc:
                log.log(deadlines.failure_level(exc), "queue %s: state flush failed (%s); will retry",
                        v.printable(self.name), exc)  # fmt: skip

    def flush_state(self, *, release_all: bool = False) -> None:
        """Persist every changed held bucket with one fenced write each (one command),
        renew leases, release idle buckets. Never overlaps itself."""
        with self._flush_lock:
            try:
                self._dead_letter()
            except Exception:
                self._stats["dead_letter_failed"] += 1
                log.exception(
                    "queue %s: moving items to the dead-letter queue failed", v.printable(self.name)
                )
            now = _now()
            lease = self.options.lease
            with self._mutex:
                self._requeue_due(now)
                for b in list(self.held.values()):
                    if not b.lost:
                        self._check_stalled(b, now)
                plan, unwritable = core.plan_flush(
                    list(self.held.values()),
                    now,
                    lease,
                    release_all=release_all,
                    release_unhanded=self.releasing,
                )
                for b, exc in unwritable:
                    # One bucket's state cannot be written: the others' still is.
                    self._stats["state_flush_errors"] += 1
                    log.error(
                        "queue %s: bucket %s: state not written: %s",
                        v.printable(self.name),
                        b.id,
                        exc,
                    )
            writes = [w for _, _, w in plan]
            targets = [(b, kind) for b, kind, _ in plan]
            if not writes:
                return
            # A renewal not answered in time counts as failed: the bucket's items are not
            # handed out once a third of its lease is left, and the next flush tries again.
            timeout = deadlines.state_flush_timeout(self.options.op_timeout, self.options.lease)
            try:
                with self._runtime.bounded(timeout):
                    res = self._col.bulk_write(writes, ordered=False)
                done = res.matched_count + res.deleted_count
            except BulkWriteError as exc:
                # Some writes failed on the server: the others landed. Only the failed
                # buckets stay dirty (written again next time).
                bad = bucket.bulk_failed_indexes(exc)
                with self._mutex:
                    for k in sorted(bad):
                        b = targets[k][0]
                        b.dirty = True
                        self._stats["state_flush_errors"] += 1
                        log.error("queue %s: bucket %s: state write failed: %s", v.printable(self.name), b.id,
                                  bucket.bulk_error_of(exc, k))  # fmt: skip
                targets = [t for k, t in enumerate(targets) if k not in bad]
                writes = [w for k, w in enumerate(writes) if k not in bad]
                done = int(exc.details.get("nMatched", 0)) + int(exc.details.get("nRemoved", 0))
            except PyMongoError:
                with self._mutex:
                    for b, _ in targets:
                        b.dirty = True
                raise
            self._stats["state_flushes"] += 1
            lost: set[ObjectId] = set()
            if done < len(writes):
                ids = [b.id for b, _ in targets]
                with self._runtime.bounded(timeout):
                    now_docs = {
                        d["_id"]: d for d in self._col.find({"_id": {"$in": ids}}, {"lease": 1})
                    }
                lost = {
                    b.id
                    for b, kind in targets
                    if core.lost_after_flush(kind, b.token, now_docs.get(b.id))
                }
            with self._mutex:
                for b, kind in targets:
                    if b.id in lost:
                        self._lose(b)
                    elif kind == "delete":
                        self._drop(b)
                    elif kind == "release":
                        b.released = True
                        self._stats["released"] += 1
                        self._drop(b)
                    else:
                        b.until = now + lease
            # Room for the fetcher's next claim: buckets dropped with items still queued
            # (lost, released). A deleted bucket was finished (none queued): its delete
            # makes no room and nothing claimable, so a fetcher that is idle waits on.
            if lost or any(kind not in ("update", "delete") for _, kind in targets):
                self._fetch_wake.notify()

    def _requeue_due(self, now: float) -> None:
        """Serve again, here, rolled-back items whose not-before has passed."""
        woke = False
        for b in self.held.values():
            if b.waiting and not b.lost:
                again = b.due_waiting(now, self.options.max_tries)
                if again:
                    b.queued += len(again)
                    self.ready.extend(again)
                    woke = True
        if woke:
            self._consumers.notify()

    def _check_stalled(self, b: core.HeldBucket, now: float) -> None:
        """Roll back items handed out and untouched for lease + reject_timeout_grace
        (each on its own clock), so a stuck handler cannot pin its bucket (and renew its
        lease) forever."""
        stalled = b.stalled_items(now, self.options.lease + self.options.reject_timeout_grace)
        for i in stalled:
            b.rollback(i, now, now)
            self._stats["rolled_back"] += 1
            log.warning(
                "queue %s: item %s was reserved and never committed; rolled back",
                v.printable(self.name),
                bucket.item_id(b.id, i),
            )
        if stalled:
            # Serve them again here (they are READY now, like an item rolled back with no delay).
            again = b.ready_messages(now, self.options.max_tries)
            b.queued += len(again)
            self.ready.extend(again)
            self._consumers.notify()
            if b.dying:
                self._flush_wake.notify()

    def release(self, buckets: list[core.HeldBucket]) -> None:
        with self._flush_lock:
            now = _now()
            writes = [core.state_write(b, now, self.options.lease, release=True) for b in buckets]
            with self._runtime.bounded(self.options.op_timeout):
                self._col.bulk_write(writes, ordered=False)
            with self._mutex:
                for b in buckets:
                    b.released = True
                    self._drop(b)
                    self._stats["released"] += 1
