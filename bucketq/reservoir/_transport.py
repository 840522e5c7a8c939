"""The transport interface and the in-process transports (``memory``, ``passthrough``)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import _validate as v
from ..errors import TransportUnavailable
from ._policy import dead_entry, replayed_entry

log = logging.getLogger("bucketq.reservoir.transport")


class Delivery:
    """One record handed to a flush consumer: ``entry`` (the envelope, which the
    consumer may update before a requeue or dead-letter) and the transport's ``token``."""

    __slots__ = ("entry", "token")

    def __init__(self, entry: dict[str, Any], token: Any) -> None:
        self.entry = entry
        self.token = token

    def __repr__(self) -> str:
        return f"<Delivery {self.entry.get('id')} attempts={self.entry.get('attempts')}>"


class Transport:
    """Where buffered records wait between the ingest call and the storage write.

    Contract (``tests/reservoir/test_transport_contract.py`` checks it for every
    transport):

    - ``start(shards)`` before anything else; ``stop()`` releases resources and keeps
      what is unacknowledged where the transport can (durable transports keep it for
      the next process). Both are idempotent.
    - ``enqueue_many(shard, entries, delay)`` returns once the
      transport has accepted the entries (``durable`` transports: once they survive
      the process). They raise :class:`~bucketq.errors.TransportError` otherwise.
      With a ``delay`` (seconds, the dispatch delay) the entries are accepted the same
      way but not delivered before the delay ran out.
    - ``dequeue(shard, max_batch, max_wait)`` returns at most ``max_batch`` deliveries,
      as soon as it has ``max_batch`` or ``max_wait`` seconds after the call; an empty
      list when nothing came. A delivery stays the consumer's until it is settled.
    - Each delivery is settled exactly once by ``ack`` (stored: gone for good),
      ``requeue(..., delay)`` (delivered again, with its updated envelope, not before
      ``delay`` seconds) or ``dead_letter(..., reason)`` (moved to the DLQ with the
      reason; the move and the ack happen together).
    - A delivery never settled (its consumer died) is delivered again: at-least-once.
      ``release(shard, deliveries)`` gives back deliveries whose consumer failed or was
      cancelled before settling them (the memory transport has no other way to see
      that); ``keepalive(shard, deliveries)``, called every ``keepalive_interval``
      seconds while a batch is being written, keeps another consumer from taking them
      over meanwhile (``None``: the transport needs no keepalive).
    - ``pending()`` counts per shard what is not yet settled; it may cost round trips
      and is for a background refresher, never per request.
    - ``dlq_inspect(limit)``, ``dlq_replay(limit)``, ``dlq_purge()``, ``dlq_size()``.
    """

    name = "base"
    durable = False
    keepalive_interval: float | None = None
    #: The DLQ keeps at most this many records (the oldest are dropped past it).
    dlq_max: int | None = None

    async def start(self, shards: int) -> None:
        raise NotImplementedError

    async def release(self, shard: int, deliveries: Sequence[Delivery]) -> None:
        """Deliver again, at once, the ``deliveries`` not settled yet. Durable transports
        redeliver what a dead consumer held by themselves (lease, claim): a no-op."""
        return None

    async def keepalive(self, shard: int, deliveries: Sequence[Delivery]) -> None:
        """The consumer still works on ``deliveries``."""
        return None

    async def stop(self) -> None:
        return None

    async def enqueue_many(
        self, shard: int, entries: Sequence[dict[str, Any]], delay: float = 0.0
    ) -> Any:
        """Returns None; ``passthrough`` returns, per entry, None (stored) or why it was not."""
        raise NotImplementedError

    async def expedite(self) -> None:
        """Stopping: entries that wait only for their dispatch delay are delivered now. A
        transport that keeps them across processes leaves them for the next one."""
        return None

    async def dequeue(self, shard: int, max_batch: int, max_wait: float) -> list[Delivery]:
        raise NotImplementedError

    async def ack(self, shard: int, deliveries: Sequence[Delivery]) -> None:
        raise NotImplementedError

    async def requeue(self, shard: int, deliveries: Sequence[Delivery], delay: float) -> None:
        raise NotImplementedError

    async def dead_letter(
        self, shard: int, deliveries: Sequence[Delivery], reason: str | None = None
    ) -> int | None:
        """Returns how many of the oldest DLQ records were dropped to stay within
        ``dlq_max`` (None or 0: none)."""
        raise NotImplementedError

    async def dlq_dropped(self) -> int:
        """Records dropped from the DLQ by its bound, in total (kept by durable ones)."""
        return 0

    async def pending(self) -> dict[int, int]:
        raise NotImplementedError

    async def stats(self) -> dict[str, Any]:
        pend = await self.pending()
        return {"transport": self.name, "durable": self.durable, "pending": sum(pend.values()),
                "pending_by_shard": pend, "dlq": await self.dlq_size(), "dlq_max": self.dlq_max,
                "dlq_dropped": await self.dlq_dropped()}  # fmt: skip

    async def dlq_inspect(self, limit: int = 100) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def dlq_replay(
        self, limit: int | None = None, shard_of: Callable[[Mapping[str, Any]], int] | None = None
    ) -> int:
        """Put dead records back with fresh attempts: on ``shard_of(dead)`` (their shard
        under the current shard count and shard key) or, without it, on the shard they
        died on."""
        raise NotImplementedError

    async def dlq_purge(self) -> int:
        raise NotImplementedError

    async def dlq_size(self) -> int:
        raise NotImplementedError


class _MemShard:
    __slots__ = ("ready", "delayed", "inflight", "wake")

    def __init__(self) -> None:
        self.ready: deque[dict[str, Any]] = deque()
        # A timer heap of (due, seq, entry, dispatch): retries and dispatch delays.
        self.delayed: list[tuple[float, int, dict[str, Any], bool]] = []
        self.inflight: dict[int, dict[str, Any]] = {}
        self.wake = asyncio.Event()


class MemoryTransport(Transport):
    """Bounded, in this process only: what is pending when the process exits is lost
    (``stop()`` reports how much). ``capacity`` bounds the records held; past it,
    ``enqueue`` raises :class:`~bucketq.errors.TransportUnavailable`."""

    name = "memory"
    durable = False

    def __init__(self, *, capacity: int = 100_000) -> None:
        self.capacity = v.count("capacity", capacity, lo=1)
        self._shards: dict[int, _MemShard] = {}
        self._dlq: list[dict[str, Any]] = []
        self._dropped = 0
        self._count = 0
        self._tokens = itertools.count()
        self._expedited = 0

    async def start(self, shards: int) -> None:
        for s in range(shards):
            self._shards.setdefault(s, _MemShard())

    def _shard(self, shard: int) -> _MemShard:
        try:
            return self._shards[shard]
        except KeyError:
            raise TransportUnavailable(
                f"Shard {shard} does not exist; call start() with enough shards."
            ) from None

    async def enqueue_many(
        self, shard: int, entries: Sequence[dict[str, Any]], delay: float = 0.0
    ) -> None:
        self._put(shard, entries, delay)

    def _put(self, shard: int, entries: Sequence[dict[str, Any]], delay: float = 0.0) -> None:
        sh = self._shard(shard)
        if self._count + len(entries) > self.capacity:
            raise TransportUnavailable(
                f"The memory transport holds {self._count} records (capacity {self.capacity}); "
                "write to storage directly or raise RESERVOIR_BUFFER_MEMORY_CAPACITY."
            )
        if delay > 0:
            due = time.monotonic() + delay
            for e in entries:
                heapq.heappush(sh.delayed, (due, next(self._tokens), dict(e), True))
        else:
            sh.ready.extend(dict(e) for e in entries)
        self._count += len(entries)
        sh.wake.set()

    async def expedite(self) -> None:
        # The dequeues waiting now return what they hold instead of filling their batch
        # (a stop waited out every idle consumer's batch age); later ones wait as ever.
        self._expedited += 1
        for sh in self._shards.values():
            keep = [t for t in sh.delayed if not t[3]]
            if len(keep) < len(sh.delayed):
                sh.ready.extend(t[2] for t in sorted(t for t in sh.delayed if t[3]))
                sh.delayed = keep
                heapq.heapify(sh.delayed)
            sh.wake.set()

    def _promote(self, sh: _MemShard, now: float) -> None:
        while sh.delayed and sh.delayed[0][0] <= now:
            sh.ready.append(heapq.heappop(sh.delayed)[2])

    async def dequeue(self, shard: int, max_batch: int, max_wait: float) -> list[Delivery]:
        sh = self._shard(shard)
        deadline = time.monotonic() + max_wait
        expedited = self._expedited
        out: list[Delivery] = []
        while True:
            now = time.monotonic()
            self._promote(sh, now)
            while sh.ready and len(out) < max_batch:
                entry = sh.ready.popleft()
                token = next(self._tokens)
                sh.inflight[token] = entry
                out.append(Delivery(entry, token))
            if len(out) >= max_batch or now >= deadline:
                return out
            if self._expedited != expedited:
                return out
            wait = deadline - now
            if sh.delayed:
                wait = min(wait, max(sh.delayed[0][0] - now, 0.0))
            sh.wake.clear()
            try:
                await asyncio.wait_for(sh.wake.wait(), wait)
            except TimeoutError:
                pass

    async def release(self, shard: int, deliveries: Sequence[Delivery]) -> None:
        sh = self._shard(shard)
        back = self._settle(sh, deliveries)
        if back:
            sh.ready.extendleft(reversed(back))
            sh.wake.set()
            log.warning("shard %d: %d records whose flush did not finish are delivered again",
                        shard, len(back))  # fmt: skip

    def _settle(self, sh: _MemShard, deliveries: Sequence[Delivery]) -> list[dict[str, Any]]:
        out = []
        for d in deliveries:
            if sh.inflight.pop(d.token, None) is not None:
                out.append(d.entry)
        return out

    async def ack(self, shard: int, deliveries: Sequence[Delivery]) -> None:
        self._count -= len(self._settle(self._shard(shard), deliveries))

    async def requeue(self, shard: int, deliveries: Sequence[Delivery], delay: float) -> None:
        sh = self._shard(shard)
        due = time.monotonic() + max(delay, 0.0)
        for entry in self._settle(sh, deliveries):
            heapq.heappush(sh.delayed, (due, next(self._tokens), entry, False))
        sh.wake.set()

    async def dead_letter(
        self, shard: int, deliveries: Sequence[Delivery], reason: str | None = None
    ) -> int:
        for entry in self._settle(self._shard(shard), deliveries):
            self._dlq.append(
                dead_entry(entry, shard, reason or entry.get("error") or "dead-lettered")
            )
            self._count -= 1
        over = len(self._dlq) - self.dlq_max if self.dlq_max else 0
        if over > 0:
            del self._dlq[:over]
            self._dropped += over
        return max(over, 0)

    async def dlq_dropped(self) -> int:
        return self._dropped

    async def pending(self) -> dict[int, int]:
        return {
            s: len(sh.ready) + len(sh.delayed) + len(sh.inflight) for s, sh in self._shards.items()
        }

    async def dlq_inspect(self, limit: int = 100) -> list[dict[str, Any]]:
        return [dict(e) for e in self._dlq[:limit]]

    async def dlq_replay(
        self, limit: int | None = None, shard_of: Callable[[Mapping[str, Any]], int] | None = None
    ) -> int:
        take = self._dlq if limit is None else self._dlq[:limit]
        n = 0
        for dead in list(take):
            shard = shard_of(dead) if shard_of is not None else int(dead["shard"])
            if shard not in self._shards:
                continue
            self._put(shard, [replayed_entry(dead)])
            self._dlq.remove(dead)
            n += 1
        return n

    async def dlq_purge(self) -> int:
        n = len(self._dlq)
        self._dlq.clear()
        return n

    async def dlq_size(self) -> int:
        return len(self._dlq)


class PassthroughTransport(MemoryTransport):
    """No buffering: ``enqueue`` returns only once a flush consumer has settled every
    entry (stored, or dead-lettered), so the caller waits for the storage write exactly
    as without a buffer, while batching, retries, the DLQ and metrics still apply.
    Nothing is held beyond the caller's wait; ``dequeue`` does not wait to fill batches."""

    name = "passthrough"
    eager = True

    def __init__(self, *, capacity: int = 100_000) -> None:
        super().__init__(capacity=capacity)
        # Keyed by record id; a list, since a caller may send one id twice.
        self._waiters: dict[str, list[asyncio.Future[str | None]]] = {}

    async def enqueue_many(  # type: ignore[override]
        self, shard: int, entries: Sequence[dict[str, Any]], delay: float = 0.0
    ) -> list[str | None]:
        """Returns, per entry, None when it was stored or the reason it was dead-lettered.
        No dispatch delay: the caller waits for the write."""
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[str | None]] = []
        for e in entries:
            fut: asyncio.Future[str | None] = loop.create_future()
            self._waiters.setdefault(e["id"], []).append(fut)
            futs.append(fut)
        try:
            self._put(shard, entries)
        except BaseException:
            for e, fut in zip(entries, futs, strict=True):
                self._forget(e["id"], fut)
            raise
        return list(await asyncio.gather(*futs))

    async def dequeue(self, shard: int, max_batch: int, max_wait: float) -> list[Delivery]:
        sh = self._shard(shard)
        out = await super().dequeue(shard, max_batch, 0.0)
        if out:
            return out
        if sh.delayed:
            max_wait = min(max_wait, max(sh.delayed[0][0] - time.monotonic(), 0.0))
        sh.wake.clear()
        try:
            await asyncio.wait_for(sh.wake.wait(), max_wait)
        except TimeoutError:
            pass
        return await super().dequeue(shard, max_batch, 0.0)

    def _forget(self, rid: str, fut: asyncio.Future[str | None]) -> None:
        waiting = self._waiters.get(rid, [])
        if fut in waiting:
            waiting.remove(fut)
        if not waiting:
            self._waiters.pop(rid, None)

    def _release(self, deliveries: Sequence[Delivery], reason: str | None = None) -> None:
        for d in deliveries:
            waiting = self._waiters.get(d.entry["id"])
            fut = waiting.pop(0) if waiting else None
            if waiting == []:
                del self._waiters[d.entry["id"]]
            if fut is not None and not fut.done():
                fut.set_result(
                    None if reason is None else (reason or d.entry.get("error") or "dead-lettered")
                )

    async def ack(self, shard: int, deliveries: Sequence[Delivery]) -> None:
        await super().ack(shard, deliveries)
        self._release(deliveries)

    async def dead_letter(
        self, shard: int, deliveries: Sequence[Delivery], reason: str | None = None
    ) -> int:
        dropped = await super().dead_letter(shard, deliveries, reason)
        self._release(deliveries, reason or "")
        return dropped

    async def stop(self) -> None:
        for waiting in self._waiters.values():
            for fut in waiting:
                if not fut.done():
                    fut.set_result("the passthrough transport stopped before the write")
        self._waiters.clear()
