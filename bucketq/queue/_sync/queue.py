# GENERATED from bucketq/queue/_async/queue.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""The bucket queue's I/O shell (pymongo ``MongoClient``).

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
Decisions live in ``_core``; this file builds, calls the driver, interprets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.errors import (
    DuplicateKeyError,
    PyMongoError,
)

from ... import bucket
from ..._driver import boundary
from ..._validate import flag, printable
from ...bucket import Producer, Quarantine, Runtime
from ...bucket import deadline as deadlines
from ...bucket.codec import encode_item
from ...bucket.concurrency import (
    Lock,
    Mutex,
    Receipt,
    register_exit,
)
from ...errors import (
    PushFailed,
    QueueClosed,
)
from .. import _core as core
from .api import QueueApi
from .consumer import Consumer

log = logging.getLogger("bucketq.queue")

_now = time.time


class Queue(QueueApi):
    """A durable queue on MongoDB that packs pushed items into bucket documents.

    ``db`` is a pymongo ``Database``; the queue uses the collection ``name``.
    Options and their defaults are those of :class:`bucketq.queue.QueueOptions`.
    """

    def __init__(self, db: Any, name: str, **options: Any) -> None:
        super().__init__(db, name, options)
        opts, name = self.options, self.name
        self._drain_report: dict[str, int] | None = None
        self._quarantine = Quarantine(db, name, self._col.write_concern)
        self._runtime = Runtime("queue", name, self._stats, lambda: self._closed, log)
        self._bounded = self._runtime.bounded
        mutex = Mutex()
        self._producer = Producer(
            self._runtime, opts, mutex=mutex, write=self._write, written=self._written
        )
        #: This queue object's own id.
        self.producer_id = self._producer.producer_id
        self._numbered = opts.partitions == 1  # its member number read (or not needed)
        self._numbering = Lock()  # the writer and the fetcher wait for one read
        self._consumer = Consumer(
            self._runtime,
            opts,
            origin=self,
            col=self._col,
            mutex=mutex,
            quarantine=self._quarantine,
            setup=self._setup,
            open_dead_letter_queue=self._open_dead_letter_queue,
        )
        register_exit(self)

    @property
    def partition(self) -> int:
        """The partition this queue object's pushes without a key go to and its consumer
        claims in first: its member number's (read before its first write or claim),
        until then the hash of its id."""
        return self._producer.partition

    def health(self) -> dict[str, Any]:
        """Whether MongoDB answers this queue's operations: see ``Runtime.health``."""
        return self._runtime.health()

    # -- setup --------------------------------------------------------------------------

    def _setup(self, timeout: float | None = None) -> None:
        """Create the claim index (and so the collection): once per collection and
        process, never alongside other start-up work (see ``Startup``); within
        ``timeout`` seconds (default ``op_timeout``), else it is tried again later.
        A partitioned queue also gets its partition index, and buckets of partitions
        it no longer has (opened with more before) move into its own; a partitioned
        queue object reads its member number first, once (``_number``)."""
        timeout = self.options.op_timeout if timeout is None else timeout
        if not self._numbered:
            with self._numbering:
                if not self._numbered:
                    self._number(timeout)
        if self._setup_done:
            return
        parts = self.options.partitions
        what = "mature_id" if parts == 1 else f"part_mature_id/{parts}"
        try:
            self._once(what, timeout, lambda: self._create_indexes(parts, timeout))
            self._setup_done = True
        except (PyMongoError, deadlines.StartupBusy) as exc:
            log.warning(
                "queue %s: creating the claim index failed (%s); will retry",
                printable(self.name),
                exc,
            )

    def _number(self, timeout: float) -> None:
        """Read this object's member number, once (``bucket.member_request``): its
        partition from then on. If the read fails the hash of its id stays its
        partition: a placement, not worth a retry."""
        flt, upd = bucket.member_request(self.name)
        col = self.db.get_collection(bucket.MEMBERS, write_concern=self._col.write_concern)
        after = None
        try:
            with self._bounded(timeout):
                for _ in range(2):
                    after = col.find_one_and_update(flt, upd, return_document=ReturnDocument.AFTER)
                    if after is not None:
                        break
                    try:  # the queue's first member
                        col.update_one(flt, bucket.MEMBERS_START, upsert=True)
                    except DuplicateKeyError:
                        pass  # another member started it
        except PyMongoError as exc:  # unreachable, refused, or n is not a number
            after, why = None, str(exc)
        else:
            why = "no numbering document" if after is None else f"n is {after.get('n')!r}"
        part = bucket.member_partition(after, self.options.partitions)
        if part is None:
            log.warning(
                "queue %s: numbering this queue object failed (%s); its pushes without a "
                "key go to partition %d, a hash of its id",
                printable(self.name), why, self._producer.partition,
            )  # fmt: skip
        else:
            self._producer.partition = part
        self._numbered = True

    def _create_indexes(self, parts: int, timeout: float) -> None:
        with self._bounded(timeout):
            self._col.create_index(bucket.CLAIM_SORT, name="mature_id")
            if parts > 1:
                self._col.create_index(core.PART_CLAIM_INDEX, name="part_mature_id")
                self._fold_partitions(parts)

    def _fold_partitions(self, parts: int) -> None:
        """Move buckets of partitions >= ``parts`` (the queue had more before) into
        this queue's range: no claim would look for them there."""
        found = self._col.distinct("part", {"part": {"$gte": parts}})
        for old, new in core.partitions_to_fold(found, parts).items():
            upd = {"$set": {"part": new}} if new is not None else {"$unset": {"part": ""}}
            res = self._col.update_many({"part": old}, upd)
            log.info("queue %s: moved %d buckets of partition %d (of %d now) to partition %d",
                     printable(self.name), res.modified_count, old, parts, new or 0)  # fmt: skip

    def _open_dead_letter_queue(self) -> Queue:
        # Buckets as large as MongoDB allows: any item of this queue fits there with
        # its dead-letter headers, unless it is within a few bytes of the limit.
        return type(self)(
            self.db,
            self.options.dead_letter_name(self.name),
            write_concern=self.options.write_concern,
            bucket_max_bytes=bucket.HARD_MAX_BYTES,
            retry_budget=self.options.retry_budget,
            op_timeout=self.options.op_timeout,
            partitions=self.options.partitions,
        )

    def _check_open(self) -> None:
        self._check_not_forked()
        if self._closed or self._consumer.draining:
            raise QueueClosed(
                f"Queue {self.name!r} is drained or closed; open a new Queue to go on."
            )

    # -- push ---------------------------------------------------------------------------

    def _partition_for(self, key: Any) -> int:
        return self._producer.partition_for(key)

    def _push(
        self, payload: Any, headers: Any, at: float, now: float, part: int, durable: bool
    ) -> Receipt:
        return self._producer.push(encode_item(payload, headers), at, now, part, durable)

    def _push_many(
        self, payloads: list[Any], headers: Any, at: float | None, durable: bool, part: int
    ) -> list[Receipt]:
        return self._producer.add_many(payloads, headers, at, durable, part)

    def _write(self, buckets: list[bucket.OpenBucket]) -> tuple[set[Any], BaseException | None]:
        """Insert sealed buckets (one command), retrying transient failures within the
        retry budget (``Producer.insert_buckets``); an id already there is an
        earlier attempt that landed."""
        deadline = self._producer.write_deadline(buckets)
        self._setup(deadlines.attempt_timeout(deadline, _now()))
        self._producer.place(buckets)
        docs, bad = bucket.build_documents(buckets, bucket.OpenBucket.document)
        self._consumer.hold_pushed(docs)

        def documents(todo: list[bucket.OpenBucket]) -> list[dict[str, Any]]:
            return [docs[ob.id] for ob in todo]

        good = [ob for ob in buckets if ob.id in docs]
        failed, error = self._producer.insert_buckets(self._col, good, deadline, documents)
        if failed:
            self._consumer.not_written({k: docs[k] for k in failed})
        return failed | bad, error

    def _written(self, buckets: list[bucket.OpenBucket], now: float) -> None:
        self._consumer.written(buckets, now)

    @boundary("flush()")
    def flush(self) -> None:
        """Write every open bucket and wait until stored; then flush consumer state."""
        self._check_not_forked()
        self._producer.flush()
        with self._bounded(None, f"flush() of queue {self.name!r}"):
            self._consumer.flush_state()

    # -- consume (the consumer does it; see ``consumer.py``) ----------------------------

    def reserve(self, timeout: float | None = None) -> core.Message | None:
        """The next item, or None when ``timeout`` seconds pass (or the queue drains)."""
        self._check_not_forked()
        return self._consumer.reserve(timeout)

    def reserve_many(self, max_items: int, timeout: float | None = None) -> list[core.Message]:
        """Up to ``max_items`` items at once: waits (up to ``timeout``) for the first, then
        takes what else is ready without waiting. Empty on timeout or once drained."""
        self._check_not_forked()
        return self._consumer.reserve_many(max_items, timeout)

    @boundary("commit()")
    def commit(self, msg: core.Message, *, flush: bool = False) -> bool:
        """Mark the item consumed. False if this process no longer holds its bucket
        (the lease was lost or released; the item will be delivered again), or if ``msg``
        was rolled back already (a rollback ends its delivery, even when the item is
        delivered again at once)."""
        self._check_not_forked()
        return self._consumer.commit(msg, flush=flush)

    @boundary("commit_many()")
    def commit_many(self, msgs: Any, *, flush: bool = False) -> int:
        """Commit several items; returns how many were committed (the others' buckets
        are no longer held here, and they will be delivered again)."""
        self._check_not_forked()
        return self._consumer.commit_many(msgs, flush=flush)

    def _rollback(self, msg: core.Message, delay: Any, next_t: Any, reason: Any) -> bool:
        return self._consumer.rollback(msg, delay, next_t, reason)

    def touch(self, msg: core.Message) -> bool:
        """Say that ``msg`` is still being worked on. An item handed out and neither
        committed nor rolled back for ``lease + reject_timeout_grace`` seconds is rolled
        back by the queue itself (a stuck handler must not keep its bucket forever);
        ``touch`` starts that clock again. The bucket's lease is renewed anyway while it is
        held here. False if this process no longer holds the item's bucket or ``msg`` was
        committed or rolled back. No I/O."""
        self._check_not_forked()
        return self._consumer.touch(msg)

    def consume(self, handler: Callable[..., Any], **options: Any) -> dict[str, Any]:
        """Run ``handler`` on this queue's items until stopped: its return commits an item,
        an exception rolls it back (delivered again after the queue's back-off, or the
        delay the handler asks for; past ``max_tries`` to the dead-letter queue). SIGTERM
        or SIGINT (or ``max_items``) stops it: items in hand finish within
        ``drain_timeout``, the rest are released (``drain()``); a second signal releases
        what is held at once. Returns what it did. Options (``concurrency``, ``batch``,
        ``time_limit``, ``retry_for``, ...) are those of :class:`bucketq.worker.Worker`,
        which this runs; see docs/worker.md."""
        # The worker knows the queue only as the object it is given; imported when used.
        from ...worker import Worker

        return Worker(self, handler, **options).run()

    # -- drain and close -------------------------------------------------------------------

    @boundary("drain()")
    def drain(self, timeout: float | None = None) -> dict[str, int]:
        """Write open buckets, stop claiming, serve what is in memory to reserve() callers
        (until consumed or ``timeout``, default ``drain_timeout``), release the rest at once
        and flush state. Returns counts: ``buckets_written`` and ``push_failed`` (items NOT
        stored) by this call, ``served``, ``released_buckets``, ``released_items``.
        Idempotent. In a child forked from the process that opened the queue, it does
        nothing (the parent drains)."""
        if self._forked:  # the parent owns what is buffered and held: touch nothing
            return dict.fromkeys(core.DRAIN_REPORT, 0)
        if self._drain_report is not None:
            return self._drain_report
        self._consumer.stop_claiming()
        written_before = self._stats["buckets_written"]
        failed_before = self._stats["push_failed"]
        self._producer.flush()
        served, released_buckets, released_items = self._consumer.drain(
            self.options.drain_timeout if timeout is None else timeout
        )
        self._drain_report = {
            "buckets_written": self._stats["buckets_written"] - written_before,
            "push_failed": self._stats["push_failed"] - failed_before,
            "served": served,
            "released_buckets": released_buckets,
            "released_items": released_items,
        }
        return self._drain_report

    @boundary("close()")
    def close(self) -> dict[str, int]:
        """Drain, then stop the background workers. Idempotent; the client stays open."""
        if self._forked:  # the parent owns what is buffered and held: touch nothing
            return dict.fromkeys(core.DRAIN_REPORT, 0)
        if self._closed:
            return self._drain_report or {}
        try:
            report = self.drain()
        finally:
            self._stop_workers()
        return report

    def _stop_workers(self) -> None:
        """Stop the background workers (each join is bounded: their driver calls are)."""
        self._closed = True
        self._consumer.wake_all()
        self._producer.stop()
        self._consumer.join()

    # -- control and introspection ------------------------------------------------------------

    def pause(self, release: bool = False) -> None:
        """Stop handing out items and claiming buckets until resume(). ``release``: also
        give back each held bucket once none of its items is handed out (read-ahead at
        once, a started bucket when its last handed-out item is committed or rolled
        back), no try counted, so other consumers get what this one will not serve."""
        self._consumer.pause(bool(flag("release", release)))

    def resume(self) -> None:
        self._consumer.resume()

    def _count(self, flt: dict[str, Any]) -> int:
        """The live items of the buckets that match ``flt``."""
        with self._read_bounded("counting the items"):
            cursor = self._col.aggregate(core.live_sum_pipeline(flt))
            return core.sum_result([r for r in cursor])

    def _read_bounded(self, what: str) -> Any:
        return self._bounded(self.options.op_timeout, f"{what} of queue {self.name!r}")

    def stats(self) -> dict[str, int]:
        """Counters of this queue object since it opened, and what it holds in memory now."""
        s = dict(self._stats)
        s["pending_bytes"] = self._producer.pending_bytes
        s["open_buckets"] = self._producer.open_buckets
        s["held_buckets"] = len(self._consumer.held)
        s["ready_in_memory"] = len(self._consumer.ready)
        s["waiting_reserves"] = self._consumer._waiters  # reserve() calls blocked for items
        return s

    # -- quarantine ----------------------------------------------------------------------------

    @boundary("quarantined()")
    def quarantined(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Damaged buckets set aside (in ``<name>.quarantine``), oldest first: ``id``,
        ``reason``, ``at``, ``n``, how many items are ``recoverable`` and how many ``lost``."""
        return self._quarantine.summaries(limit)

    @boundary("requeue_quarantined()")
    def requeue_quarantined(self, bucket_id: Any = None) -> dict[str, int]:
        """Put what can be recovered of quarantined buckets (one, or all) back in the
        queue as new buckets. Returns counts: ``buckets``, ``items`` re-queued, items
        ``lost``, buckets ``kept`` in quarantine because some of their items are lost."""
        return self._quarantine.requeue(self._put_recovered, bucket_id)

    @boundary("remove_quarantined()")
    def remove_quarantined(self, bucket_id: Any = None) -> int:
        """Delete quarantined buckets (one, or all) for good; returns how many."""
        return self._quarantine.remove(bucket_id)

    def _put_recovered(self, bucket_id: ObjectId, items: list[bytes]) -> None:
        now = _now()
        ob = bucket.recovered_bucket(bucket_id, items, now, self._partition_for(None))
        failed, error = self._write([ob])
        if failed:
            raise PushFailed(f"Re-queueing quarantined items failed: {error}") from error
        self._written([ob], now)

    @boundary("remove()")
    def remove(self, id: str) -> bool:
        """Remove a stored item whose bucket no consumer holds. True if it was removed."""
        self._check_not_forked()
        bid, index = bucket.parse_item_id(id)
        if self._producer.holds(bid):
            self._producer.flush()
        with self._bounded(self.options.op_timeout, f"remove() on queue {self.name!r}"):
            return self._remove(bid, index)

    def _remove(self, bid: ObjectId, index: int) -> bool:
        for _ in range(5):
            now = bucket.to_datetime(_now())
            doc = self._col.find_one(
                {"_id": bid, **bucket.not_leased(now)},
                {"done": 1, "live": 1, "n": 1},
            )
            if doc is None or index >= doc["n"]:
                return False
            done = bucket.done_bitmap(doc["n"], doc.get("done"))
            if bucket.is_consumed(done, index):
                return False
            bucket.mark_consumed(done, index)
            flt = {"_id": bid, "done": doc.get("done"), "live": doc["live"],
                   **bucket.not_leased(now)}  # fmt: skip
            if doc["live"] <= 1:
                res = self._col.delete_one(flt)
                if res.deleted_count:
                    return True
            else:
                # Clearing an expired lease fences off its stalled holder.
                res = self._col.update_one(
                    flt, {"$set": {"done": bytes(done), "lease": None}, "$inc": {"live": -1}}
                )
                if res.modified_count:
                    return True
        return False
