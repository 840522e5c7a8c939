# GENERATED from bucketq/queue/_async/claiming.py by scripts/unasync.py. Do not edit;
# edit the async file and run `python scripts/unasync.py`.
"""The consumer's claims: the fetcher claims buckets (woken by the change-stream
watcher, ``wake.py``, or by polling) and holds them, as it holds the buckets this queue
object inserted leased to itself (``hold_pushed``).

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.errors import OperationFailure, PyMongoError

from ... import _validate as v
from ... import bucket
from ..._guard import backoff
from ...bucket import deadline as deadlines
from ...errors import DamagedBucket
from .. import _core as core
from .state_flush import StateFlush

log = logging.getLogger("bucketq.queue")

_now = time.time

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


class Claiming(StateFlush):
    """Claims buckets and holds them (the fetcher), or holds those pushed here."""

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
            self._turn_in = 0  # the consumer lets this claim send its request now
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

    def hold_pushed(self, docs: dict[Any, dict[str, Any]]) -> None:
        """The ``hold_pushed`` option: while this queue object consumes, the mature
        buckets it writes are inserted already leased to it (``written`` serves them
        here), which spares a claim per bucket; if this process dies, they come back when the lease runs out.
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
                self._held_pushed[bid] = (dict(doc), token, now)
                _, upd = core.claim_request(now, token, self.options.owner, self.options.lease)
                doc.update(upd["$set"], leases=1)

    def not_written(self, docs: dict[Any, dict[str, Any]]) -> None:
        """Writing these buckets was given up: they are not held here."""
        for k in docs:
            self._held_pushed.pop(k, None)

    def written(self, buckets: list[bucket.OpenBucket], now: float) -> None:
        """Buckets were just stored: serve those held pushed, claim the others (at
        their mature time, if later)."""
        claim = False
        for ob in buckets:
            held = self._held_pushed.pop(ob.id, None)
            if held is not None:
                self._serve_held_pushed(*held)
                continue
            claim = True
            if ob.mature > now and (
                self._next_local_mature is None or ob.mature < self._next_local_mature
            ):
                self._next_local_mature = ob.mature
        if claim:
            self._fetch_wake.notify()

    def _serve_held_pushed(self, doc: dict[str, Any], token: ObjectId, sent: float) -> None:
        """Serve a bucket this queue inserted leased to itself, as if it had claimed it."""
        b = core.HeldBucket(doc, token, sent, self.options.lease)
        b.origin = self.origin
        self._stats["held_on_write"] += 1
        self._hold(b, sent)
