"""Ordered stream mode's I/O shell (pymongo ``AsyncMongoClient``).

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
Decisions live in ``bucketq.stream.core``; this file builds, calls the driver, interprets.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import (
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
)

from ... import _validate as v
from ... import bucket
from ..._driver import boundary
from ...bucket import AsyncClosing, AsyncProducer, AsyncQuarantine, AsyncRuntime, AsyncWakeWatcher
from ...bucket import deadline as deadlines
from ...bucket.codec import collection
from ...bucket.concurrency import (
    STARTUP_DONE,
    AsyncMutex,
    AsyncNotifier,
    AsyncReceipt,
    AsyncStartup,
    async_register_exit,
    startup_key,
    used_after_fork,
)
from ...bucket.db import check_async_database
from ...errors import (
    ConfigurationError,
    DamagedBucket,
    Fenced,
    OperationFailed,
    PushFailed,
    QueueClosed,
)
from .. import core

log = logging.getLogger("bucketq.stream")
#: Buckets (without their items) one read of :meth:`AsyncStreamConsumer.reachable` looks at.
SCAN_PAGE = 1024

_now = time.time
_monotonic = time.monotonic


class AsyncStreamQueue(AsyncClosing):
    """A queue in ordered stream mode: every bucket gets the next gapless sequence number.

    Producers ``push`` as on a bucket queue (items are packed into buckets by count,
    bytes and age; a receipt resolves once the bucket is stored). One consumer at a time
    reads the buckets in order: :meth:`consumer` opens it and fences every older one.
    Options and defaults are those of :class:`bucketq.stream.StreamOptions`.
    """

    #: Set in a child process forked after the stream opened: it may not be used there.
    _forked: bool = False

    def __init__(self, db: Any, name: str, **options: Any) -> None:
        self.options = opts = core.StreamOptions.build(**options)
        self.name = bucket.check_name(name)
        self.db = check_async_database(db)
        wc = opts.write_concern_for(self.db)
        self._col = collection(db, name, wc)
        self._meta = collection(db, core.meta_name(name), wc)
        self._closed = False
        self._setup_done = False
        self._stats = dict.fromkeys(
            ("pushed", "buckets_written", "insert_retries", "push_failed", "renumbered",
             "quarantined", "loop_errors", "change_stream_events", "change_stream_errors",
             "change_stream_fallbacks"), 0,
        )  # fmt: skip
        self._runtime = AsyncRuntime("stream", self.name, self._stats, lambda: self._closed, log)
        self._bounded = self._runtime.bounded
        self._producer = AsyncProducer(
            self._runtime, opts.packer, mutex=AsyncMutex(), write=self._write, written=self._written
        )
        #: Notified when buckets are stored by this object, or a change event says some
        #: were: a consumer waiting in next_batch reads again at once.
        self._arrivals = AsyncNotifier()
        self._quarantine = AsyncQuarantine(db, name, wc)
        self._close_report: dict[str, int] | None = None
        async_register_exit(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.db.name}.{self.name}>"

    def health(self) -> dict[str, Any]:
        """Whether MongoDB answers this stream's operations: see ``AsyncRuntime.health``."""
        return self._runtime.health()

    # -- push -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            if self._forked:
                raise used_after_fork(self)
            raise QueueClosed(f"Stream {self.name!r} is closed; open a new StreamQueue to go on.")

    async def push(
        self, payload: Any, *, headers: dict[str, Any] | None = None, durable: bool = False
    ) -> AsyncReceipt:
        """Buffer one item and return its receipt at once (``durable=True``: once stored)."""
        self._check_open()
        headers = bucket.check_push(headers, durable)
        return (await self._producer.add_many([payload], headers, None, durable))[0]

    async def push_many(
        self, payloads: Any, *, headers: dict[str, Any] | None = None, durable: bool = False
    ) -> list[AsyncReceipt]:
        """Push several items in order; all are encoded first, so one bad item stores none."""
        self._check_open()
        payloads = v.payloads(payloads)
        return await self._producer.add_many(
            payloads, bucket.check_push(headers, durable), None, durable
        )

    async def _allocate(self, k: int) -> range:
        return core.allocated(
            await self._update_meta(core.allocate_update(k), "take sequence numbers"), k
        )

    async def _update_meta(self, update: dict[str, Any], what: str) -> dict[str, Any]:
        """Apply ``update`` to the stream's counter document and return it after; the
        document is created first where it is missing."""
        for _ in range(5):
            meta = await self._meta.find_one_and_update(
                core.meta_filter(), update, return_document=ReturnDocument.AFTER
            )
            if meta is not None:
                return meta
            # No upsert here: the embedded server answers None to one of two racing
            # upserts yet applies both, which would lose numbers. Create, then take.
            await self._ensure_meta()
        raise OperationFailed(
            f"Could not {what} for stream {self.name!r}: its counter document "
            f"in {core.meta_name(self.name)!r} could not be created or updated."
        )

    async def _ensure_meta(self) -> None:
        try:
            await self._meta.update_one(core.meta_filter(), core.meta_init(), upsert=True)
        except DuplicateKeyError:
            pass

    async def _setup(self, timeout: float) -> None:
        """Create the metadata document and the buckets' collection before the first
        write: once per process, never alongside other start-up work (a collection
        created by an insert at the same time as another's index stalls the embedded
        server)."""
        if self._setup_done:
            return
        key = startup_key(self._col, "stream")
        async with AsyncStartup(timeout):
            if key not in STARTUP_DONE:
                with self._bounded(timeout):
                    await self._ensure_meta()
                    try:
                        await self.db.command("create", self._col.name)
                    except OperationFailure as exc:
                        if exc.code != 48:  # NamespaceExists
                            raise
                STARTUP_DONE.add(key)
        self._setup_done = True

    async def _write(
        self, buckets: list[bucket.OpenBucket], stage: dict[str, Any] | None = None
    ) -> tuple[set[Any], BaseException | None]:
        """Number sealed buckets in seal order and write them (staged under ``stage`` if
        given), retrying within the retry budget (``AsyncProducer.insert_buckets``); a
        number whose hole was closed meanwhile (a tombstone owns it) is given up and the
        bucket renumbered."""
        deadline = self._producer.write_deadline(buckets)
        seqs: dict[Any, int] = {}

        async def documents(todo: list[bucket.OpenBucket]) -> list[dict[str, Any]]:
            await self._setup(deadlines.attempt_timeout(deadline, _now()))
            need = [ob for ob in todo if ob.id not in seqs]
            if need:
                for ob, seq in zip(need, await self._allocate(len(need)), strict=True):
                    seqs[ob.id] = seq
            now = _now()
            return [core.bucket_document(seqs[ob.id], ob.items, ob.id, now, stage) for ob in todo]

        async def taken_by_others(taken: dict[int, bucket.OpenBucket]) -> list[int]:
            # A number whose document is gone was ours and is consumed already (tombstones
            # outlive any producer's retry budget: tombstone_ttl >= retry_budget).
            found = self._col.find({"_id": {"$in": list(taken)}}, {"w": 1})
            owners = {d["_id"]: d.get("w") async for d in found}
            lost = [s for s in taken if s in owners and owners[s] != taken[s].id]
            for seq in lost:
                del seqs[taken[seq].id]
                self._stats["renumbered"] += 1
                log.warning("stream %s: seq %d was closed as a hole before its bucket landed; renumbering",
                            v.printable(self.name), seq)  # fmt: skip
            return lost

        return await self._producer.insert_buckets(
            self._col, buckets, deadline, documents, taken_by_others
        )

    def _written(self, buckets: list[bucket.OpenBucket], now: float) -> None:
        self._arrivals.notify()  # this process's own consumer need not wait for a poll

    @boundary("flush()")
    async def flush(self) -> None:
        """Write every open bucket and wait until stored."""
        if self._forked:
            raise used_after_fork(self)
        await self._producer.flush()

    # -- consume ----------------------------------------------------------------------------

    @boundary("consumer()")
    async def consumer(self, *, after: int | None = None) -> AsyncStreamConsumer:
        """Open the stream's one consumer, fencing every older one.

        It starts after the last acknowledged seq, or after ``after`` (a seq a sink stored
        atomically with its data): buckets up to ``after`` are acknowledged at once.
        """
        if self._forked:
            raise used_after_fork(self)
        with self._bounded(self.options.op_timeout, f"consumer() of stream {self.name!r}"):
            meta = await self.open_epoch()
            start = core.check_resume(self.name, after, meta)
            c = AsyncStreamConsumer(self, int(meta["epoch"]), int(meta.get("acked", 0)), start,
                                    str(meta["incarnation"]))  # fmt: skip
            if start > c.acked:
                await c._write_ack(start)
        return c

    async def open_epoch(self) -> dict[str, Any]:
        """Bump the consumer epoch (fencing every older consumer) and return the stream's
        metadata after it, its ``incarnation`` included (a stream made before incarnation
        ids gets one here); :meth:`consumer` does this."""
        meta = await self._update_meta(core.open_update(), "open a consumer epoch")
        if "incarnation" not in meta:
            flt, upd = core.incarnation_request()
            await self._meta.update_one(flt, upd)
            meta = await self._meta.find_one(core.meta_filter()) or meta
        return meta

    @boundary("position()")
    async def position(self) -> dict[str, int]:
        """``{"next", "acked", "epoch"}``: last seq handed out, last acknowledged, consumer epoch."""
        with self._bounded(self.options.op_timeout, f"position() of stream {self.name!r}"):
            meta = await self._meta.find_one(core.meta_filter()) or {}
        return {k: int(meta.get(k, 0)) for k in ("next", "acked", "epoch")}

    @boundary("size()")
    async def size(self) -> int:
        """Buckets handed out and not yet acknowledged (holes included): one read."""
        p = await self.position()
        return p["next"] - p["acked"]

    def stats(self) -> dict[str, int]:
        return dict(self._stats)

    # -- quarantine --------------------------------------------------------------------------

    @boundary("quarantined()")
    async def quarantined(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Damaged buckets set aside by ``consumer.quarantine(seq)``, oldest first
        (``id`` is the seq they had)."""
        return await self._quarantine.summaries(limit)

    @boundary("requeue_quarantined()")
    async def requeue_quarantined(self, bucket_id: Any = None) -> dict[str, int]:
        """Append what can be recovered of quarantined buckets (one seq, or all) to the
        stream as new buckets: they get new seqs, after everything pushed before."""
        return await self._quarantine.requeue(self._put_recovered, bucket_id)

    @boundary("remove_quarantined()")
    async def remove_quarantined(self, bucket_id: Any = None) -> int:
        """Delete quarantined buckets (one seq, or all) for good; returns how many."""
        return await self._quarantine.remove(bucket_id)

    @boundary("write_staged()")
    async def write_staged(self, buckets: list[list[bytes]], stage: dict[str, Any]) -> None:
        """Write sealed buckets of encoded items (see :func:`bucketq.stream.core.pack`)
        staged under ``stage`` (``{"j": job, "t": attempt}``): numbered, retried and
        renumbered like pushed buckets, and invisible to the consumer (they block it at
        their number) until published or closed. The Spark data source's writes."""
        if self._forked:
            raise used_after_fork(self)
        if not buckets:
            return
        now = _now()
        failed, error = await self._write([core.sealed(items, now) for items in buckets], stage)
        if failed:
            raise PushFailed(
                f"Writing {len(failed)} staged bucket(s) to stream {self.name!r} failed: {error}"
            ) from error

    async def _put_recovered(self, writer: Any, items: list[bytes]) -> None:
        failed, error = await self._write([bucket.recovered_bucket(writer, items, _now())])
        if failed:
            raise PushFailed(f"Re-queueing quarantined items failed: {error}") from error

    @boundary("close()")
    async def close(self) -> dict[str, int]:
        """Write what is buffered, stop the writer, and report as ``Queue.close()`` does:
        ``buckets_written`` by this call and ``push_failed`` (items that could not be
        stored). Idempotent (the same report again); the client stays open. In a child
        forked from the process that opened it, it does nothing (the parent writes)."""
        if self._forked:
            return {"buckets_written": 0, "push_failed": 0}
        if self._close_report is not None:
            return self._close_report
        written, failed = self._stats["buckets_written"], self._stats["push_failed"]
        await self.flush()
        self._closed = True
        await self._producer.stop()
        self._close_report = {
            "buckets_written": self._stats["buckets_written"] - written,
            "push_failed": self._stats["push_failed"] - failed,
        }
        return self._close_report

    async def drain(self) -> dict[str, int]:
        """The same as :meth:`close` (a stream has no consumer state to release)."""
        return await self.close()


class AsyncStreamConsumer(AsyncClosing):
    """The one reader of a stream. :meth:`next_batch` returns buckets in seq order,
    :meth:`ack` / :meth:`ack_through` acknowledge them (and delete them) in order.
    Every call fails with :class:`~bucketq.errors.Fenced` once a newer consumer opened."""

    def __init__(self, stream: AsyncStreamQueue, epoch: int, acked: int, start: int,
                 incarnation: str) -> None:  # fmt: skip
        self.stream = stream
        self.epoch = epoch
        #: The stream's incarnation (``core``): a position stored with its seq (a sink's,
        #: a Spark checkpoint's) means something only in the incarnation it was read from.
        self.incarnation = incarnation
        self.acked = acked
        self.cursor = start  # last seq read (delivered or skipped)
        self._buffer: deque[core.StreamBatch] = deque()
        self._delivered: list[int] = []
        self._clock = core.HoleClock(stream.options.hole_grace, stream.options.stage_timeout)
        self._closed = False
        self._damaged: DamagedBucket | None = None
        self._fenced = False
        self.holes_closed = 0
        #: True while next_batch waits for a bucket (between two reads).
        self.waiting = False
        #: Wakes next_batch on new buckets by change stream (None: change_streams=False).
        self._watch: AsyncWakeWatcher | None = None
        opts = stream.options
        if opts.change_streams is not False:
            self._watch = stream._runtime.wake_watcher(
                stream._col,
                core.WAKEUP_PIPELINE,
                stream._arrivals,
                opts.op_timeout,
                expected=opts.change_streams is True,
                what=f"stream {v.printable(stream.name)}: consumer epoch {epoch}",
                stopped=lambda: self._closed or self._fenced or stream._forked,
            )

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"This consumer of stream {self.stream.name!r} is closed.")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.stream.name} epoch={self.epoch} acked={self.acked}>"

    @property
    def delivered(self) -> list[int]:
        """Sequence numbers delivered and not yet acknowledged, oldest first."""
        return list(self._delivered)

    @boundary("next_batch()")
    async def next_batch(self, timeout: float | None = None) -> core.StreamBatch | None:
        """The next bucket as ``StreamBatch(seq, items)``, or None when ``timeout`` seconds
        pass first. Waits at most ``hole_grace`` on a hole, then closes it.

        While it waits, a bucket stored by this stream object, or a change event where
        the server has change streams (``change_streams``), wakes it at once; otherwise
        it reads again at most every ``poll_interval``."""
        if self.stream._forked:
            raise used_after_fork(self.stream)
        self._check_open()
        v.timeout("timeout", timeout)
        try:
            return await self._next_batch(timeout)
        finally:
            if self._watch is not None:
                self._watch.done()

    async def _next_batch(self, timeout: float | None) -> core.StreamBatch | None:
        deadline = None if timeout is None else _monotonic() + timeout
        idle = 0
        fresh = False  # whether the epoch was just checked by a read
        what = f"next_batch() on stream {self.stream.name!r}"
        arrivals = self.stream._arrivals
        while True:
            if self._buffer:
                if not fresh:
                    with self._bounded(deadline, what):
                        await self.check_epoch()  # every delivery is fenced, read-ahead too
                b = self._buffer.popleft()
                self._delivered.append(b.seq)
                return b
            gen = arrivals.gen  # before the read: what is stored during it wakes the wait
            with self._bounded(deadline, what):
                wait = await self._fill()
            fresh = True
            if self._buffer:
                continue
            if self._damaged is not None:
                d = self._damaged
                raise DamagedBucket(str(d), reason=d.reason, seq=d.seq)
            if wait <= 0:
                idle = 0
                continue
            idle += 1
            nap = deadlines.wait_within(
                core.idle_nap(idle, wait, self.stream.options.poll_interval), deadline, _monotonic()
            )
            if nap is None:
                return None
            if self._watch is not None:
                self._watch.want()
            self.waiting = True
            try:
                await arrivals.wait(gen, nap)
            finally:
                self.waiting = False

    def _bounded(self, deadline: float | None, what: str) -> Any:
        """A read of ``next_batch``: ``op_timeout``, and no longer than the caller's
        ``timeout`` (at least ``MIN_ATTEMPT_TIMEOUT``)."""
        seconds = deadlines.call_timeout(self.stream.options.op_timeout, deadline, _monotonic())
        return self.stream._bounded(seconds, what)

    async def check_epoch(self) -> dict[str, Any]:
        """The stream's metadata; raises :class:`~bucketq.errors.Fenced` once a newer
        consumer opened."""
        meta = await self.stream._meta.find_one(core.meta_filter())
        if meta is None or int(meta.get("epoch", -1)) != self.epoch:
            self._fenced = meta is not None
            raise Fenced(
                core.fenced_message(self.stream.name, self.epoch, meta and meta.get("epoch"))
            )
        return meta

    async def _fill(self) -> float:
        """One fenced read; returns how long to wait before the next (0: go on at once)."""
        opts = self.stream.options
        meta = await self.check_epoch()
        cur = (
            self.stream._col.find({"_id": {"$gt": self.cursor}})
            .sort("_id", 1)
            .limit(opts.read_ahead)
        )
        docs = await cur.to_list()
        res = core.scan(self.cursor, docs, int(meta.get("next", 0)))
        self._damaged = None
        for d in res.ready:
            if not core.is_tombstone(d):
                try:
                    self._buffer.append(core.to_batch(d, self.stream.name))
                except DamagedBucket as exc:
                    # Never past it silently: deliver what came before, then raise.
                    self._damaged = exc
                    log.error("%s", exc)
                    return 0.0
            self.cursor = d["_id"]
        self._clock.passed(self.cursor)
        if res.ready or res.blocked is None:
            return 0.0 if res.ready else opts.poll_interval
        return await self._unblock(res.blocked)

    async def _unblock(self, blocked: tuple[str, int, dict[str, Any] | None]) -> float:
        """Close the number the reader is blocked on once it waited long enough; returns
        how long it still has to wait (0: closed, or filled meanwhile: read on)."""
        kind, seq, doc = blocked
        due = self._clock.due_in(kind, seq, _monotonic())
        if due > 0:
            return due
        await self.close_hole(kind, seq, doc)
        return 0.0

    async def close_hole(self, kind: str, seq: int, doc: dict[str, Any] | None) -> bool:
        """Close a blocked number (``kind`` and ``doc`` as :func:`bucketq.stream.core.scan`
        reports it): a tombstone for a missing bucket, a staged bucket turned into one.
        Returns whether it closed it; False when the bucket arrived or was published
        meanwhile (then ``holes_closed`` does not count it and the reader reads it)."""
        now = _now()
        if kind == "missing":
            try:
                await self.stream._col.insert_one(core.tombstone(seq, now))
            except DuplicateKeyError:
                return False  # the bucket arrived after all: read it next
        else:
            assert doc is not None
            flt, upd = core.close_staged(seq, doc["stg"], now)
            res = await self.stream._col.update_one(flt, upd)
            if not res.matched_count:
                return False  # published (or closed) meanwhile
        self.holes_closed += 1
        log.warning("stream %s: closed %s seq %d after its grace period", v.printable(self.stream.name),
                    "hole" if kind == "missing" else "stale staged bucket", seq)  # fmt: skip
        return True

    @boundary("reachable()")
    async def reachable(self, after: int, max_items: int | None = None) -> int:
        """The highest seq that follows ``after`` without a gap, and no more than
        ``max_items`` items past it (at least one bucket): what a reader that fetches
        ranges itself (the Spark source, per micro-batch) may read next. Numbers blocked
        longer than their grace are closed on the way, as :meth:`next_batch` does. Reads
        no items and moves no cursor."""
        self._check_open()
        what = f"reachable() on stream {self.stream.name!r}"
        with self._bounded(None, what):
            allocated = int((await self.check_epoch()).get("next", 0))
        cursor, items = after, 0
        while True:
            with self._bounded(None, what):
                cur = self.stream._col.find({"_id": {"$gt": cursor}}, {"items": 0})
                docs = await cur.sort("_id", 1).limit(SCAN_PAGE).to_list()
            res = core.scan(cursor, docs, allocated)
            for d in res.ready:
                n = int(d.get("n", 0))
                if max_items is not None and items and items + n > max_items:
                    return cursor
                cursor = d["_id"]
                items += n
            self._clock.passed(cursor)
            if res.blocked is None:
                if len(docs) < SCAN_PAGE or not res.ready:
                    return cursor
                continue
            with self._bounded(None, what):
                if await self._unblock(res.blocked) > 0:
                    return cursor

    @boundary("quarantine()")
    async def quarantine(self, seq: int) -> bool:
        """Set aside the damaged bucket at ``seq`` (see :class:`~bucketq.errors.DamagedBucket`):
        it is kept in ``<stream>.quarantine`` and its seq closed like a hole, so the next
        :meth:`next_batch` goes on after it. False if it is not there any more. Raises
        :class:`~bucketq.errors.ConfigurationError` for a bucket that is not damaged."""
        self._check_open()
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= self.cursor:
            raise ConfigurationError(
                f"quarantine() takes the seq of a damaged bucket not yet delivered (after "
                f"{self.cursor}); got {seq!r}."
            )
        await self.check_epoch()
        doc = await self.stream._col.find_one({"_id": seq})
        if doc is None or core.is_tombstone(doc) or core.is_staged(doc):
            return False
        try:
            core.to_batch(doc, self.stream.name)
        except DamagedBucket as exc:
            reason = exc.reason
        else:
            raise ConfigurationError(
                f"The bucket at seq {seq} of stream {self.stream.name!r} is not damaged; "
                "only a damaged bucket can be quarantined."
            )
        await self.stream._quarantine.put(doc, reason, f"epoch {self.epoch}")
        await self.stream._col.update_one(
            {"_id": seq, "hole": {"$exists": False}}, core.quarantined_tombstone(_now())
        )
        self.stream._stats["quarantined"] += 1
        self._damaged = None
        log.error("stream %s: moved the damaged bucket at seq %d to %s (%s)",
                  v.printable(self.stream.name), seq, v.printable(self.stream._quarantine.name), reason)  # fmt: skip
        return True

    @boundary("ack()")
    async def ack(self, seq: int) -> None:
        """Acknowledge the next unacknowledged bucket; it is deleted."""
        if core.ack_target(self._delivered, self.acked, seq, through=False):
            await self._bounded_ack(seq, "ack()")

    @boundary("ack_through()")
    async def ack_through(self, seq: int) -> None:
        """Acknowledge every delivered bucket up to and including ``seq``."""
        if core.ack_target(self._delivered, self.acked, seq, through=True):
            await self._bounded_ack(seq, "ack_through()")

    @boundary("write_ack()")
    async def write_ack(self, seq: int) -> None:
        """Acknowledge (and delete) through ``seq`` under this consumer's epoch, without
        the delivery checks of :meth:`ack_through`: for a reader that fetched the buckets
        itself (the Spark source commits a micro-batch with it). Raises
        :class:`~bucketq.errors.Fenced` once a newer consumer opened."""
        await self._bounded_ack(seq, "write_ack()")

    async def _bounded_ack(self, seq: int, what: str) -> None:
        with self._bounded(None, f"{what} on stream {self.stream.name!r}"):
            await self._write_ack(seq)

    async def _write_ack(self, seq: int) -> None:
        self._check_open()
        res = await self.stream._meta.update_one(core.ack_filter(self.epoch), core.ack_update(seq))
        if not res.matched_count:
            meta = await self.stream._meta.find_one(core.meta_filter())
            self._fenced = True
            raise Fenced(
                core.fenced_message(self.stream.name, self.epoch, meta and meta.get("epoch"))
            )
        self.acked = max(self.acked, seq)
        while self._delivered and self._delivered[0] <= seq:
            del self._delivered[0]
        if self.cursor < seq:
            self.cursor = seq
        try:
            await self.stream._col.delete_many(
                core.delete_acked_filter(seq, _now(), self.stream.options.tombstone_ttl)
            )
        except PyMongoError as exc:  # acked is what counts; the next ack deletes them
            log.warning(
                "stream %s: deleting acknowledged buckets failed (%s)",
                v.printable(self.stream.name),
                exc,
            )

    async def close(self) -> None:
        """Forget what was delivered and not acknowledged (the next consumer reads it
        again), and stop the change-stream watcher."""
        self._closed = True
        self._buffer.clear()
        self._delivered.clear()
        if self._watch is not None:
            self._watch.stop()
            await self._watch.join()
