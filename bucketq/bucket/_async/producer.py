"""The push side of the bucket queue and the stream queue (pymongo ``AsyncMongoClient``):
a component each of them composes, as the bucket queue composes its consumer.

Encoded items are packed into open buckets (``packing.Packer``); sealed buckets are
written by one writer worker through the owner's ``write``; receipts resolve only
after that, and ``max_pending_bytes`` bounds what waits in memory.

The async file is the source; ``scripts/unasync.py`` generates the sync twin from it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pymongo.errors import PyMongoError

from ... import _validate as v
from ..._guard import backoff
from ...errors import OperationFailed, QueueFull
from .. import deadline as deadlines
from .. import document, options, packing, writes
from ..codec import encode_item
from ..concurrency import (
    AsyncBatch,
    AsyncMutex,
    AsyncNotifier,
    AsyncReceipt,
    AsyncWorker,
    async_sleep,
)
from .runtime import AsyncRuntime

log = logging.getLogger("bucketq.queue")

_now = time.time


class AsyncProducer:
    """What one queue object buffers and writes: open buckets, the writer, and the
    budget of every bucket insert.

    The owner hands it what it needs: its ``runtime`` (its name and kind for messages,
    its counters, whether it is closed, bounded driver calls, guarded background loops),
    the push ``options``, the ``mutex`` it shares with the owner's other parts,
    ``write(buckets)`` (store sealed buckets; returns the ids NOT stored and why) and
    ``written(buckets, now)`` (called with the buckets just stored, before their items
    are freed).
    """

    def __init__(
        self,
        runtime: AsyncRuntime,
        options: options.QueueOptions,
        *,
        mutex: AsyncMutex,
        write: Callable[[list[packing.OpenBucket]], Any],
        written: Callable[[list[packing.OpenBucket], float], None] | None = None,
    ) -> None:
        self.name = runtime.name
        self._kind = runtime.kind
        self._opts = options
        self._mutex = mutex
        self._stats = runtime.stats
        self._write = write
        self._written = written
        self._is_closed = runtime.is_closed
        self._bounded = runtime.bounded
        self._worker = runtime.worker
        self._packer = packing.Packer(options, AsyncBatch)
        self._to_write: deque[packing.OpenBucket] = deque()
        self._unwritten: dict[Any, packing.OpenBucket] = {}
        self.pending_bytes = 0
        self._writer_wake = AsyncNotifier()
        self._space = AsyncNotifier()
        self._writer: AsyncWorker | None = None
        #: Says once that the server stopped answering the inserts (a retry of an unanswered
        #: insert is logged at debug level), and once when it answers again.
        self._health = deadlines.Health(f"{self._kind} {v.printable(self.name)}: bucket inserts")
        #: The owner's own id; its pushes without a ``key`` go to its partition, so one
        #: producer's items keep their order within it: the hash of its id until the
        #: owner sets its member number's (``document.member_request``), before its
        #: first write.
        self.producer_id = document.member_id(options.owner)
        self.partition = document.partition_of(self.producer_id, options.partitions)

    @property
    def open_buckets(self) -> int:
        return len(self._packer.open)

    def holds(self, bucket_id: Any) -> bool:
        """Is the bucket ``bucket_id`` still buffered here (not yet stored)?"""
        return bucket_id in self._unwritten

    # -- adding -------------------------------------------------------------------------

    def partition_for(self, key: Any) -> int:
        """The partition of a push: the producer's own (``OWN_PARTITION`` while there are
        several: ``place`` names it at write time), or that of ``key``."""
        if key is None:
            return document.OWN_PARTITION if self._opts.partitions > 1 else self.partition
        return document.partition_of(v.partition_key(key), self._opts.partitions)

    def place(self, buckets: list[packing.OpenBucket]) -> None:
        """Put buckets of pushes without a key in the producer's own partition (before
        their documents are built)."""
        for ob in buckets:
            if ob.part == document.OWN_PARTITION:
                ob.part = self.partition

    async def push(
        self, item: bytes, at: float, now: float, part: int, durable: bool
    ) -> AsyncReceipt:
        """Buffer one encoded item into partition ``part`` (waiting for room first, as
        ``pending_policy`` says) and return its receipt (``durable``: once stored)."""
        if self.pending_bytes + len(item) > self._opts.max_pending_bytes:
            await self._wait_for_space(len(item))
        receipt = self.add(item, at, now, part)
        if durable:
            await self._wait_stored([receipt])
        return receipt

    async def add_many(
        self,
        payloads: Any,
        headers: dict[str, Any] | None,
        at: float | None,
        durable: bool,
        part: int = 0,
    ) -> list[AsyncReceipt]:
        """Encode every payload first (one bad item stores none), then pack them in runs
        (into partition ``part``); ``at`` is their mature time (None: now)."""
        items = [encode_item(p, headers) for p in payloads]
        sizes = [len(it) for it in items]
        for size in sizes:
            self._packer.check_size(size)
        now = _now()
        at = now if at is None else at
        total = sum(sizes)
        if self.pending_bytes + total > self._opts.max_pending_bytes:
            # Over the limit: one at a time, each waiting for space as push() does.
            receipts = []
            for item in items:
                if self.pending_bytes + len(item) > self._opts.max_pending_bytes:
                    await self._wait_for_space(len(item))
                receipts.append(self.add(item, at, now, part))
        else:
            with self._mutex:
                runs, sealed = self._packer.add_many(items, sizes, at, now, part)
                self.pending_bytes += total
                self._stats["pushed"] += len(items)
                self._to_write.extend(sealed)
            opened = [ob for ob, first, _ in runs if first == 0]
            for ob in opened:
                self._unwritten[ob.id] = ob
            if sealed or opened:
                self._wake_writer()
            receipts = [
                AsyncReceipt(ob, k)
                for ob, first, count in runs
                for k in range(first, first + count)
            ]
        if durable:
            await self._wait_stored(receipts)
        return receipts

    async def _wait_stored(self, receipts: list[AsyncReceipt]) -> None:
        """``durable=True``: have the writer take the receipts' buckets at its next turn
        (not at ``bucket_max_wait``), then wait until they are stored."""
        with self._mutex:
            for r in receipts:
                r._bucket.urgent = True
        self._wake_writer()
        for r in receipts:
            await r.wait()

    def add(self, item: bytes, at: float, now: float, part: int = 0) -> AsyncReceipt:
        """Pack one encoded item into partition ``part`` (the hot path of ``push``: no
        await, so no coroutine). The caller made room first: see ``_wait_for_space``."""
        with self._mutex:
            ob, index, sealed = self._packer.add(item, at, now, part)
            self.pending_bytes += len(item)
            self._stats["pushed"] += 1
            if sealed:
                self._to_write.extend(sealed)
        if index == 0 or sealed:
            self._unwritten[ob.id] = ob
            self._wake_writer()
        return AsyncReceipt(ob, index)

    async def _wait_for_space(self, nbytes: int) -> None:
        """Block (or raise, by ``pending_policy``) until ``nbytes`` more fit under
        ``max_pending_bytes``; an item that can never fit in a bucket raises at once."""
        self._packer.check_size(nbytes)
        opts = self._opts
        if opts.pending_policy == "raise":
            raise QueueFull(
                f"{self._kind.capitalize()} {self.name!r} has {self.pending_bytes} bytes of pushes waiting "
                f"to be written (max_pending_bytes={opts.max_pending_bytes}). Retry later, call flush(), "
                'or open it with pending_policy="block".'
            )
        while self.pending_bytes + nbytes > opts.max_pending_bytes and self.pending_bytes > 0:
            gen = self._space.gen
            # Seal what is open so the writer can free space.
            with self._mutex:
                self._to_write.extend(self._packer.take_all())
            self._wake_writer()
            await self._space.wait(gen, 1.0)

    # -- writing ------------------------------------------------------------------------

    def _wake_writer(self) -> None:
        if self._writer is None:
            # It ends only once closed with nothing left to write.
            self._writer = self._worker(
                "writer", self._writer_loop, lambda: self._is_closed() and not self._unwritten
            )
        self._writer_wake.notify()

    async def _writer_loop(self) -> None:
        while True:
            gen = self._writer_wake.gen
            with self._mutex:
                self._to_write.extend(self._packer.take_due(_now()))
                batch = list(self._to_write)
                self._to_write.clear()
                next_due = self._packer.next_due()
            if batch:
                try:
                    failed, error = await self._write(batch)
                except Exception as exc:  # noqa: BLE001 - never leave receipts hanging (the guard logs it)
                    if self._writer is not None and self._writer.guard is not None:
                        self._writer.guard.failed(exc)
                    failed, error = {ob.id for ob in batch}, exc
                self._settle(batch, failed, error)
                continue
            if self._is_closed() and next_due is None:
                return
            await self._writer_wake.wait(gen, None if next_due is None else next_due - _now())

    def _settle(
        self, buckets: list[packing.OpenBucket], failed: set[Any], error: BaseException | None
    ) -> None:
        """Resolve the receipts of written (or given-up) buckets and free their memory."""
        stored = []
        for ob in buckets:
            self.pending_bytes -= ob.nbytes
            self._unwritten.pop(ob.id, None)
            if ob.id in failed:
                why = ob.error or error
                self._stats["push_failed"] += len(ob)
                log.error(
                    "%s %s: %d items were NOT stored: %s",
                    self._kind,
                    v.printable(self.name),
                    len(ob),
                    why,
                )
                ob.batch.resolve(why)
            elif ob.error is not None:  # stored, but the write concern was not confirmed
                self._stats["buckets_written"] += 1
                self._stats["write_concern_unconfirmed"] = self._stats.get(
                    "write_concern_unconfirmed", 0
                ) + len(ob)
                log.error(
                    "%s %s: %d items were stored but the write concern was not confirmed: %s",
                    self._kind, v.printable(self.name), len(ob), ob.error,
                )  # fmt: skip
                ob.batch.resolve(ob.error)
                stored.append(ob)
            else:
                self._stats["buckets_written"] += 1
                ob.batch.resolve()
                stored.append(ob)
        if self._written is not None:
            self._written(stored, _now())
        for ob in buckets:
            ob.items = []  # receipts keep the bucket; free its items
        self._space.notify()

    def write_deadline(self, buckets: list[packing.OpenBucket]) -> float:
        """When writing ``buckets`` gives up (epoch seconds): see ``_deadline.write_deadline``."""
        opts = self._opts
        return deadlines.write_deadline(
            (ob.opened for ob in buckets), opts.bucket_max_wait, opts.retry_budget
        )

    def _attempt(self, deadline: float) -> Any:
        """One write attempt, bounded by what is left of its budget."""
        return self._bounded(deadlines.attempt_timeout(deadline, _now()))

    async def insert_buckets(
        self,
        col: Any,
        buckets: list[packing.OpenBucket],
        deadline: float,
        documents: Callable[[list[packing.OpenBucket]], Any],
        taken_by_others: Callable[[dict[Any, packing.OpenBucket]], Any] | None = None,
    ) -> tuple[set[Any], BaseException | None]:
        """Insert sealed buckets, trying again until ``deadline``: the one insert-with-retry
        loop of every bucket write (bucket queue and stream alike). Returns the ids of the
        buckets NOT stored and the error that stopped them (all stored: an empty set, None).

        Each attempt is bounded by what is left of the budget: ``documents(todo)`` gives
        the documents of the buckets still to store (one a bucket, in order; the owner's
        own work before an insert goes there: a stream sets up and takes its numbers),
        inserted in one command. A failed insert is read with ``writes.insert_outcome``:
        buckets stored while the write concern was not confirmed get that receipt error;
        an ``_id`` found taken is an earlier attempt of ours that landed, unless
        ``taken_by_others`` (the taken ``_id``s and their buckets, in an attempt of its
        own) returns it as another's (a stream's number closed as a hole): that bucket's
        owner gives it a new ``_id`` and it is tried again at once. What failed otherwise,
        or any error before the insert answered, is tried again after a back-off while the
        error is transient or unanswered and budget is left (``_retry_insert``); any other
        error (an ``OperationFailed`` of ``documents``, a write error) gives up at once."""
        todo = list(buckets)
        attempt = 0
        while todo:
            docs: list[dict[str, Any]] = []
            try:
                with self._attempt(deadline):
                    docs = await documents(todo)
                    await self._insert(col, docs)
                self._health.answered(_now())
                return set(), None
            except (PyMongoError, deadlines.StartupBusy, OperationFailed) as exc:
                error: BaseException = exc
            ids = [d["_id"] for d in docs]
            out = writes.insert_outcome(error, ids) if docs else None
            if out is None:  # nothing is known of what was stored: try it all again
                attempt += 1
                if not await self._retry_insert(error, deadline, attempt):
                    return {ob.id for ob in todo}, error
                continue
            by_id = dict(zip(ids, todo, strict=True))
            self._unconfirmed(by_id, out.failed | set(out.taken), out.unconfirmed, error)
            lost: list[Any] = []
            if out.taken and taken_by_others is not None:
                try:
                    with self._attempt(deadline):
                        lost = await taken_by_others({i: by_id[i] for i in out.taken})
                except PyMongoError as exc:
                    attempt += 1
                    if not await self._retry_insert(exc, deadline, attempt):
                        return {ob.id for ob in todo}, exc
                    continue
            self._unconfirmed({i: by_id[i] for i in out.taken}, set(lost), out.unconfirmed, error)
            again = out.failed | set(lost)
            todo = [by_id[i] for i in ids if i in again]
            if out.failed:
                attempt += 1
                if not await self._retry_insert(error, deadline, attempt):
                    return {ob.id for ob in todo}, error
        return set(), None

    def _unconfirmed(
        self,
        by_id: dict[Any, packing.OpenBucket],
        not_stored: set[Any],
        unconfirmed: bool,
        exc: BaseException,
    ) -> None:
        """The buckets of ``by_id`` stored (not in ``not_stored``) by a write whose write
        concern was not confirmed: their receipts get ``write_concern_unconfirmed``."""
        if unconfirmed:
            for i, ob in by_id.items():
                if i not in not_stored:
                    ob.error = writes.write_concern_unconfirmed(self._kind, self.name, exc)

    def _retry_ok(self, exc: BaseException, deadline: float) -> bool:
        """May a failed write be tried again (transient or unanswered, budget left)?"""
        return (writes.is_transient(exc) or deadlines.is_unanswered(exc)) and deadlines.may_retry(
            deadline, _now()
        )

    async def _backoff(self, attempt: int, deadline: float) -> None:
        delay = backoff(attempt, self._opts.retry_base, self._opts.retry_cap, full_jitter=True)
        await async_sleep(deadlines.backoff_within(delay, deadline, _now()))

    async def _insert(self, col: Any, docs: list[dict[str, Any]]) -> None:
        """Insert sealed buckets' documents in one command: ``insert_one`` for one, else an
        unordered ``insert_many`` (each lands or fails alone); a failure is read with
        ``writes.insert_outcome``."""
        if len(docs) == 1:
            await col.insert_one(docs[0])
        else:
            await col.insert_many(docs, ordered=False)

    async def _retry_insert(self, exc: BaseException, deadline: float, attempt: int) -> bool:
        """The retry step of every bucket insert (bucket queue and stream alike): False
        when ``exc`` is neither transient nor unanswered, or the budget is spent;
        otherwise count it (``stats()["insert_retries"]``), log it, back off, and True."""
        if not self._retry_ok(exc, deadline):
            return False
        self._stats["insert_retries"] += 1
        if deadlines.is_unanswered(exc):
            self._health.failed(exc, _now())
        log.log(deadlines.failure_level(exc), "%s %s: bucket insert failed (%s); retry %d",
                self._kind, v.printable(self.name), exc, attempt)  # fmt: skip
        await self._backoff(attempt, deadline)
        return True

    async def flush(self) -> None:
        """Write every open bucket and wait until each is stored (or failed)."""
        with self._mutex:
            self._to_write.extend(self._packer.take_all())
            waiting = list(self._unwritten.values())
        if waiting:
            self._wake_writer()
        for ob in waiting:
            try:
                await ob.batch.wait()
            except Exception:  # noqa: BLE001 - the receipts carry the error
                pass

    async def stop(self) -> None:
        """Once the owner is closed: let the writer finish what it holds, and end."""
        self._writer_wake.notify()
        if self._writer is not None:
            await self._writer.join(5.0)
