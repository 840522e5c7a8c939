"""The buffer's flush consumers: one task per shard dequeues a flush batch, writes it
to storage, kinds in parallel (``_isolation`` finds which records of a write failed),
and settles every record: ack when stored, requeue with a jittered backoff when its
write failed, DLQ after ``max_retry_attempts``. A project whose writes keep failing
moves to the overflow shard (``AUTO_OVERFLOW_*``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Container, Sequence

from .._guard import LoopGuard
from ..errors import TransportError
from ._buffer_state import BufferState
from ._policy import KINDS, retry_delay
from ._transport import Delivery

log = logging.getLogger("bucketq.reservoir")


class FlushConsumers(BufferState):
    """The flush consumer of each shard (``start()`` starts them, ``stop()`` ends them)."""

    async def _consume(self, shard: int) -> None:
        """The flush consumer of one shard: only ``stop()`` ends it."""
        guard = LoopGuard(f"shard {shard}: the flush consumer", self._counts, log)
        while True:
            try:
                return await self._consume_loop(shard, guard)
            except Exception as exc:  # noqa: BLE001 - a consumer must not die; the guard logs it
                await asyncio.sleep(guard.failed(exc))

    async def _consume_loop(self, shard: int, guard: LoopGuard) -> None:
        attempt = 0
        eager = getattr(self.transport, "eager", False)
        while True:
            if self._state != "running" and await self._done_draining(shard, None):
                return
            try:
                deliveries = await self.transport.dequeue(
                    shard, self.batch.max_size, self.batch.max_age
                )
                attempt = 0
            except TransportError as exc:  # transport trouble, not a failed flush
                attempt += 1
                log.warning("shard %d: dequeue failed (%s); retrying", shard, exc)
                await asyncio.sleep(retry_delay(attempt, 0.1, 5.0, self.rng))
                continue
            except Exception as exc:  # noqa: BLE001 - a consumer must not die; the guard logs it
                await asyncio.sleep(guard.failed(exc))
                continue
            if not deliveries:
                if self._pending <= 0 or eager:
                    self._last_progress = time.monotonic()
                if self._state != "running" and await self._done_draining(shard, deliveries):
                    return
                continue
            self._in_flight[shard] = len(deliveries)
            try:
                await self._flush_held(shard, deliveries)
            except Exception as exc:  # noqa: BLE001 - unsettled deliveries come back; go on
                log.warning("shard %d: %d records were not settled (%s); they will be delivered "
                            "again", shard, len(deliveries), exc)  # fmt: skip
                self.breaker.record_failure()
                if isinstance(exc, TransportError):  # the transport's trouble: expected
                    attempt += 1
                    await asyncio.sleep(retry_delay(attempt, 0.1, 5.0, self.rng))
                else:  # unexpected: the guard logs it with its traceback
                    await asyncio.sleep(guard.failed(exc))
            finally:
                self._in_flight[shard] = 0

    async def _flush_held(self, shard: int, deliveries: list[Delivery]) -> None:
        """``_flush`` while keeping the deliveries this consumer's: a keepalive every
        ``transport.keepalive_interval`` seconds; on any failure or cancellation, what is
        not settled is released to be delivered again."""
        interval = self.transport.keepalive_interval
        beat = (
            asyncio.create_task(self._keepalive(shard, deliveries, interval)) if interval else None
        )
        try:
            await self._flush(shard, deliveries)
        except BaseException:
            try:
                await self.transport.release(shard, deliveries)
            except Exception as exc:  # noqa: BLE001 - durable transports redeliver anyway
                log.warning("shard %d: releasing unsettled records failed: %s", shard, exc)
            raise
        finally:
            if beat is not None:
                beat.cancel()

    async def _keepalive(self, shard: int, deliveries: list[Delivery], interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.transport.keepalive(shard, deliveries)
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.warning(
                    "shard %d: keeping %d deliveries failed: %s", shard, len(deliveries), exc
                )

    async def _done_draining(self, shard: int, last: list[Delivery] | None) -> bool:
        """Stopping: an in-memory transport must be emptied (retries included) before its
        consumer ends; a durable one keeps the rest, so its consumer ends as soon as a
        dequeue comes back empty (``last == []``): nothing more is ready for it, and what
        waits for a retry delay or is held by another process stays for later."""
        if self.transport.durable:
            return last is not None and not last
        return (await self.transport.pending()).get(shard, 0) == 0

    async def _flush(self, shard: int, deliveries: list[Delivery]) -> None:
        by_kind: dict[str, list[Delivery]] = defaultdict(list)
        for d in deliveries:
            kind = d.entry.get("kind")
            by_kind[kind if kind in KINDS else "log"].append(d)
        kinds = list(by_kind)
        outcomes = await asyncio.gather(
            *(self._writer.write_kind(shard, k, by_kind[k]) for k in kinds)
        )
        stored: list[Delivery] = []
        dead: list[Delivery] = []
        retry: dict[tuple[str, int], list[Delivery]] = defaultdict(list)
        failed_kinds = 0
        moved = self._observe_projects(outcomes)
        for kind, (ok, failed) in zip(kinds, outcomes, strict=True):
            stored.extend(ok)
            if ok:
                self.metrics.flush_success.labels(kind, str(shard)).inc(len(ok))
            if not failed:
                continue
            # A moved project's failures are its own: they do not open the breaker.
            failed_kinds += any(d.entry.get("project_id") not in moved for d, _ in failed)
            self.metrics.flush_failure.labels(kind, str(shard)).inc(len(failed))
            for d, reason in failed:
                d.entry["attempts"] = int(d.entry.get("attempts") or 0) + 1
                d.entry["error"] = reason
                if d.entry["attempts"] >= self.retry[kind].attempts:
                    dead.append(d)
                    self.metrics.dlq.labels(kind, str(shard)).inc()
                else:
                    retry[(kind, d.entry["attempts"])].append(d)
        await self.transport.ack(shard, stored)
        for (kind, attempts), group in retry.items():
            await self._retry(shard, group, self.retry[kind].delay(attempts, self.rng), moved)
        if dead:
            dropped = await self.transport.dead_letter(shard, dead)
            if dropped:
                self.metrics.dlq_dropped.inc(dropped)
                self._counts["dlq_dropped"] += dropped
                log.warning("shard %d: the DLQ is full (DLQ_MAX %s); dropped its %d oldest records",
                            shard, self.transport.dlq_max, dropped)  # fmt: skip
            for d in dead:
                log.error("shard %d: %s record %s dead-lettered after %d attempts: %s", shard, d.entry.get("kind"),
                          d.entry.get("id"), d.entry["attempts"], d.entry["error"])  # fmt: skip
        self._pending = max(0, self._pending - len(stored) - len(dead))
        self.metrics.pending.set(self._pending)
        self._counts["stored"] += len(stored)
        self._counts["dead_lettered"] += len(dead)
        self._counts["retried"] += sum(len(g) for g in retry.values())
        self._last_progress = time.monotonic()
        if failed_kinds:
            self.breaker.record_failure()  # one flush, however many kinds failed
        elif stored or not retry and not dead:
            self.breaker.record_success()

    def _observe_projects(
        self, outcomes: Sequence[tuple[list[Delivery], list[tuple[Delivery, str]]]]
    ) -> Container[str]:
        """Tell the overflow tracker which projects stored and which failed in this flush;
        the projects moved to the overflow shard now."""
        if self.overflow is None:
            return ()
        self.overflowed()  # take back the projects whose cool-down ran out first
        failed = {d.entry.get("project_id") for _, fl in outcomes for d, _ in fl}
        if failed:
            stored = {d.entry.get("project_id") for ok, _ in outcomes for d in ok}
            moved = self.overflow.observe(stored, failed)  # type: ignore[arg-type]
            if moved:
                self._overflow_changed(moved, [])
        return self.overflow.moved

    async def _retry(
        self, shard: int, group: list[Delivery], delay: float, moved: Container[str]
    ) -> None:
        """Requeue on this shard; a moved project's records go to the overflow shard
        (written there before they are acked here: a crash between duplicates, never
        loses). ``passthrough``'s enqueue waits for the write, so it requeues in place."""
        ov = self.config.shards
        away = [d for d in group if d.entry.get("project_id") in moved] if shard != ov else []
        if away and not getattr(self.transport, "eager", False):
            await self.transport.enqueue_many(ov, [d.entry for d in away], delay)
            await self.transport.ack(shard, away)
            group = [d for d in group if d.entry.get("project_id") not in moved]
        await self.transport.requeue(shard, group, delay)
