"""The ``bucketq`` transport: one bucketq queue per shard, on MongoDB.

``enqueue`` returns once the records are durable: it pushes them durably and waits for
their bucket's insert. Group commit adapts to the rate (``CommitSlots``): an ingest that
finds its shard queue idle is written at once; while it is busy, ingests share slots
``commit_window`` (10 ms) apart, one bucket insert each. The consumer of the same
process serves that bucket without claiming it (``hold_pushed``). A flush consumer
reserves items; an ack commits them (and flushes the queue state, so a crash redelivers
as little as possible). A requeue pushes the updated envelope with a delay, durably, and
only then commits the old one; a dead-letter pushes to the DLQ queue ``<prefix>:dlq``
durably, then commits. Either way the worst case of a crash is a duplicate, never a
loss. Buckets whose consumer died are claimed again when their lease runs out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from .. import _validate as v
from ..errors import (
    BucketQError,
    OperationTimeout,
    PushFailed,
    QueueClosed,
    ServerUnavailable,
    TransportError,
    TransportTimeout,
    TransportUnavailable,
)
from ..queue import AsyncQueue
from ._config import DEFAULT_STREAM_PREFIX
from ._policy import dead_entry, replayed_entry
from ._transport import Delivery, Transport

log = logging.getLogger("bucketq.reservoir.bucketq")

T = TypeVar("T")

#: Seconds between a busy shard queue's inserts (see ``CommitSlots``;
#: ``RESERVOIR_BUFFER_BUCKETQ_COMMIT_WINDOW_MS``): short enough to stay a small part of
#: an answer's latency, long enough that a busy queue's ingests share inserts and the
#: server keeps up at rates where an insert per ingest would overwhelm it.
DEFAULT_COMMIT_WINDOW = 0.01

#: Queue options of the shard queues unless given: fine mature slots (retry delays of
#: 100 ms stay short); the lease is the queue's 30 s unless given (``RESERVOIR_BUFFER_BUCKETQ_LEASE_MS``
#: gives it through the factory). No change streams: every process that pushes to a shard also consumes it, and its own
#: inserts wake its consumer in-process, so a watcher per shard queue only added reads
#: (its getMores would be most of the mode's MongoDB commands). What other processes
#: leave behind (their buckets whose lease ran out, their delayed retries) is found by
#: polling every ``poll_interval``.
#: ``hold_pushed``: a shard queue holds the buckets it writes (inserted leased to it), so
#: its consumer claims none of them: one command per bucket fewer.
DEFAULT_QUEUE_OPTIONS: dict[str, Any] = {
    "mature_granularity": 0.1,
    "poll_interval": 5.0,
    "change_streams": False,
    "hold_pushed": True,
}


def _translate(exc: BucketQError, what: str) -> TransportError:
    """The transport error for a queue's error (the queue already translated the
    driver's): the server away or the queue closed is "unavailable", a timeout a
    timeout, anything else (a refused operation, an item that cannot be stored) a plain
    transport error. Anything that is not a bucketq error is a bug and is not caught."""
    if isinstance(exc, OperationTimeout):
        return TransportTimeout(f"MongoDB timed out {what}: {exc}")
    if isinstance(exc, ServerUnavailable | PushFailed | QueueClosed):
        return TransportUnavailable(f"The bucketq transport is unavailable {what}: {exc}")
    return TransportError(f"The bucketq transport failed {what}: {exc}")


async def _call(what: str, aw: Awaitable[T]) -> T:
    try:
        return await aw
    except BucketQError as exc:
        raise _translate(exc, what) from exc


class CommitSlots:
    """When each shard queue's next ingest is written (adaptive group commit).

    An ingest that finds the shard queue idle (no other of its ingests pending, waiting
    for a slot or an insert, and the last slot at least half a window ago) is written at
    once: its latency is one insert. Otherwise it joins a slot: ``window`` after the last
    one, or at once if that is past; every ingest until then joins the same slot, so they
    share one bucket insert (one written while an insert is in flight waits for it: the
    queue writes one at a time). So a busy shard queue makes about one insert per
    ``window`` (the MongoDB commands, and the server's work, stay bounded as the rate
    grows), no ingest waits for a slot longer than ``window``, and at low rates nothing
    waits: one insert per request there, where a fixed window would share more inserts
    but put the window under every answer. ``begin``/``end`` bracket each ingest."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._last: dict[int, float] = {}
        self._pending: dict[int, int] = {}

    def begin(self, shard: int, now: float) -> float:
        """An ingest of ``shard`` arrived at ``now``: the seconds until its slot."""
        busy = self._pending.get(shard, 0)
        self._pending[shard] = busy + 1
        last = self._last.get(shard)
        # Idle (half a window since the last slot, nothing pending), or a busy queue's slot is due.
        if last is None or now >= last + (self.window if busy else self.window / 2):
            self._last[shard] = now
            return 0.0
        if last <= now:  # the last slot has begun: the next one
            last = self._last[shard] = last + self.window
        return last - now

    def end(self, shard: int) -> None:
        """The ingest returned (written, or failed)."""
        self._pending[shard] -= 1


class BucketqTransport(Transport):
    """Shard queues ``<prefix>:<shard>`` and the DLQ queue ``<prefix>:dlq`` in ``db``
    (a pymongo ``AsyncDatabase``; its client stays yours). ``queue_options`` go to every
    :class:`~bucketq.AsyncQueue` (e.g. ``lease``: how soon a dead consumer's records
    are delivered again)."""

    name = "bucketq"
    durable = True

    def __init__(
        self,
        db: Any,
        *,
        prefix: str = DEFAULT_STREAM_PREFIX,
        queue_options: dict[str, Any] | None = None,
        commit_window: float = DEFAULT_COMMIT_WINDOW,
    ) -> None:
        self.commit_window = v.number("commit_window", commit_window, lo=0.0, hi=1.0)
        self.db = db
        self.prefix = v.collection_name("prefix", prefix)
        self.queue_options = {**DEFAULT_QUEUE_OPTIONS, **(queue_options or {})}
        self.slots = CommitSlots(self.commit_window)
        self.queues: dict[int, AsyncQueue] = {}
        self._dlq: AsyncQueue | None = None

    def queue_name(self, shard: int) -> str:
        return f"{self.prefix}:{shard}"

    @property
    def dlq_name(self) -> str:
        return f"{self.prefix}:dlq"

    def _queue(self, shard: int) -> AsyncQueue:
        q = self.queues.get(shard)
        if q is None:
            q = self.queues[shard] = AsyncQueue(
                self.db, self.queue_name(shard), **self.queue_options
            )
        return q

    def _dlq_queue(self) -> AsyncQueue:
        if self._dlq is None:
            self._dlq = AsyncQueue(self.db, self.dlq_name, **self.queue_options)
        return self._dlq

    async def start(self, shards: int) -> None:
        for s in range(shards):
            self._queue(s)

    async def stop(self) -> None:
        """Close every queue: open buckets are written, held items released at once."""
        queues = list(self.queues.values()) + ([self._dlq] if self._dlq is not None else [])
        self.queues.clear()
        self._dlq = None
        for q in queues:
            try:
                await q.close()
            except BucketQError as exc:  # close the others; what was held comes back
                log.warning("closing queue %s failed: %s", v.printable(q.name), exc)

    async def _push_durable(
        self, q: AsyncQueue, entries: Sequence[dict[str, Any]], delay: float | None = None
    ) -> None:
        await _call(
            f"writing to queue {q.name!r}", q.push_many(list(entries), delay=delay, durable=True)
        )

    async def enqueue_many(
        self, shard: int, entries: Sequence[dict[str, Any]], delay: float = 0.0
    ) -> None:
        # A dispatch delay is the queue's own: the bucket is durable now, mature later.
        if not entries:
            return
        q = self._queue(shard)
        wait = self.slots.begin(shard, asyncio.get_running_loop().time())
        try:
            if wait > 0:  # the ingests of this slot wake together and share one bucket
                await asyncio.sleep(wait)
            await self._push_durable(q, entries, delay=delay if delay > 0 else None)
        finally:
            self.slots.end(shard)

    async def dequeue(self, shard: int, max_batch: int, max_wait: float) -> list[Delivery]:
        q = self._queue(shard)
        loop_time = time.monotonic
        deadline = loop_time() + max_wait
        out: list[Delivery] = []
        while len(out) < max_batch:
            msg = await _call(
                f"reading queue {q.name!r}", q.reserve(timeout=max(0.0, deadline - loop_time()))
            )
            if msg is None:
                break
            out.append(Delivery(dict(msg.payload), msg))
        return out

    async def _commit(self, q: AsyncQueue, deliveries: Sequence[Delivery]) -> None:
        for d in deliveries[:-1]:
            await q.commit(d.token)
        if deliveries:
            await _call(
                f"committing to queue {q.name!r}", q.commit(deliveries[-1].token, flush=True)
            )

    async def ack(self, shard: int, deliveries: Sequence[Delivery]) -> None:
        await self._commit(self._queue(shard), deliveries)

    async def requeue(self, shard: int, deliveries: Sequence[Delivery], delay: float) -> None:
        q = self._queue(shard)
        await self._push_durable(q, [d.entry for d in deliveries], delay=max(delay, 0.0))
        await self._commit(q, deliveries)

    async def dead_letter(
        self, shard: int, deliveries: Sequence[Delivery], reason: str | None = None
    ) -> int:
        dead = [
            dead_entry(d.entry, shard, reason or d.entry.get("error") or "dead-lettered")
            for d in deliveries
        ]
        await self._push_durable(self._dlq_queue(), dead)
        await self._commit(self._queue(shard), deliveries)
        if not self.dlq_max:
            return 0
        over = await self.dlq_size() - self.dlq_max
        if over <= 0:
            return 0

        async def drop(reader: AsyncQueue, msg: Any) -> None:
            await reader.commit(msg)

        dropped = await self._read_dlq(over, drop)  # the oldest first
        await _call(
            "counting dropped DLQ records",
            self.db[self.dlq_name + ".dropped"].update_one(
                {"_id": "dropped"}, {"$inc": {"n": dropped}}, upsert=True
            ),
        )
        return dropped

    async def dlq_dropped(self) -> int:
        doc = await _call(
            "reading the dropped DLQ count",
            self.db[self.dlq_name + ".dropped"].find_one({"_id": "dropped"}),
        )
        return int((doc or {}).get("n", 0))

    async def pending(self) -> dict[int, int]:
        return {
            s: await _call(f"counting queue {q.name!r}", q.total_size())
            for s, q in list(self.queues.items())
        }

    # -- DLQ: a separate reader queue per operation, closed (and so released) after ----------

    async def _read_dlq(self, limit: int | None, handle: Any) -> int:
        return await _call(f"reading queue {self.dlq_name!r}", self._read_dlq_items(limit, handle))

    async def _read_dlq_items(self, limit: int | None, handle: Any) -> int:
        total = await self.dlq_size()
        want = total if limit is None else min(limit, total)
        if want <= 0:
            return 0
        reader = AsyncQueue(self.db, self.dlq_name, **self.queue_options)
        n = 0
        try:
            while n < want:
                msg = await reader.reserve(timeout=5.0)
                if msg is None:
                    break
                await handle(reader, msg)
                n += 1
        finally:
            await reader.drain(timeout=0)
            await reader.close()
        return n

    async def dlq_inspect(self, limit: int = 100) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []

        async def keep(reader: AsyncQueue, msg: Any) -> None:
            seen.append(dict(msg.payload, dlq_id=msg.id))

        await self._read_dlq(limit, keep)
        return seen

    async def dlq_replay(
        self, limit: int | None = None, shard_of: Callable[[Mapping[str, Any]], int] | None = None
    ) -> int:
        async def replay(reader: AsyncQueue, msg: Any) -> None:
            dead = dict(msg.payload)
            shard = shard_of(dead) if shard_of is not None else int(dead["shard"])
            await self._push_durable(self._queue(shard), [replayed_entry(dead)])
            await reader.commit(msg)

        return await self._read_dlq(limit, replay)

    async def dlq_purge(self) -> int:
        async def drop(reader: AsyncQueue, msg: Any) -> None:
            await reader.commit(msg)

        return await self._read_dlq(None, drop)

    async def dlq_size(self) -> int:
        dlq = AsyncQueue(self.db, self.dlq_name, **self.queue_options)
        return await _call(f"counting queue {dlq.name!r}", dlq.total_size())
