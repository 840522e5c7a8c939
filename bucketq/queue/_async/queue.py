"""The bucket queue's I/O shell (pymongo ``AsyncMongoClient``).

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
Decisions live in ``_core``; this file builds, calls the driver, interprets.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.errors import (
    BulkWriteError,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
    WriteConcernError,
)

from ... import _validate as v
from ..._driver import boundary
from ...errors import (
    BucketQError,
    DamagedBucket,
    PushFailed,
    QueueClosed,
    WriteConcernNotConfirmed,
)
from .. import _core as core
from .. import _deadline as deadlines
from .._codec import CODEC_OPTIONS, encode_item
from .._concurrency import (
    STARTUP_DONE,
    AsyncLock,
    AsyncNotifier,
    AsyncReceipt,
    AsyncStartup,
    AsyncWorker,
    async_register_exit,
    async_sleep,
    startup_key,
    used_after_fork,
)
from .._db import check_async_database
from .producer import AsyncProducer
from .quarantine import AsyncQuarantine

log = logging.getLogger("bucketq.queue")

_now = time.time
_monotonic = time.monotonic


class AsyncQueue(AsyncProducer):
    """A durable queue on MongoDB that packs pushed items into bucket documents.

    ``db`` is a pymongo ``AsyncDatabase``; the queue uses the collection ``name``.
    Options and their defaults are those of :class:`bucketq.queue.QueueOptions`.
    """

    def __init__(self, db: Any, name: str, **options: Any) -> None:
        self.options = opts = core.QueueOptions.build(**options)
        self.name = core.check_name(name)
        core.check_dead_letter_name(name, opts)
        self.db = check_async_database(db)
        self._col = db.get_collection(
            name, codec_options=CODEC_OPTIONS, write_concern=opts.get_write_concern()
        )
        self._init_producer(opts, "queue")
        self._flush_lock = AsyncLock()
        self._ready: deque[core.Message] = deque()
        self._held: dict[ObjectId, core.HeldBucket] = {}
        self._consumers = AsyncNotifier()
        self._fetch_wake = AsyncNotifier()
        self._flush_wake = AsyncNotifier()
        # Set while claims come back empty; the change-stream watcher reads only then.
        self._starved = True
        self._starved_wake = AsyncNotifier()
        self._waiters = 0
        self._fetch_full = False  # the fetcher waits for room under prefetch
        self._last_reserve = 0.0
        self._next_local_mature: float | None = None
        # hold_pushed: buckets being inserted leased to this queue (see _lease_on_write).
        self._leased_on_write: dict[ObjectId, tuple[dict[str, Any], ObjectId, float]] = {}
        self._stats = core.new_stats()
        self._paused = False
        self._draining = False
        self._closed = False
        self._drain_report: dict[str, int] | None = None
        self._setup_done = False
        self._fetcher: AsyncWorker | None = None
        self._flusher: AsyncWorker | None = None
        self._watcher: AsyncWorker | None = None
        self._dlq: AsyncQueue | None = None
        self._quarantine = AsyncQuarantine(db, name, opts.get_write_concern())
        async_register_exit(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.db.name}.{self.name}>"

    # -- setup --------------------------------------------------------------------------

    async def _setup(self, timeout: float | None = None) -> None:
        """Create the claim index (and so the collection): once per collection and
        process, never alongside other start-up work (see ``AsyncStartup``); within
        ``timeout`` seconds (default ``op_timeout``), else it is tried again later."""
        if self._setup_done:
            return
        timeout = self.options.op_timeout if timeout is None else timeout
        key = startup_key(self._col, "mature_id")
        try:
            async with AsyncStartup(timeout):
                if key not in STARTUP_DONE:
                    with self._bounded(timeout):
                        await self._col.create_index(core.CLAIM_SORT, name="mature_id")
                    STARTUP_DONE.add(key)
            self._setup_done = True
        except (PyMongoError, deadlines.StartupBusy) as exc:
            log.warning(
                "queue %s: creating the claim index failed (%s); will retry", self.name, exc
            )

    def _check_open(self) -> None:
        if self._forked:
            raise used_after_fork(self)
        if self._closed or self._draining:
            raise QueueClosed(
                f"Queue {self.name!r} is drained or closed; open a new Queue to go on."
            )

    # -- push ---------------------------------------------------------------------------

    async def push(
        self,
        payload: Any,
        *,
        delay: float | None = None,
        mature: Any = None,
        headers: dict[str, Any] | None = None,
        durable: bool = False,
    ) -> AsyncReceipt:
        """Buffer one item and return its receipt at once (``durable=True``: once stored)."""
        self._check_open()
        item = encode_item(payload, core.check_push(headers, durable))
        now = _now()
        at = (
            core.mature_time(now, delay, mature) if delay is not None or mature is not None else now
        )
        if self._pending_bytes + len(item) > self.options.max_pending_bytes:
            await self._wait_for_space(len(item))
        receipt = self._add(item, at, now)
        if durable:
            await self._wait_stored([receipt])
        return receipt

    async def push_many(
        self,
        payloads: Any,
        *,
        delay: float | None = None,
        mature: Any = None,
        headers: dict[str, Any] | None = None,
        durable: bool = False,
    ) -> list[AsyncReceipt]:
        """Push several items; all are encoded first, so one bad item stores none of them."""
        self._check_open()
        payloads = v.payloads(payloads)
        headers = core.check_push(headers, durable)
        at = (
            core.mature_time(_now(), delay, mature)
            if delay is not None or mature is not None
            else None
        )
        return await self._add_many(payloads, headers, at, durable)

    async def _write(self, buckets: list[core.OpenBucket]) -> tuple[set[Any], BaseException | None]:
        """Insert sealed buckets (one command), retrying transient failures within the
        retry budget; an id already there is an earlier attempt that landed."""
        deadline = self._write_deadline(buckets)
        await self._setup(deadlines.attempt_timeout(deadline, _now()))
        docs, bad = core.build_documents(buckets, core.OpenBucket.document)
        self._lease_on_write(docs)
        by_id = {ob.id: ob for ob in buckets}
        attempt = 0
        while docs:
            try:
                with self._attempt(deadline):
                    if len(docs) == 1:
                        await self._col.insert_one(next(iter(docs.values())))
                    else:
                        await self._col.insert_many(list(docs.values()), ordered=False)
                docs.clear()
            except DuplicateKeyError:
                docs.clear()  # an earlier attempt landed
            except WriteConcernError as exc:  # stored; the write concern was not confirmed
                for k in docs:
                    by_id[k].error = core.write_concern_unconfirmed("queue", self.name, exc)
                docs.clear()
            except PyMongoError as exc:
                if isinstance(exc, BulkWriteError):
                    _, failed = core.split_write_errors(exc)
                    if core.bulk_write_concern_failed(exc):
                        for k in docs.keys() - failed:
                            by_id[k].error = core.write_concern_unconfirmed("queue", self.name, exc)
                    docs = {k: v for k, v in docs.items() if k in failed}
                    if not docs:
                        break
                attempt += 1
                if not await self._retry_insert(exc, deadline, attempt):
                    for k in docs:
                        self._leased_on_write.pop(k, None)
                    return set(docs) | bad, exc
        return bad, None

    def _lease_on_write(self, docs: dict[Any, dict[str, Any]]) -> None:
        """``hold_pushed``: while this queue object consumes, the mature buckets it writes
        are inserted already leased to it (``_written`` serves them here), which spares
        a claim per bucket; if this process dies, they come back when the lease runs out."""
        if not self.options.hold_pushed or self._fetcher is None or self._paused:
            return
        if self._draining or self._closed:
            return
        now = _now()
        for bid, doc in docs.items():
            if core.from_datetime(doc["mature"]) <= now:
                token = ObjectId()
                self._leased_on_write[bid] = (dict(doc), token, now)
                _, upd = core.claim_request(now, token, self.options.owner, self.options.lease)
                doc.update(upd["$set"], leases=1)

    def _written(self, buckets: list[core.OpenBucket], now: float) -> None:
        claim = False
        for ob in buckets:
            held = self._leased_on_write.pop(ob.id, None)
            if held is not None:
                self._hold_written(*held)
                continue
            claim = True
            if ob.mature > now and (
                self._next_local_mature is None or ob.mature < self._next_local_mature
            ):
                self._next_local_mature = ob.mature
        if claim:
            self._fetch_wake.notify()

    def _hold_written(self, doc: dict[str, Any], token: ObjectId, sent: float) -> None:
        """Serve a bucket this queue inserted leased to itself, as if it had claimed it."""
        b = core.HeldBucket(doc, token, sent, self.options.lease)
        b.origin = self
        self._stats["held_on_write"] += 1
        with self._mutex:
            msgs = b.ready_messages(sent, self.options.max_tries)
            b.queued = len(msgs)
            self._held[b.id] = b
            self._ready.extend(msgs)
        if msgs:
            self._consumers.notify()

    @boundary("flush()")
    async def flush(self) -> None:
        """Write every open bucket and wait until stored; then flush consumer state."""
        if self._forked:
            raise used_after_fork(self)
        await self._flush_pushes()
        with self._bounded(None, f"flush() of queue {self.name!r}"):
            await self._flush_state()

    # -- consume ------------------------------------------------------------------------

    def _start_consuming(self) -> None:
        if self._fetcher is None and not self._closed:
            self._fetcher = self._worker("fetcher", self._fetcher_loop)
            self._flusher = self._worker("flusher", self._flusher_loop)
            if self.options.change_streams is not False:
                self._watcher = self._worker("watcher", self._watcher_loop)

    async def reserve(self, timeout: float | None = None) -> core.Message | None:
        """The next item, or None when ``timeout`` seconds pass (or the queue drains)."""
        out: list[core.Message] = []
        if self._forked:
            raise used_after_fork(self)
        if timeout is not None:
            v.timeout("timeout", timeout)
        if self._ready and self._fetcher is not None:  # the common case: no waiting
            with self._mutex:
                self._take(_now(), 1, out)
            if out:
                return out[0]
        got = await self._reserve(1, timeout)
        return got[0] if got else None

    async def reserve_many(
        self, max_items: int, timeout: float | None = None
    ) -> list[core.Message]:
        """Up to ``max_items`` items at once: waits (up to ``timeout``) for the first, then
        takes what else is ready without waiting. Empty on timeout or once drained."""
        return await self._reserve(core.check_max_items(max_items), v.timeout("timeout", timeout))

    async def _reserve(self, max_items: int, timeout: float | None) -> list[core.Message]:
        if self._forked:
            raise used_after_fork(self)
        if self._fetcher is None:
            if self._closed:
                raise QueueClosed(f"Queue {self.name!r} is closed.")
            self._start_consuming()
        deadline = None
        out: list[core.Message] = []
        while True:
            gen = self._consumers.gen
            with self._mutex:
                expired = self._take(_now(), max_items, out)
                if out or self._draining or self._closed:
                    return out
            if timeout is not None:
                if deadline is None:
                    deadline = _monotonic() + timeout
                remaining = deadline - _monotonic()
                if remaining <= 0:
                    return out
            else:
                remaining = None
            if expired:
                self._flush_wake.notify()
                period = self.options.state_flush_period
                remaining = period if remaining is None else min(remaining, period)
            self._waiters += 1
            try:
                await self._consumers.wait(gen, remaining)
            finally:
                self._waiters -= 1

    def _take(self, now: float, max_items: int, out: list[core.Message]) -> bool:
        """Move up to ``max_items`` ready messages into ``out`` (mutex held). True when a
        bucket's lease is (nearly) out: our process was frozen or cut off from the server,
        or its claim came back late, so nothing of it is handed out until the flusher
        renewed it or found it lost."""
        ready = self._ready
        if self._paused:
            return False
        limit = core.serve_until(now, self.options.lease)
        while ready and len(out) < max_items:
            msg = ready[0]
            b = msg.bucket
            if b.until <= limit and b.held:
                return True
            ready.popleft()
            b.queued -= 1
            if b.lost or b.released or not b.held:
                continue
            b.handed += 1
            b.handed_at[msg.index] = now
            out.append(msg)
            if b.queued == 0 and self._fetch_full:
                self._fetch_wake.notify()  # room for the fetcher's next claim
        if out:
            self._stats["reserved"] += len(out)
            self._last_reserve = now
        return False

    @boundary("commit()")
    async def commit(self, msg: core.Message, *, flush: bool = False) -> bool:
        """Mark the item consumed. False if this process no longer holds its bucket
        (the lease was lost or released; the item will be delivered again), or if ``msg``
        was rolled back already (a rollback ends its delivery, even when the item is
        delivered again at once)."""
        if self._forked:
            raise used_after_fork(self)
        core.check_message(msg, self, "commit")
        v.flag("flush", flush)
        with self._mutex:
            ok = core.is_current(msg) and msg.bucket.commit(msg.index)
            if ok:
                self._stats["committed"] += 1
                if msg.bucket.finished():
                    self._flush_wake.notify()  # its last item: delete it now, not a period later
        if ok and flush:
            with self._bounded(None, f"commit(flush=True) on queue {self.name!r}"):
                await self._flush_state()
            if msg.bucket.lost:
                return False
        return ok

    @boundary("commit_many()")
    async def commit_many(self, msgs: Any, *, flush: bool = False) -> int:
        """Commit several items; returns how many were committed (the others' buckets
        are no longer held here, and they will be delivered again)."""
        if self._forked:
            raise used_after_fork(self)
        msgs = [core.check_message(m, self, "commit_many") for m in v.payloads(msgs, "msgs")]
        v.flag("flush", flush)
        with self._mutex:
            done = [m for m in msgs if core.is_current(m) and m.bucket.commit(m.index)]
            self._stats["committed"] += len(done)
            if any(m.bucket.finished() for m in done):
                self._flush_wake.notify()
        if done and flush:
            with self._bounded(None, f"commit_many(flush=True) on queue {self.name!r}"):
                await self._flush_state()
            return sum(1 for m in done if not m.bucket.lost)
        return len(done)

    async def rollback(
        self,
        msg: core.Message,
        delay: float | None = None,
        *,
        next_t: Any = None,
        reason: str | None = None,
    ) -> bool:
        """Give the item back: delivered again not before ``delay`` seconds (or ``next_t``),
        by default ``reject_delta_factor * tries + reject_delta_base``; past ``max_tries``
        it goes to the dead-letter queue instead. False if this process no longer holds
        the bucket or ``msg`` was committed or rolled back already."""
        if self._forked:
            raise used_after_fork(self)
        core.check_message(msg, self, "rollback")
        v.text("reason", reason, optional=True)
        now = _now()
        tries = msg.tries + 1
        not_before = core.rollback_time(now, delay, next_t, tries, self.options)
        b = msg.bucket
        max_tries = self.options.max_tries
        with self._mutex:
            if not core.is_current(msg):
                return False
            why = core.over_tried(tries, max_tries, rolled_back=True)
            if why is not None and b.state[msg.index] == core.RESERVED and not b.lost:
                b.tries[msg.index] = tries
                b.dying.append((msg.index, reason or why))
                self._stats["rolled_back"] += 1
                self._flush_wake.notify()
                return True
            ok = b.rollback(msg.index, not_before, now)
            if ok:
                self._stats["rolled_back"] += 1
                if b.state[msg.index] == core.READY:
                    again = b.ready_messages(now, max_tries)
                    b.queued += len(again)
                    self._ready.extend(again)
                    self._consumers.notify()
                if b.dying:
                    self._flush_wake.notify()
        return ok

    async def pop(self, timeout: float | None = None) -> core.Message | None:
        """Reserve and commit in one step (at-most-once for this consumer)."""
        msg = await self.reserve(timeout)
        if msg is not None:
            await self.commit(msg)
        return msg

    def _buffered_buckets(self) -> int:
        return sum(1 for b in self._held.values() if b.queued > 0)

    async def _fetcher_loop(self) -> None:
        idle_attempt = 0
        while not self._closed:
            gen = self._fetch_wake.gen
            if self._paused or self._draining:
                await self._fetch_wake.wait(gen, None)
                continue
            if self._buffered_buckets() >= 1 + self.options.prefetch:
                # Woken when a bucket is handed out (not at each one otherwise: a claim
                # right after the fetcher found nothing would find nothing again).
                self._fetch_full = True
                try:
                    if self._buffered_buckets() >= 1 + self.options.prefetch:  # seen since?
                        await self._fetch_wake.wait(gen, None)
                finally:
                    self._fetch_full = False
                continue
            try:
                with self._bounded(self.options.op_timeout):
                    got = await self._claim()
            except PyMongoError as exc:
                idle_attempt += 1
                log.warning("queue %s: claim failed (%s); retrying", self.name, exc)
                await self._fetch_wake.wait(
                    gen, core.backoff(idle_attempt, 0.1, self.options.poll_interval) + 0.05
                )
                continue
            if got:
                idle_attempt = 0
                self._starved = False
                continue
            if not self._starved:
                self._starved = True
                self._starved_wake.notify()
            idle_attempt += 1
            wait = min(0.05 * 2 ** min(idle_attempt, 10), self.options.poll_interval)
            if self._next_local_mature is not None:
                wait = min(wait, max(self._next_local_mature - _now(), 0.0) + 0.01)
                if self._next_local_mature <= _now():
                    self._next_local_mature = None
            await self._fetch_wake.wait(gen, wait)

    async def _claim(self) -> bool:
        await self._setup()
        now = _now()
        token = ObjectId()
        flt, upd = core.claim_request(now, token, self.options.owner, self.options.lease)
        doc = await self._col.find_one_and_update(
            flt, upd, sort=core.CLAIM_SORT, return_document=ReturnDocument.BEFORE
        )
        if doc is None:
            return False
        self._stats["claims"] += 1
        # The lease the server wrote runs from ``now``, when the claim was sent, not from
        # when the answer came: a claim slower than the lease holds an expired lease.
        if doc["_id"] in self._held and await self._reclaim(doc, token, now):
            return True
        try:
            b = core.HeldBucket(doc, token, now, self.options.lease)
        except DamagedBucket as exc:
            await self._set_aside(doc, token, exc)
            return True
        b.origin = self
        if b.takeover:
            self._stats["takeovers"] += 1
        if self._draining or self._closed:
            self._held[b.id] = b
            await self._release([b])
            return True
        with self._mutex:
            msgs = b.ready_messages(now, self.options.max_tries)
            b.queued = len(msgs)
            self._held[b.id] = b
            self._ready.extend(msgs)
        if msgs:
            self._consumers.notify()
        if b.dying or not msgs:
            self._flush_wake.notify()
        return True

    async def _set_aside(self, doc: dict[str, Any], token: ObjectId, exc: DamagedBucket) -> None:
        """Quarantine a damaged bucket we claimed: keep it there first, then delete it
        here (fenced by our claim), so it is never lost and never claimed again."""
        await self._quarantine.put(doc, exc.reason, self.options.owner)
        await self._col.delete_one({"_id": doc["_id"], "lease.tok": token})
        self._stats["quarantined"] += 1
        log.error(
            "queue %s: bucket %s is damaged (%s); moved it to %s",
            self.name,
            doc["_id"],
            exc.reason,
            self._quarantine.name,
        )

    async def _reclaim(self, doc: dict[str, Any], token: ObjectId, sent: float) -> bool:
        """We claimed a bucket we still hold. Keep our state under the new lease if nobody
        held it in between; else drop what we hold as lost (the caller holds it anew).
        Waits for a flush in flight, so no write with the old token is outstanding."""
        async with self._flush_lock:
            with self._mutex:
                old = self._held.get(doc["_id"])
                if old is None:
                    return False
                if old.reclaim(doc, token, sent, self.options.lease):
                    self._stats["reclaims"] += 1
                    log.info("queue %s: renewed the lapsed lease of bucket %s", self.name, old.id)
                    self._consumers.notify()
                    return True
                if not old.lost:
                    old.lost = True
                    self._stats["lease_losses"] += 1
                    log.warning(
                        "queue %s: lost the lease of bucket %s; dropping it", self.name, old.id
                    )
                self._drop(old)
                return False

    def _drop(self, b: core.HeldBucket) -> None:
        """Forget a bucket this process no longer holds (call with the mutex held)."""
        if self._held.get(b.id) is b:
            del self._held[b.id]
        b.held = False

    async def _watcher_loop(self) -> None:
        """Wake the fetcher on inserted or released buckets (where the server has change
        streams); polling covers everything else."""
        pipeline = core.WAKEUP_PIPELINE
        while not self._closed:
            try:
                with self._bounded(self.options.op_timeout):
                    stream = await self._col.watch(pipeline, max_await_time_ms=500)
                async with stream:
                    while not self._closed:
                        if not self._starved:
                            # Claims succeed, so wake-ups are moot: leave the stream unread
                            # (the server keeps its place) and spare both sides the getMores.
                            gen = self._starved_wake.gen
                            if not self._starved:
                                await self._starved_wake.wait(gen, 1.0)
                            continue
                        with self._bounded(self.options.op_timeout):
                            change = await stream.try_next()
                        if change is not None and self._fetcher is not None:
                            self._fetch_wake.notify()
            except OperationFailure as exc:
                log.info("queue %s: no change streams on this server (%s); polling", self.name, exc)
                return
            except PyMongoError as exc:
                if self._closed:
                    return
                log.debug("queue %s: change stream interrupted (%s); reopening", self.name, exc)
                await async_sleep(1.0)

    # -- state flush ----------------------------------------------------------------------

    async def _flusher_loop(self) -> None:
        period = self.options.state_flush_period
        while not self._closed:
            gen = self._flush_wake.gen
            await self._flush_wake.wait(gen, period)
            if self._closed:
                return
            try:
                await self._flush_state()
            except PyMongoError as exc:
                log.warning("queue %s: state flush failed (%s); will retry", self.name, exc)

    async def _flush_state(self, *, release_all: bool = False) -> None:
        """Persist every changed held bucket with one fenced write each (one command),
        renew leases, release idle buckets. Never overlaps itself."""
        async with self._flush_lock:
            try:
                await self._dead_letter()
            except Exception:
                self._stats["dead_letter_failed"] += 1
                log.exception("queue %s: moving items to the dead-letter queue failed", self.name)
            now = _now()
            lease = self.options.lease
            with self._mutex:
                self._requeue_due(now)
                for b in list(self._held.values()):
                    if not b.lost:
                        self._check_stalled(b, now)
                plan, unwritable = core.plan_flush(
                    list(self._held.values()), now, lease, release_all=release_all
                )
                for b, exc in unwritable:
                    # One bucket's state cannot be written: the others' still is.
                    self._stats["state_flush_errors"] += 1
                    log.error("queue %s: bucket %s: state not written: %s", self.name, b.id, exc)
            writes = [w for _, _, w in plan]
            targets = [(b, kind) for b, kind, _ in plan]
            if not writes:
                return
            # A renewal not answered in time counts as failed: the bucket's items are not
            # handed out once a third of its lease is left, and the next flush tries again.
            timeout = deadlines.state_flush_timeout(self.options.op_timeout, self.options.lease)
            try:
                with self._bounded(timeout):
                    res = await self._col.bulk_write(writes, ordered=False)
                done = res.matched_count + res.deleted_count
            except BulkWriteError as exc:
                # Some writes failed on the server: the others landed. Only the failed
                # buckets stay dirty (written again next time).
                bad = core.bulk_failed_indexes(exc)
                with self._mutex:
                    for k in sorted(bad):
                        b = targets[k][0]
                        b.dirty = True
                        self._stats["state_flush_errors"] += 1
                        log.error("queue %s: bucket %s: state write failed: %s", self.name, b.id,
                                  core.bulk_error_of(exc, k))  # fmt: skip
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
                with self._bounded(timeout):
                    now_docs = {
                        d["_id"]: d
                        async for d in self._col.find({"_id": {"$in": ids}}, {"lease": 1})
                    }
                lost = {
                    b.id
                    for b, kind in targets
                    if core.lost_after_flush(kind, b.token, now_docs.get(b.id))
                }
            with self._mutex:
                for b, kind in targets:
                    if b.id in lost:
                        b.lost = True
                        self._stats["lease_losses"] += 1
                        log.warning(
                            "queue %s: lost the lease of bucket %s; dropping it", self.name, b.id
                        )
                        self._drop(b)
                    elif kind == "delete":
                        self._drop(b)
                    elif kind == "release":
                        b.released = True
                        self._stats["released"] += 1
                        self._drop(b)
                    else:
                        b.until = now + lease
            if lost or any(kind != "update" for _, kind in targets):
                self._fetch_wake.notify()

    def _requeue_due(self, now: float) -> None:
        """Serve again, here, rolled-back items whose not-before has passed."""
        woke = False
        for b in self._held.values():
            if b.waiting and not b.lost:
                again = b.due_waiting(now, self.options.max_tries)
                if again:
                    b.queued += len(again)
                    self._ready.extend(again)
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
                self.name,
                core.item_id(b.id, i),
            )
        if stalled:
            # Serve them again here (they are READY now, like an item rolled back with no delay).
            again = b.ready_messages(now, self.options.max_tries)
            b.queued += len(again)
            self._ready.extend(again)
            self._consumers.notify()
            if b.dying:
                self._flush_wake.notify()

    async def _dead_letter(self) -> None:
        """Move over-tried items to the dead-letter queue: insert there first (durably),
        then mark them consumed here, so the worst case is a duplicate, never a loss."""
        dying = [
            (b, i, reason) for b in list(self._held.values()) if not b.lost for i, reason in b.dying
        ]
        if not dying:
            return
        if self._dlq is None:
            # Buckets as large as MongoDB allows: any item of this queue fits there with
            # its dead-letter headers, unless it is within a few bytes of the limit.
            self._dlq = type(self)(
                self.db,
                self.options.dead_letter_name(self.name),
                write_concern=self.options.write_concern,
                bucket_max_bytes=core.HARD_MAX_BYTES,
                retry_budget=self.options.retry_budget,
                op_timeout=self.options.op_timeout,
            )
        now = _now()
        # Each item on its own: one that cannot be moved (its data, or its insert failed)
        # stays in this queue, rolled back, and never holds up the others.
        pushed: list[tuple[core.HeldBucket, int, Any]] = []
        failed: list[tuple[core.HeldBucket, int, BaseException]] = []
        for b, i, reason in dying:
            it = b.items[i] if b.items is not None else {}
            try:
                headers = core.dead_letter_headers(
                    self.name, it.get("h"), b.tries.get(i, 0), reason, now
                )
                pushed.append((b, i, await self._dlq.push(it.get("p"), headers=headers)))
            except BucketQError as exc:
                failed.append((b, i, exc))
        await self._dlq._flush_pushes()
        moved = []
        for b, i, r in pushed:
            try:
                await r.wait()
                moved.append((b, i))
            except WriteConcernNotConfirmed:
                moved.append((b, i))  # stored there: do not keep a second copy here
            except PushFailed as exc:
                failed.append((b, i, exc))
        with self._mutex:
            for b, i in moved:
                b.dead(i)
                self._stats["dead_lettered"] += 1
            for b, i, why in failed:
                self._stats["dead_letter_failed"] += 1
                log.error(
                    "queue %s: item %s could not be moved to the dead-letter queue (%s); it "
                    "stays here and is tried again later",
                    self.name, core.item_id(b.id, i), why,
                )  # fmt: skip
                if b.state[i] == core.RESERVED and not b.lost:
                    b.rollback(i, now + core.retry_delay(b.tries.get(i, 0), self.options), now)
            done = {(b.id, i) for b, i in moved} | {(b.id, i) for b, i, _ in failed}
            for b in {id(b): b for b, _, _ in dying}.values():
                b.dying = [d for d in b.dying if (b.id, d[0]) not in done]

    # -- drain and close -------------------------------------------------------------------

    @boundary("drain()")
    async def drain(self, timeout: float | None = None) -> dict[str, int]:
        """Write open buckets, stop claiming, serve what is in memory to reserve() callers
        (until consumed or ``timeout``, default ``drain_timeout``), release the rest at once
        and flush state. Returns counts. Idempotent. In a child forked from the process
        that opened the queue, it does nothing (the parent drains)."""
        if self._forked:  # the parent owns what is buffered and held: touch nothing
            return {"buckets_written": 0, "served": 0, "released_buckets": 0, "released_items": 0}
        if self._drain_report is not None:
            return self._drain_report
        self._draining = True
        self._fetch_wake.notify()
        written_before = self._stats["buckets_written"]
        await self._flush_pushes()
        # Read-ahead nobody started on goes back at once.
        with self._mutex:
            read_ahead = [b for b in self._held.values() if b.handed == 0]
            for b in read_ahead:
                b.released = True
                b.queued = 0
            self._ready = deque(m for m in self._ready if not m.bucket.released)
        if read_ahead:
            with self._bounded(None, f"drain() of queue {self.name!r}"):
                await self._release(read_ahead)
        served_before = self._stats["reserved"]
        deadline = _monotonic() + (self.options.drain_timeout if timeout is None else timeout)
        while _monotonic() < deadline:
            outstanding = sum(b.outstanding - b.queued for b in self._held.values() if not b.lost)
            if not self._ready and not outstanding:
                break
            recent = _now() - self._last_reserve < 0.25
            if not outstanding and not self._waiters and not recent:
                break  # nothing here is consuming: do not sit out the deadline
            self._consumers.notify()
            await async_sleep(0.02)
        with self._mutex:
            left_in_memory = len(self._ready)
            self._ready.clear()
            for b in self._held.values():
                b.queued = 0
        released = len(self._held)
        with self._bounded(None, f"drain() of queue {self.name!r}"):
            await self._flush_state(release_all=True)
        self._consumers.notify()
        self._drain_report = {
            "buckets_written": self._stats["buckets_written"] - written_before,
            "served": self._stats["reserved"] - served_before,
            "released_buckets": released + len(read_ahead),
            "released_items": left_in_memory,
        }
        return self._drain_report

    async def _release(self, buckets: list[core.HeldBucket]) -> None:
        async with self._flush_lock:
            now = _now()
            writes = [core.state_write(b, now, self.options.lease, release=True) for b in buckets]
            with self._bounded(self.options.op_timeout):
                await self._col.bulk_write(writes, ordered=False)
            with self._mutex:
                for b in buckets:
                    b.released = True
                    self._drop(b)
                    self._stats["released"] += 1

    @boundary("close()")
    async def close(self) -> dict[str, int]:
        """Drain, then stop the background workers. Idempotent; the client stays open."""
        if self._forked:  # the parent owns what is buffered and held: touch nothing
            return {"buckets_written": 0, "served": 0, "released_buckets": 0, "released_items": 0}
        if self._closed:
            return self._drain_report or {}
        try:
            report = await self.drain()
        finally:
            await self._stop_workers()
        return report

    async def _stop_workers(self) -> None:
        """Stop the background workers (each join is bounded: their driver calls are)."""
        self._closed = True
        for n in (
            self._fetch_wake,
            self._flush_wake,
            self._writer_wake,
            self._consumers,
            self._starved_wake,
        ):
            n.notify()
        for w in (self._writer, self._fetcher, self._flusher):
            if w is not None:
                await w.join(5.0)
        if self._watcher is not None:
            # It only wakes the fetcher, and may sit in a change-stream read for up to
            # 500 ms: don't wait for it (it ends when that read returns).
            await self._watcher.join(0)
        if self._dlq is not None:
            await self._dlq.close()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- control and introspection ------------------------------------------------------------

    def pause(self) -> None:
        """Stop handing out items and claiming buckets until resume()."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._fetch_wake.notify()
        self._consumers.notify()

    async def _live_sum(self, flt: dict[str, Any]) -> int:
        with self._bounded(self.options.op_timeout, f"counting the items of queue {self.name!r}"):
            cursor = await self._col.aggregate(core.live_sum_pipeline(flt))
            return core.sum_result([r async for r in cursor])

    @boundary("size()")
    async def size(self) -> int:
        """Items ready to be delivered now (stored, mature, not leased)."""
        return await self._live_sum(core.ready_filter(_now()))

    @boundary("total_size()")
    async def total_size(self) -> int:
        """Every stored item not yet consumed."""
        return await self._live_sum({})

    @boundary("sched_size()")
    async def sched_size(self) -> int:
        """Stored items not yet mature."""
        return await self._live_sum(core.sched_filter(_now()))

    @boundary("resv_size()")
    async def resv_size(self) -> int:
        """Stored items in buckets leased by a consumer."""
        return await self._live_sum(core.leased_filter(_now()))

    @boundary("next_t()")
    async def next_t(self) -> Any:
        """The mature time of the next bucket to become deliverable (None if empty)."""
        now = _now()
        with self._bounded(self.options.op_timeout, f"next_t() of queue {self.name!r}"):
            doc = await self._col.find_one(
                core.not_leased(core.to_datetime(now)),
                {"mature": 1},
                sort=core.CLAIM_SORT,
            )
        return doc["mature"] if doc else None

    def stats(self) -> dict[str, int]:
        """Counters of this queue object since it opened, and what it holds in memory now."""
        s = dict(self._stats)
        s["pending_bytes"] = self._pending_bytes
        s["open_buckets"] = len(self._packer.open)
        s["held_buckets"] = len(self._held)
        s["ready_in_memory"] = len(self._ready)
        return s

    # -- quarantine ----------------------------------------------------------------------------

    @boundary("quarantined()")
    async def quarantined(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Damaged buckets set aside (in ``<name>.quarantine``), oldest first: ``id``,
        ``reason``, ``at``, ``n``, how many items are ``recoverable`` and how many ``lost``."""
        return await self._quarantine.summaries(limit)

    @boundary("requeue_quarantined()")
    async def requeue_quarantined(self, bucket_id: Any = None) -> dict[str, int]:
        """Put what can be recovered of quarantined buckets (one, or all) back in the
        queue as new buckets. Returns counts: ``buckets``, ``items`` re-queued, items
        ``lost``, buckets ``kept`` in quarantine because some of their items are lost."""
        return await self._quarantine.requeue(self._put_recovered, bucket_id)

    @boundary("remove_quarantined()")
    async def remove_quarantined(self, bucket_id: Any = None) -> int:
        """Delete quarantined buckets (one, or all) for good; returns how many."""
        return await self._quarantine.remove(bucket_id)

    async def _put_recovered(self, bucket_id: ObjectId, items: list[bytes]) -> None:
        now = _now()
        ob = core.recovered_bucket(bucket_id, items, now)
        failed, error = await self._write([ob])
        if failed:
            raise PushFailed(f"Re-queueing quarantined items failed: {error}") from error
        self._written([ob], now)

    @boundary("remove()")
    async def remove(self, id: str) -> bool:
        """Remove a stored item whose bucket no consumer holds. True if it was removed."""
        if self._forked:
            raise used_after_fork(self)
        bid, index = core.parse_item_id(id)
        if bid in self._unwritten:
            await self._flush_pushes()
        with self._bounded(self.options.op_timeout, f"remove() on queue {self.name!r}"):
            return await self._remove(bid, index)

    async def _remove(self, bid: ObjectId, index: int) -> bool:
        for _ in range(5):
            now = core.to_datetime(_now())
            doc = await self._col.find_one(
                {"_id": bid, **core.not_leased(now)},
                {"done": 1, "live": 1, "n": 1},
            )
            if doc is None or index >= doc["n"]:
                return False
            done = bytearray(doc.get("done") or bytes((doc["n"] + 7) // 8))
            if done[index >> 3] & (1 << (index & 7)):
                return False
            done[index >> 3] |= 1 << (index & 7)
            flt = {"_id": bid, "done": doc.get("done"), "live": doc["live"],
                   **core.not_leased(now)}  # fmt: skip
            if doc["live"] <= 1:
                res = await self._col.delete_one(flt)
                if res.deleted_count:
                    return True
            else:
                # Clearing an expired lease fences off its stalled holder.
                res = await self._col.update_one(
                    flt, {"$set": {"done": bytes(done), "lease": None}, "$inc": {"live": -1}}
                )
                if res.modified_count:
                    return True
        return False
