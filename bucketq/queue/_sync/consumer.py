# GENERATED from bucketq/queue/_async/consumer.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""The consume side of the bucket queue (pymongo ``MongoClient``).

It claims buckets (the fetcher, woken by the change-stream watcher, ``wake.py``, or by
polling), hands their items to ``reserve()`` callers, and writes their state back (the flusher:
commits, rollbacks, lease renewals, releases, dead letters). The queue owns it and
hands it what both sides share: the collection, the mutex, the counters, bounded
driver calls and the background-worker factory.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.errors import BulkWriteError, OperationFailure, PyMongoError

from ... import _validate as v
from ... import bucket
from ..._guard import backoff
from ...bucket import Quarantine, Runtime, WakeWatcher
from ...bucket import deadline as deadlines
from ...bucket.concurrency import Lock, Mutex, Notifier, Worker, sleep
from ...errors import BucketQError, DamagedBucket, PushFailed, QueueClosed, WriteConcernNotConfirmed
from .. import _core as core

log = logging.getLogger("bucketq.queue")

_now = time.time
_monotonic = time.monotonic

#: The claim form of each client whose server was asked (``core.claim_form``): once per
#: client, not per queue object.
_FORMS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _claim_form(client: Any, option: str) -> str:
    if option != "auto":
        return option
    form = _FORMS.get(client)
    if form is None:
        try:
            info = client.admin.command("buildInfo")
        except (
            OperationFailure
        ):  # refused (a user without the right): the one form every server has
            info = {}
        form = core.claim_form(option, info)
        _FORMS[client] = form
        log.debug("claims use %s on this server", form)
    return form


class Consumer:
    """What one queue object holds and hands out: claimed buckets (``held``), their
    messages ready in memory (``ready``), and the workers that keep them.

    It composes its queue object's ``runtime`` (the queue's name and counters, whether
    it is closed, bounded driver calls, guarded background loops that end once it is
    closed), as the producer does. ``origin`` is the queue object (messages remember
    who delivered them); with ``partitions`` > 1 its claims start at ``origin.partition``
    (so that consumers of other objects start elsewhere); ``setup()`` creates the claim
    index; ``open_dead_letter_queue()`` opens the queue over-tried items move to.
    """

    def __init__(
        self,
        runtime: Runtime,
        options: bucket.QueueOptions,
        *,
        origin: Any,
        col: Any,
        mutex: Mutex,
        quarantine: Quarantine,
        setup: Callable[[], Any],
        open_dead_letter_queue: Callable[[], Any],
    ) -> None:
        self._runtime = runtime
        self.name = runtime.name
        self._stats = runtime.stats
        self.options = options
        self.origin = origin
        self._col = col
        self._mutex = mutex
        self._quarantine = quarantine
        self._setup = setup
        self._open_dead_letter_queue = open_dead_letter_queue
        self._flush_lock = Lock()
        self.ready: deque[core.Message] = deque()
        self.held: dict[ObjectId, core.HeldBucket] = {}
        self._consumers = Notifier()
        self._fetch_wake = Notifier()
        self._flush_wake = Notifier()
        # Set while claims come back empty: the fetcher waits, and the watcher reads for
        # it. Not at first: a partitioned queue's first claim is in its own partition,
        # where its own pushes went (one read, not a probe and then a claim).
        self._starved = False
        self._first_claim = True
        self._waiters = 0
        self._fetch_full = False  # the fetcher waits for room under prefetch
        self._last_reserve = 0.0
        self._next_local_mature: float | None = None
        # hold_pushed: buckets being inserted leased to this queue (see lease_on_write).
        self._leased_on_write: dict[ObjectId, tuple[dict[str, Any], ObjectId, float]] = {}
        self.paused = False
        self.draining = False
        self.fetcher: Worker | None = None
        self.flusher: Worker | None = None
        #: Wakes the fetcher on inserted or released buckets by change stream while its
        #: claims find nothing (None: change_streams=False).
        self.watcher: WakeWatcher | None = None
        if options.change_streams is not False:
            self.watcher = runtime.wake_watcher(
                col,
                core.WAKEUP_PIPELINE,
                self._fetch_wake,
                options.op_timeout,
                expected=options.change_streams is True,
            )
        self._dlq: Any = None
        # Partitioned: each claim searches one partition, in this consumer's rotation,
        # which starts at its queue object's own.
        self._rotation = (
            core.Rotation(origin.partition, options.partitions) if options.partitions > 1 else None
        )
        # The claim form (``core.claim_form``), known at the first claim; with
        # find_then_update, the candidates read and not yet tried, of one partition.
        self._claim_form: str | None = None
        self._candidates = core.Candidates()

    def start(self) -> None:
        """Start the fetcher and the flusher (the fetcher starts the watcher when idle)."""
        if self.fetcher is None and not self._runtime.is_closed():
            self.fetcher = self._runtime.worker("fetcher", self._fetcher_loop)
            self.flusher = self._runtime.worker("flusher", self._flusher_loop)

    def reserve(self, timeout: float | None = None) -> core.Message | None:
        out: list[core.Message] = []
        if timeout is not None:
            v.timeout("timeout", timeout)
        if self.ready and self.fetcher is not None:  # the common case: no waiting
            with self._mutex:
                self._take(_now(), 1, out)
            if out:
                return out[0]
        got = self._reserve(1, timeout)
        return got[0] if got else None

    def reserve_many(self, max_items: int, timeout: float | None = None) -> list[core.Message]:
        return self._reserve(bucket.check_max_items(max_items), v.timeout("timeout", timeout))

    def _reserve(self, max_items: int, timeout: float | None) -> list[core.Message]:
        if self.fetcher is None:
            if self._runtime.is_closed():
                raise QueueClosed(f"Queue {self.name!r} is closed.")
            self.start()
        deadline = None
        out: list[core.Message] = []
        while True:
            gen = self._consumers.gen
            with self._mutex:
                expired = self._take(_now(), max_items, out)
                if out or self.draining or self._runtime.is_closed():
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
                self._consumers.wait(gen, remaining)
            finally:
                self._waiters -= 1

    def _take(self, now: float, max_items: int, out: list[core.Message]) -> bool:
        """Move up to ``max_items`` ready messages into ``out`` (mutex held). True when a
        bucket's lease is (nearly) out: our process was frozen or cut off from the server,
        or its claim came back late, so nothing of it is handed out until the flusher
        renewed it or found it lost."""
        ready = self.ready
        if self.paused:
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

    def commit(self, msg: core.Message, *, flush: bool = False) -> bool:
        core.check_message(msg, self.origin, "commit")
        if flush is not False:
            v.flag("flush", flush)
        with self._mutex:
            ok = core.is_current(msg) and msg.bucket.commit(msg.index)
            if ok:
                self._stats["committed"] += 1
                if msg.bucket.finished():
                    self._flush_wake.notify()  # its last item: delete it now, not a period later
        if ok and flush:
            with self._runtime.bounded(None, f"commit(flush=True) on queue {self.name!r}"):
                self.flush_state()
            if msg.bucket.lost:
                return False
        return ok

    def commit_many(self, msgs: Any, *, flush: bool = False) -> int:
        msgs = [core.check_message(m, self.origin, "commit_many") for m in v.payloads(msgs, "msgs")]
        v.flag("flush", flush)
        with self._mutex:
            done = [m for m in msgs if core.is_current(m) and m.bucket.commit(m.index)]
            self._stats["committed"] += len(done)
            if any(m.bucket.finished() for m in done):
                self._flush_wake.notify()
        if done and flush:
            with self._runtime.bounded(None, f"commit_many(flush=True) on queue {self.name!r}"):
                self.flush_state()
            return sum(1 for m in done if not m.bucket.lost)
        return len(done)

    def touch(self, msg: core.Message) -> bool:
        core.check_message(msg, self.origin, "touch")
        with self._mutex:
            return core.is_current(msg) and msg.bucket.touch(msg.index, _now())

    def rollback(self, msg: core.Message, delay: Any, next_t: Any, reason: Any) -> bool:
        core.check_message(msg, self.origin, "rollback")
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
                    self.ready.extend(again)
                    self._consumers.notify()
                if b.dying:
                    self._flush_wake.notify()
        return ok

    def _buffered_buckets(self) -> int:
        # Under the mutex: the flusher drops buckets from ``held`` meanwhile (in the sync
        # twin, a thread: iterating unguarded raised "dictionary changed size").
        with self._mutex:
            return sum(1 for b in self.held.values() if b.queued > 0)

    def _fetcher_loop(self) -> None:
        idle_attempt = 0
        while not self._runtime.is_closed():
            gen = self._fetch_wake.gen
            if self.paused or self.draining:
                if self.watcher is not None:
                    self.watcher.done()  # claiming nothing: wake-ups are moot
                self._fetch_wake.wait(gen, None)
                continue
            if self._buffered_buckets() >= 1 + self.options.prefetch:
                # Woken when a bucket is handed out (not at each one otherwise: a claim
                # right after the fetcher found nothing would find nothing again).
                self._fetch_full = True
                try:
                    if self._buffered_buckets() >= 1 + self.options.prefetch:  # seen since?
                        self._fetch_wake.wait(gen, None)
                finally:
                    self._fetch_full = False
                continue
            try:
                got = self._claim()
            except PyMongoError as exc:
                idle_attempt += 1
                log.log(deadlines.failure_level(exc), "queue %s: claim failed (%s); retrying",
                        v.printable(self.name), exc)  # fmt: skip
                self._fetch_wake.wait(
                    gen,
                    backoff(idle_attempt, 0.1, self.options.poll_interval, full_jitter=True) + 0.05,
                )
                continue
            if got:
                idle_attempt = 0
                self._starved = False
                if self.watcher is not None:
                    # Claims succeed, so wake-ups are moot: the stream is left unread.
                    self.watcher.done()
                continue
            self._starved = True
            idle_attempt += 1
            wait = min(0.05 * 2 ** min(idle_attempt, 10), self.options.poll_interval)
            if self._next_local_mature is not None:
                wait = min(wait, max(self._next_local_mature - _now(), 0.0) + 0.01)
                if self._next_local_mature <= _now():
                    self._next_local_mature = None
            if self.watcher is not None:
                self.watcher.want()  # an insert or a release ends the wait
            self._fetch_wake.wait(gen, wait)

    def _claim(self) -> bool:
        """Claim one bucket: True if one was found (or if other consumers took every
        bucket it tried: claim again at once). A partitioned queue claims in its
        rotation's partition (``Rotation``); where that finds nothing, or while idle, it
        claims in another that its map names, and where the map names none, one read
        (``_probe``) looks for a partition with a claimable bucket: a claim that finds
        nothing costs at most one read, not a claim in every partition, and an idle
        consumer one or two reads per poll. Each claim and read gets ``op_timeout``."""
        self._setup()
        rot = self._rotation
        if self._first_claim:
            self._first_claim = False
            if rot is not None:  # in its own partition, known once set up
                rot.start_at(self.origin.partition)
        if rot is None:
            with self._runtime.bounded(self.options.op_timeout):
                return self._claim_in(None) is not False
        start = rot.next
        part: int | None = None if self._starved else rot.next
        raced = False
        for _ in range(rot.partitions):  # a probe's partition can be emptied before our claim
            if part is None:
                part = self._probe(start)
                if part is None:
                    return raced
                rot.start_at(part)
            with self._runtime.bounded(self.options.op_timeout):
                got = self._claim_in(part)
            if got:
                rot.found(part)
                return True
            if self.draining or self._runtime.is_closed():
                return False
            if got is None:
                raced = True  # others claim there: not dry
            else:
                rot.dry(part)
            start = (part + 1) % rot.partitions
            part = rot.pick()
        # Raced out everywhere it tried: the caller claims again at once, not after an
        # idle wait (the partitions are not empty).
        return raced

    def _probe(self, start: int) -> int | None:
        """A partition with a claimable bucket, or None. With ``find_then_update``: one map
        read (``core.map_pipeline``) counting them in every partition, kept in the
        rotation, which picks one (``Rotation.pick``); with ``find_and_modify``,
        ``core.probe_requests``' reads of the first one from ``start`` on, else from 0
        (each walks the claim index on mongod, where a map read would visit every
        claimable bucket)."""
        if self._claim_form is None:
            self._claim_form = _claim_form(self._col.database.client, self.options.claim)
        rot = self._rotation
        assert rot is not None
        if self._claim_form == "find_then_update":
            with self._runtime.bounded(self.options.op_timeout):
                cursor = self._col.aggregate(core.map_pipeline(_now()))
                groups = cursor.to_list()
            rot.mapped(core.mapped_counts(groups))
            return rot.pick()
        found: dict[str, Any] | None = None
        for flt in core.probe_requests(_now(), start):
            with self._runtime.bounded(self.options.op_timeout):
                doc = self._col.find_one(flt, {"part": 1}, sort=core.PROBE_SORT)
            found = doc or found
            if core.probe_done(core.partition_of_document(doc) if doc else None, start):
                break
        return None if found is None else core.partition_of_document(found)

    def _claim_in(self, part: int | None) -> bool | None:
        """Claim a bucket of ``part``: True if one was claimed, False if none was
        claimable, None if other consumers took every one this claim tried
        (``find_then_update`` only: the partition is not dry)."""
        if self._claim_form is None:
            self._claim_form = _claim_form(self._col.database.client, self.options.claim)
        if self._claim_form == "find_then_update":
            claimed = self._find_then_update(part)
            if not isinstance(claimed, tuple):
                return claimed
            doc, token, now = claimed
        else:
            now = _now()
            token = ObjectId()
            flt, upd = core.claim_request(now, token, self.options.owner, self.options.lease, part)
            doc = self._col.find_one_and_update(
                flt, upd, sort=bucket.CLAIM_SORT, return_document=ReturnDocument.BEFORE
            )
            if doc is None:
                return False
        return self._serve_claimed(doc, token, now)

    def _find_then_update(
        self, part: int | None
    ) -> tuple[dict[str, Any], ObjectId, float] | bool | None:
        """Claim a candidate of ``part`` whose conditional update matches (see
        ``core.conditional_claim``; which candidate first: ``core.Candidates``): the
        bucket as before the claim, our token and when the claim was sent; False if a
        find found none; None if other consumers took every candidate it tried.
        Candidates not tried stay for the next claim in ``part``; once they are used up,
        or a race was lost (the list is stale), a fresh find refills them: at most
        ``CLAIM_FINDS`` finds per claim."""
        cands = self._candidates
        left = cands.of(part)
        finds = 0
        while True:
            if not left:
                if finds == core.CLAIM_FINDS:
                    return None
                finds += 1
                skip = cands.skip()
                cands.fill(
                    self._col.find(
                        core.candidate_request(_now(), part),
                        sort=cands.order(),
                        skip=skip,
                        limit=core.CANDIDATES,
                    ).to_list()
                )
                if not left:
                    if skip:  # past the last one: read from the oldest
                        continue
                    return False
            doc = cands.take()
            now = _now()
            token = ObjectId()
            flt, upd = core.conditional_claim(
                doc, token, self.options.owner, now, self.options.lease
            )
            res = self._col.update_one(flt, upd)
            if res.matched_count:
                return doc, token, now
            # 0 matched: claimed, released, renewed or changed since the find.
            cands.lost()

    def _serve_claimed(self, doc: dict[str, Any], token: ObjectId, now: float) -> bool:
        """Hold a bucket just claimed (``doc`` as before the claim, sent at ``now``)."""
        self._stats["claims"] += 1
        # The lease the server wrote runs from ``now``, when the claim was sent, not from
        # when the answer came: a claim slower than the lease holds an expired lease.
        if doc["_id"] in self.held and self._reclaim(doc, token, now):
            return True
        try:
            b = core.HeldBucket(doc, token, now, self.options.lease)
        except DamagedBucket as exc:
            self._set_aside(doc, token, exc)
            return True
        b.origin = self.origin
        if b.takeover:
            self._stats["takeovers"] += 1
        if self.draining or self._runtime.is_closed():
            self.held[b.id] = b
            self.release([b])
            return True
        msgs = self._hold(b, now)
        if b.dying or not msgs:
            self._flush_wake.notify()
        return True

    def _set_aside(self, doc: dict[str, Any], token: ObjectId, exc: DamagedBucket) -> None:
        """Quarantine a damaged bucket we claimed: keep it there first, then delete it
        here (fenced by our claim), so it is never lost and never claimed again."""
        self._quarantine.put(doc, exc.reason, self.options.owner)
        self._col.delete_one({"_id": doc["_id"], "lease.tok": token})
        self._stats["quarantined"] += 1
        log.error(
            "queue %s: bucket %s is damaged (%s); moved it to %s",
            v.printable(self.name),
            doc["_id"],
            exc.reason,
            v.printable(self._quarantine.name),
        )

    def _reclaim(self, doc: dict[str, Any], token: ObjectId, sent: float) -> bool:
        """We claimed a bucket we still hold. Keep our state under the new lease if nobody
        held it in between; else drop what we hold as lost (the caller holds it anew).
        Waits for a flush in flight, so no write with the old token is outstanding."""
        with self._flush_lock:
            with self._mutex:
                old = self.held.get(doc["_id"])
                if old is None:
                    return False
                if old.reclaim(doc, token, sent, self.options.lease):
                    self._stats["reclaims"] += 1
                    log.info(
                        "queue %s: renewed the lapsed lease of bucket %s",
                        v.printable(self.name),
                        old.id,
                    )
                    self._consumers.notify()
                    return True
                self._lose(old)
                return False

    def _lose(self, b: core.HeldBucket) -> None:
        """Another consumer holds ``b`` now: count the loss once and forget it (call with
        the mutex held)."""
        if not b.lost:
            b.lost = True
            self._stats["lease_losses"] += 1
            log.warning(
                "queue %s: lost the lease of bucket %s; dropping it", v.printable(self.name), b.id
            )
        self._drop(b)

    def _drop(self, b: core.HeldBucket) -> None:
        """Forget a bucket this process no longer holds (call with the mutex held)."""
        if self.held.get(b.id) is b:
            del self.held[b.id]
        b.held = False

    # -- state flush ----------------------------------------------------------------------

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
                    list(self.held.values()), now, lease, release_all=release_all
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

    def _dead_letter(self) -> None:
        """Move over-tried items to the dead-letter queue: insert there first (durably),
        then mark them consumed here, so the worst case is a duplicate, never a loss."""
        dying = [
            (b, i, reason) for b in list(self.held.values()) if not b.lost for i, reason in b.dying
        ]
        if not dying:
            return
        if self._dlq is None:
            self._dlq = self._open_dead_letter_queue()
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
                pushed.append((b, i, self._dlq.push(it.get("p"), headers=headers)))
            except BucketQError as exc:
                failed.append((b, i, exc))
        self._dlq._producer.flush()
        moved = []
        for b, i, r in pushed:
            try:
                r.wait()
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
                    v.printable(self.name), bucket.item_id(b.id, i), why,
                )  # fmt: skip
                if b.state[i] == core.RESERVED and not b.lost:
                    b.rollback(i, now + core.retry_delay(b.tries.get(i, 0), self.options), now)
            done = {(b.id, i) for b, i in moved} | {(b.id, i) for b, i, _ in failed}
            for b in {id(b): b for b, _, _ in dying}.values():
                b.dying = [d for d in b.dying if (b.id, d[0]) not in done]

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

    def lease_on_write(self, docs: dict[Any, dict[str, Any]]) -> None:
        """``hold_pushed``: while this queue object consumes, the mature buckets it writes
        are inserted already leased to it (``written`` serves them here), which spares
        a claim per bucket; if this process dies, they come back when the lease runs out.
        Consuming means a reserve() waits now or was served within a third of the lease:
        a queue object that reserved once and then only pushes keeps nothing from others."""
        if not self.options.hold_pushed or self.fetcher is None or self.paused:
            return
        if self.draining or self._runtime.is_closed():
            return
        now = _now()
        if not self._waiters and now - self._last_reserve > self.options.lease / 3:
            return
        for bid, doc in docs.items():
            if bucket.from_datetime(doc["mature"]) <= now:
                token = ObjectId()
                self._leased_on_write[bid] = (dict(doc), token, now)
                _, upd = core.claim_request(now, token, self.options.owner, self.options.lease)
                doc.update(upd["$set"], leases=1)

    def not_written(self, docs: dict[Any, dict[str, Any]]) -> None:
        """Writing these buckets was given up: they are not held here."""
        for k in docs:
            self._leased_on_write.pop(k, None)

    def written(self, buckets: list[bucket.OpenBucket], now: float) -> None:
        """Buckets were just stored: serve those leased on write, claim the others (at
        their mature time, if later)."""
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
        b.origin = self.origin
        self._stats["held_on_write"] += 1
        self._hold(b, sent)

    def _hold(self, b: core.HeldBucket, now: float) -> list[core.Message]:
        """Hold ``b`` here (claimed, or leased on write) and serve its ready items."""
        with self._mutex:
            msgs = b.ready_messages(now, self.options.max_tries)
            b.queued = len(msgs)
            self.held[b.id] = b
            self.ready.extend(msgs)
        if msgs:
            self._consumers.notify()
        return msgs

    def pause(self) -> None:
        self.paused = True
        self._fetch_wake.notify()  # the fetcher sees it now (and its watcher stops reading)

    def resume(self) -> None:
        self.paused = False
        self._fetch_wake.notify()
        self._consumers.notify()

    # -- drain and stop --------------------------------------------------------------------

    def stop_claiming(self) -> None:
        """drain() began: claim nothing more (a claim already under way is released)."""
        self.draining = True
        self._fetch_wake.notify()

    def drain(self, timeout: float) -> tuple[int, int, int]:
        """Release at once the read-ahead nobody started on, serve what is in memory to
        reserve() callers (until consumed or ``timeout`` seconds), release the rest and
        flush state. Returns (items served, buckets released, items released unserved)."""
        with self._mutex:
            read_ahead = [b for b in self.held.values() if b.handed == 0]
            for b in read_ahead:
                b.released = True
                b.queued = 0
            self.ready = deque(m for m in self.ready if not m.bucket.released)
        if read_ahead:
            with self._runtime.bounded(None, f"drain() of queue {self.name!r}"):
                self.release(read_ahead)
        served_before = self._stats["reserved"]
        deadline = _monotonic() + timeout
        while _monotonic() < deadline:
            with self._mutex:
                outstanding = sum(
                    b.outstanding - b.queued for b in self.held.values() if not b.lost
                )
            if not self.ready and not outstanding:
                break
            recent = _now() - self._last_reserve < 0.25
            if not outstanding and not self._waiters and not recent:
                break  # nothing here is consuming: do not sit out the deadline
            self._consumers.notify()
            sleep(0.02)
        with self._mutex:
            left_in_memory = len(self.ready)
            self.ready.clear()
            for b in self.held.values():
                b.queued = 0
        released = len(self.held)
        with self._runtime.bounded(None, f"drain() of queue {self.name!r}"):
            self.flush_state(release_all=True)
        self._consumers.notify()
        served = self._stats["reserved"] - served_before
        return served, released + len(read_ahead), left_in_memory

    def wake_all(self) -> None:
        """The queue closed: wake every worker and waiting reserve() so they see it."""
        for n in (self._fetch_wake, self._flush_wake, self._consumers):
            n.notify()
        if self.watcher is not None:
            self.watcher.stop()

    def join(self) -> None:
        """Wait for the workers to end (each join is bounded: their driver calls are),
        then close the dead-letter queue."""
        for w in (self.fetcher, self.flusher):
            if w is not None:
                w.join(5.0)
        if self.watcher is not None:
            self.watcher.join()  # not waited for: it only wakes the fetcher
        if self._dlq is not None:
            self._dlq.close()
