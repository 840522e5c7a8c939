"""The per-element queue: one document per item, the same API as the bucket queue.

It is the honest baseline every benchmark compares with (keuss ``mongo``,
mongo-taskqueue, kombu): push is one insert, reserve one ``find_one_and_update``,
commit one delete. Leases are not renewed: a consumer must commit or roll back
within ``lease`` seconds or the item is delivered again with ``tries`` + 1.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.errors import BulkWriteError, WriteConcernError

from ... import _validate as v
from ... import bucket
from ..._driver import boundary
from ...bucket import deadline as deadlines
from ...bucket.codec import collection, encode_item
from ...bucket.concurrency import (
    AsyncBatch,
    AsyncNotifier,
    AsyncReceipt,
    async_register_exit,
)
from ...errors import ConfigurationError, PushFailed, QueueClosed
from .. import _core as core
from .api import AsyncQueueApi

log = logging.getLogger("bucketq.queue")

_now = time.time
_monotonic = time.monotonic


_STORED = AsyncBatch()
_STORED.resolve()


def _stored(doc_id: ObjectId) -> AsyncReceipt:
    """A receipt for an item already stored (ids look like the bucket queue's: '<id>.0')."""
    return AsyncReceipt(core.ElementRef(doc_id, batch=_STORED), 0)


class AsyncElementQueue(AsyncQueueApi):
    """One MongoDB document per item. ``db`` is a pymongo ``AsyncDatabase``."""

    def __init__(self, db: Any, name: str, **options: Any) -> None:
        super().__init__(db, name, options)
        opts, name = self.options, self.name
        if opts.partitions != 1:
            raise ConfigurationError(
                f"partitions={opts.partitions}: the per-element queue has no partitions "
                "(it is the baseline of one document per item). Use Queue(db, name, "
                "partitions=K)."
            )
        self._dlq_col = collection(db, opts.dead_letter_name(name), self._col.write_concern)
        self._wake = AsyncNotifier()
        self._waiting = 0  # reserve() calls blocked for items
        self._paused = False
        async_register_exit(self)
        self._health = deadlines.Health(f"queue {name}")

    def health(self) -> dict[str, Any]:
        """Whether MongoDB answers this queue's operations (no query); as
        :meth:`AsyncQueue.health`."""
        return self._health.report(_now())

    def _bounded(self, what: str, seconds: float | None = None) -> Any:
        """The block's driver calls get ``seconds`` (default ``op_timeout``); a timeout
        is raised as OperationTimeout naming ``what``."""
        seconds = self.options.op_timeout if seconds is None else seconds
        return deadlines.bounded(seconds, self._health, f"{what} on queue {self.name!r}")

    async def _setup(self) -> None:
        """The claim index, once per collection and process, never alongside other
        start-up work."""
        if not self._setup_done:
            await self._once("mature_id", self.options.op_timeout, self._create_claim_index)
            self._setup_done = True

    async def _create_claim_index(self) -> None:
        try:
            await self._col.create_index(bucket.CLAIM_SORT, name="mature_id")
        except WriteConcernError as exc:  # built; the write concern was not confirmed
            log.warning("queue %s: claim index: %s", v.printable(self.name), exc)

    def _push_timeout(self) -> float:
        return max(self.options.retry_budget, deadlines.MIN_ATTEMPT_TIMEOUT)

    def _check_open(self) -> None:
        self._check_not_forked()
        if self._closed:
            raise QueueClosed(f"Queue {self.name!r} is closed; open a new one to go on.")

    def _partition_for(self, key: Any) -> int:
        v.partition_key(key)
        return 0  # one partition, as a bucket queue with partitions=1

    @boundary("push()")
    async def _push(
        self, payload: Any, headers: Any, at: float, now: float, part: int, durable: bool
    ) -> AsyncReceipt:
        """Insert one item; it is stored when this returns (``durable`` is implied)."""
        self._packer_check(encode_item(payload, headers))
        doc = core.element_document(payload, headers, at)
        with self._bounded("push()", self._push_timeout()):
            await self._setup()
            await self._insert([doc])
        self._stats["pushed"] += 1
        self._stats["buckets_written"] += 1
        self._wake.notify()
        return _stored(doc["_id"])

    async def _insert(self, docs: list[dict[str, Any]]) -> None:
        """Insert the items' documents; say exactly what happened when it fails: stored
        with the write concern unconfirmed, or how many were stored."""
        try:
            if len(docs) == 1:
                await self._col.insert_one(docs[0])
            else:
                await self._col.insert_many(docs)
        except (BulkWriteError, WriteConcernError) as exc:
            out = bucket.insert_outcome(exc, [d["_id"] for d in docs])
            if out is not None and out.unconfirmed and not out.taken and not out.failed:
                self._stats["write_concern_unconfirmed"] += len(docs)
                raise bucket.write_concern_unconfirmed("queue", self.name, exc) from exc
            if not isinstance(exc, BulkWriteError):
                raise
            n = int(exc.details.get("nInserted", 0))
            self._stats["push_failed"] += len(docs) - n
            raise PushFailed(
                f"Only the first {n} of {len(docs)} items were stored in queue {self.name!r} "
                f"(ids {', '.join(str(d['_id']) + '.0' for d in docs[:n]) or 'none'}); the "
                f"others were NOT stored: {exc}"
            ) from exc

    def _packer_check(self, item: bytes) -> None:
        if len(item) > self.options.bucket_max_bytes - bucket.BUCKET_OVERHEAD:
            bucket.Packer(self.options, AsyncBatch).check_size(len(item))

    @boundary("push_many()")
    async def _push_many(
        self, payloads: list[Any], headers: Any, at: float | None, durable: bool, part: int
    ) -> list[AsyncReceipt]:
        """Insert several items with one insert_many; one bad item stores none of them."""
        for p in payloads:
            self._packer_check(encode_item(p, headers))
        at = _now() if at is None else at
        docs = [core.element_document(p, headers, at) for p in payloads]
        if docs:
            with self._bounded("push_many()", self._push_timeout()):
                await self._setup()
                await self._insert(docs)
            self._stats["pushed"] += len(docs)
            self._stats["buckets_written"] += len(docs)
            self._wake.notify()
        return [_stored(d["_id"]) for d in docs]

    @boundary("flush()")
    async def flush(self) -> None:
        """Nothing is buffered: every push is already stored."""
        self._check_not_forked()

    @boundary("reserve()")
    async def reserve(self, timeout: float | None = None) -> core.Message | None:
        """Claim the next mature item, or None after ``timeout`` seconds."""
        self._check_open()
        v.timeout("timeout", timeout)
        if not self._setup_done:
            with self._bounded("reserve()"):
                await self._setup()
        deadline = None if timeout is None else _monotonic() + timeout
        attempt = 0
        while True:
            gen = self._wake.gen
            if not self._paused:
                bound = deadlines.call_timeout(self.options.op_timeout, deadline, _monotonic())
                with self._bounded("reserve()", bound):
                    msg = await self._claim()
                if msg is not None:
                    return msg
            if self._closed:
                return None
            wait = deadlines.wait_within(
                min(0.01 * 2**attempt, self.options.poll_interval), deadline, _monotonic()
            )
            if wait is None:
                return None
            attempt += 1
            self._waiting += 1
            try:
                await self._wake.wait(gen, wait)
            finally:
                self._waiting -= 1

    @boundary("reserve_many()")
    async def reserve_many(
        self, max_items: int, timeout: float | None = None
    ) -> list[core.Message]:
        """Up to ``max_items`` items: waits (up to ``timeout``) for the first, then claims
        what else is ready, one claim per item."""
        bucket.check_max_items(max_items)
        first = await self.reserve(timeout)
        out = [] if first is None else [first]
        while out and len(out) < max_items and not self._paused:
            with self._bounded("reserve_many()"):
                msg = await self._claim()
            if msg is None:
                break
            out.append(msg)
        return out

    async def _claim(self) -> core.Message | None:
        now = _now()
        token = ObjectId()
        flt, upd = core.claim_request(now, token, self.options.owner, self.options.lease)
        del upd["$inc"]
        doc = await self._col.find_one_and_update(
            flt, upd, sort=bucket.CLAIM_SORT, return_document=ReturnDocument.BEFORE
        )
        if doc is None:
            return None
        tries = doc.get("tries", 0)
        if doc.get("lease") is not None:  # its previous holder's lease ran out
            tries += 1
            self._stats["takeovers"] += 1
            await self._col.update_one(
                {"_id": doc["_id"], "lease.tok": token}, {"$set": {"tries": tries}}
            )
        self._stats["reserved"] += 1
        msg = core.Message(
            core.ElementRef(doc["_id"], token, origin=self),
            0,
            doc.get("p"),
            doc.get("h"),
            tries,
            bucket.from_datetime(doc["mature"]),
        )
        why = core.over_tried(tries, self.options.max_tries)
        if why is not None:
            await self._dead_letter(msg, why)
            return await self._claim()
        return msg

    @boundary("commit()")
    async def commit(self, msg: core.Message, *, flush: bool = False) -> bool:
        """Delete the item (fenced by the claim's token). False if it was rolled back
        already or its lease ran out (it is, or will be, delivered again)."""
        self._check_not_forked()
        core.check_message(msg, self, "commit")
        v.flag("flush", flush)
        ref = msg.bucket
        with self._bounded("commit()"):
            res = await self._col.delete_one({"_id": ref.id, "lease.tok": ref.token})
        if res.deleted_count:
            self._stats["committed"] += 1
            return True
        self._stats["lease_losses"] += 1
        return False

    @boundary("commit_many()")
    async def commit_many(self, msgs: Any, *, flush: bool = False) -> int:
        """Commit several items (one fenced delete each); returns how many were committed."""
        self._check_not_forked()
        msgs = [core.check_message(m, self, "commit_many") for m in v.payloads(msgs, "msgs")]
        n = 0
        for m in msgs:
            n += await self.commit(m)
        return n

    @boundary("rollback()")
    async def _rollback(self, msg: core.Message, delay: Any, next_t: Any, reason: Any) -> bool:
        """Release the item; past ``max_tries`` it moves to the dead-letter collection."""
        core.check_message(msg, self, "rollback")
        v.text("reason", reason, optional=True)
        now = _now()
        tries = msg.tries + 1
        not_before = core.rollback_time(now, delay, next_t, tries, self.options)
        why = core.over_tried(tries, self.options.max_tries, rolled_back=True)
        if why is not None:
            msg.tries = tries
            with self._bounded("rollback()"):
                return await self._dead_letter(msg, reason or why)
        ref = msg.bucket
        with self._bounded("rollback()"):
            res = await self._col.update_one(
                {"_id": ref.id, "lease.tok": ref.token}, core.element_rollback_update(not_before)
            )
        if res.matched_count:
            self._stats["rolled_back"] += 1
            self._wake.notify()
            return True
        self._stats["lease_losses"] += 1
        return False

    async def _dead_letter(self, msg: core.Message, reason: str) -> bool:
        ref = msg.bucket
        headers = core.dead_letter_headers(self.name, msg.headers, msg.tries, reason, _now())
        dead = core.element_document(msg.payload, headers, _now())
        dead["_id"] = ref.id  # the same id: a repeated move is a duplicate-key no-op
        try:
            await self._dlq_col.insert_one(dead)
        except Exception as exc:
            from pymongo.errors import DuplicateKeyError

            if not isinstance(exc, DuplicateKeyError):
                raise
        res = await self._col.delete_one({"_id": ref.id, "lease.tok": ref.token})
        self._stats["dead_lettered"] += 1
        return bool(res.deleted_count)

    @boundary("drain()")
    async def drain(self, timeout: float | None = None) -> dict[str, int]:
        """Nothing is buffered or read ahead: stop handing out items."""
        self._closed = True
        self._wake.notify()
        return dict.fromkeys(core.DRAIN_REPORT, 0)

    @boundary("close()")
    async def close(self) -> dict[str, int]:
        return await self.drain()

    def pause(self, release: bool = False) -> None:
        """As :meth:`AsyncQueue.pause`; nothing is read ahead, so ``release`` has nothing
        to give back."""
        v.flag("release", release)
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._wake.notify()

    async def _count(self, flt: dict[str, Any]) -> int:
        with self._read_bounded("counting items"):
            return await self._col.count_documents(flt)

    def _read_bounded(self, what: str) -> Any:
        return self._bounded(what)

    def stats(self) -> dict[str, int]:
        return {**self._stats, "waiting_reserves": self._waiting}

    @boundary("remove()")
    async def remove(self, id: str) -> bool:
        oid, index = bucket.parse_item_id(id)
        if index != 0:
            return False  # one item per document: its id ends in ".0"
        now = bucket.to_datetime(_now())
        with self._bounded("remove()"):
            res = await self._col.delete_one({"_id": oid, **bucket.not_leased(now)})
        return bool(res.deleted_count)
