"""``BufferedReservoir``: the reservoir buffer's asyncio shell.

Ingests are split by shard and handed to the transport; one flush consumer task per
shard writes batches to the storage engine, kinds in parallel, and settles every
record: ack when stored, requeue with a jittered backoff when its write failed, DLQ
after ``max_retry_attempts``. Which records of a write failed is found in
``_isolation``. Policy (breaker, backoff, shards, batches, reading a storage result)
lives in the pure modules; this file builds, calls, interprets.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Container, Sequence
from typing import Any

from .._guard import LoopGuard
from .._validate import printable
from ..errors import TransportError
from ._breaker import STATE_NAMES, CircuitBreaker
from ._config import BufferConfig
from ._isolation import RecordWriter
from ._metrics import BufferMetrics
from ._policy import (
    KINDS,
    ORIGINS,
    BatchPolicy,
    ProjectOverflow,
    new_entry,
    record_shard,
    result,
    retry_delay,
    shard_for,
    sharded_by_project,
)
from ._reservoir import STORAGE_METHOD, IngestResult, Reservoir
from ._transport import Delivery, Transport

log = logging.getLogger("bucketq.reservoir")

#: How often the cached pending count is checked against the transport.
DEFAULT_STATS_INTERVAL = 5.0


class BufferedReservoir(Reservoir):
    """A :class:`Reservoir` that buffers ingests in ``transport`` and writes them to
    ``reservoir`` in the background. Use ``async with`` (or ``start()``/``stop()``).

    - ``ingest*`` returns once the transport accepted the records (``bucketq``: once
      they are durable in MongoDB). Records without a ``project_id`` fail at once.
      While the breaker is open, the transport fails, or the buffer is stopping,
      records go straight to storage and the storage's result is returned.
    - ``query``/``health`` pass through (``health`` adds the buffer's state).
    - ``stats()`` is cached: it never makes a round trip.
    - ``registry``: a ``prometheus_client.CollectorRegistry`` for the metrics (a fresh
      one by default); ``clock``/``rng``: the breaker's clock and the backoff jitter;
      ``wall_clock``: the POSIX time the date-boundary window is checked against.
    - ``ingest*(records, origin="otlp")``: records a collector batched already; they get
      no dispatch delay (``DISPATCH_DELAY_BY_KIND``, ``DATE_BOUNDARY_DELAY_MS``).
    """

    def __init__(
        self,
        reservoir: Reservoir,
        transport: Transport,
        config: BufferConfig | None = None,
        *,
        registry: Any = None,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
        stats_interval: float = DEFAULT_STATS_INTERVAL,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage = reservoir
        self.transport = transport
        if transport.dlq_max is None:
            transport.dlq_max = (config or BufferConfig(enabled=True)).dlq_max
        self.config = cfg = config or BufferConfig(enabled=True)
        self.shards = cfg.total_shards
        self.batch = BatchPolicy(cfg.max_batch_size, cfg.max_batch_age_ms / 1000)
        self.retry = cfg.retry_policies()
        # No dispatch delay through passthrough: its caller waits for the write.
        delays = cfg.delay_policy()
        self.delays = delays if delays.active and not getattr(transport, "eager", False) else None
        self.wall_clock = wall_clock
        # Until then (monotonic) records may wait for their dispatch delay: not a stall.
        self._held_until = 0.0
        # Projects moved to the overflow shard by their own failures (AUTO_OVERFLOW_*).
        self.overflow = (
            ProjectOverflow(cfg.auto_overflow_failures, cfg.auto_overflow_cooldown_ms / 1000, clock)
            if cfg.auto_overflow_failures
            else None
        )
        self._overflowed: frozenset[str] = cfg.overflow_projects
        self.metrics = BufferMetrics(registry)
        self.breaker = CircuitBreaker(
            pending_threshold=cfg.pending_threshold,
            failure_threshold=cfg.failure_threshold,
            cooldown=cfg.cooldown_ms / 1000,
            window=cfg.failure_window_ms / 1000,
            clock=clock,
            rule=cfg.breaker_rule,
        )
        self.breaker.listeners.append(self._breaker_changed)
        self.metrics.breaker_state.set(0)
        self.rng = rng
        self.stats_interval = stats_interval
        self._pending = 0
        self._state = "new"
        self._consumers: dict[int, asyncio.Task[None]] = {}
        #: Records each shard's flush consumer holds and is writing now (the console shows it).
        self._in_flight: dict[int, int] = {}
        self._refresher: asyncio.Task[None] | None = None
        self._last_progress = time.monotonic()
        # Every counter from the start, so stats() always has the same keys (a poller
        # reading stats()["stored"] before the first write must see 0, not a KeyError).
        self._counts: dict[str, int] = defaultdict(
            int,
            dict.fromkeys(
                (
                    "enqueued",
                    "delayed",
                    "bypassed",
                    "stored",
                    "storage_writes",
                    "retried",
                    "dead_lettered",
                    "dlq_dropped",
                    "loop_errors",
                ),
                0,
            ),
        )
        self._stop_report: dict[str, Any] | None = None
        self._writer = RecordWriter(reservoir, self.retry, self.metrics, self._counts)

    @property
    def idempotent(self) -> bool:  # type: ignore[override]
        """The storage engine's: rewrites of a record with the same ``_id`` are no-ops."""
        return self._writer.idempotent

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> BufferedReservoir:
        """Start the transport, read the pending count once, start one flush consumer per
        shard. Idempotent."""
        if self._state != "new":
            return self
        await self.transport.start(self.shards)
        try:
            self._pending = sum((await self.transport.pending()).values())
        except TransportError as exc:
            log.warning("reading the pending count failed (%s); starting from 0", exc)
        self.metrics.pending.set(self._pending)
        if self.delays is not None and self.transport.durable:
            # What a previous process left may wait for up to the longest dispatch delay.
            longest = max([self.delays.boundary, *self.delays.by_kind.values()])
            self._held_until = time.monotonic() + longest
        self._state = "running"
        for s in range(self.shards):
            self._consumers[s] = asyncio.create_task(
                self._consume(s), name=f"bucketq-reservoir-flush-{s}"
            )
        self._refresher = asyncio.create_task(self._refresh_loop(), name="bucketq-reservoir-stats")
        log.info(
            "buffer started: transport=%s shards=%d pending=%d",
            self.transport.name,
            self.shards,
            self._pending,
        )
        return self

    async def stop(self, timeout: float | None = None) -> dict[str, Any]:
        """Stop the buffer; call it after the HTTP server stopped accepting and its
        in-flight requests returned (LogTide's order: server first, then the drain).
        Ingests that still arrive while it drains, or after, are not refused: they go
        straight to storage and return the storage's result.

        Stop accepting (later ingests go straight to storage), drain for at most
        ``timeout`` seconds (default ``GRACEFUL_SHUTDOWN_MS``), stop the transport, and
        report: ``flushed`` (records stored while draining), ``left`` (records not yet
        stored), ``kept`` (of those, kept by a durable transport for the next process),
        ``lost`` (of those, held only by this process), ``timed_out``. Idempotent."""
        if self._stop_report is not None:
            return self._stop_report
        if self._state == "new":
            self._state = "stopped"
            self._stop_report = {"flushed": 0, "left": 0, "kept": 0, "lost": 0, "timed_out": False}
            return self._stop_report
        self._state = "stopping"
        if not self.transport.durable:  # held in this process only: flush them now
            await self.transport.expedite()
        budget = self.config.graceful_shutdown_ms / 1000 if timeout is None else timeout
        started = time.monotonic()
        stored_before = self._counts["stored"]
        tasks = list(self._consumers.values())
        done, not_done = await asyncio.wait(tasks, timeout=budget) if tasks else (set(), set())
        for t in not_done:
            t.cancel()
        if not_done:
            await asyncio.wait(not_done, timeout=5.0)
        if self._refresher is not None:
            self._refresher.cancel()
        try:
            left = sum((await self.transport.pending()).values())
        except TransportError as exc:
            log.warning("could not count what is left (%s)", exc)
            left = self._pending
        await self.transport.stop()
        self._state = "stopped"
        durable = self.transport.durable
        report = {
            "flushed": self._counts["stored"] - stored_before,
            "left": left,
            "kept": left if durable else 0,
            "lost": 0 if durable else left,
            "timed_out": bool(not_done),
            "seconds": round(time.monotonic() - started, 3),
        }
        if left and not durable:
            log.error(
                "buffer stopped with %d records not stored; the %s transport loses them",
                left,
                self.transport.name,
            )
        elif left:
            log.warning(
                "buffer stopped with %d records pending; the %s transport keeps them",
                left,
                self.transport.name,
            )
        else:
            log.info("buffer stopped; everything was stored")
        self._stop_report = report
        return report

    async def close(self) -> None:
        """Stop the buffer, then close the storage engine."""
        await self.stop()
        await self.storage.close()

    async def __aenter__(self) -> BufferedReservoir:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- ingest ------------------------------------------------------------------------------

    async def ingest(self, logs: Sequence[dict[str, Any]], *, origin: str = "api") -> IngestResult:
        return await self._ingest("log", logs, origin)

    async def ingest_spans(
        self, spans: Sequence[dict[str, Any]], *, origin: str = "api"
    ) -> IngestResult:
        return await self._ingest("span", spans, origin)

    async def ingest_metrics(
        self, metrics: Sequence[dict[str, Any]], *, origin: str = "api"
    ) -> IngestResult:
        return await self._ingest("metric", metrics, origin)

    def shard_of(self, project_id: str) -> int:
        return shard_for(project_id, self.config.shards, self.overflowed())

    def shard_of_record(self, kind: str, project_id: str, record: dict[str, Any]) -> int:
        """The record's shard under ``SHARD_KEY``, the current shard count and the
        projects on the overflow shard now."""
        cfg = self.config
        return record_shard(kind, project_id, record, cfg.shards, self.overflowed(),
                            cfg.shard_key)  # fmt: skip

    def overflowed(self) -> frozenset[str]:
        """The projects on the overflow shard now: ``OVERFLOW_PROJECTS`` and those moved
        there by their failures (``AUTO_OVERFLOW_*``) whose cool-down has not run out."""
        if self.overflow is not None and self.overflow.moved:
            back = self.overflow.expire()
            if back:
                self._overflow_changed([], back)
        return self._overflowed

    def _overflow_changed(self, moved: list[str], back: list[str]) -> None:
        assert self.overflow is not None
        self._overflowed = self.config.overflow_projects | frozenset(self.overflow.moved)
        self.metrics.overflow_projects.set(len(self.overflow.moved))
        for p in moved:
            self.metrics.overflow_moves.labels("moved").inc()
            log.warning("project %s moved to the overflow shard %d for %.0f s: its writes keep failing "
                        "while other projects' are stored", printable(p), self.config.shards,
                        self.overflow.cooldown)  # fmt: skip
        for p in back:
            self.metrics.overflow_moves.labels("back").inc()
            log.warning(
                "project %s is back on its own shard: its overflow cool-down ran out", printable(p)
            )

    async def _ingest(
        self, kind: str, records: Sequence[dict[str, Any]], origin: str = "api"
    ) -> IngestResult:
        if origin not in ORIGINS:
            raise ValueError(f"origin must be one of {', '.join(ORIGINS)}; got {origin!r}")
        errors: list[dict[str, Any]] = []
        groups: dict[int, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        cfg = self.config
        overflowed = self.overflowed()
        # Sharded by project (the default, and metrics always): one shard per project
        # in a call, found once, not per record.
        by_project = sharded_by_project(kind, cfg.shard_key)
        shard_of: dict[str, int] = {}
        now = time.time()
        for i, rec in enumerate(records):
            pid = rec.get("project_id") if isinstance(rec, dict) else None
            if not isinstance(pid, str) or not pid:
                errors.append({"index": i, "error": "project_id must be a non-empty string"})
                continue
            try:
                entry = new_entry(kind, pid, rec, now=now)
            except ValueError as exc:
                errors.append({"index": i, "error": str(exc)})
                continue
            if not by_project:
                shard = record_shard(kind, pid, rec, cfg.shards, overflowed, cfg.shard_key)
            elif (shard := shard_of.get(pid, -1)) < 0:
                shard = shard_of[pid] = record_shard(kind, pid, rec, cfg.shards, overflowed)
            groups[shard].append((i, entry))
        if not groups:
            return result(0, len(errors), errors)  # type: ignore[return-value]
        if self._state != "running":
            why = "the buffer is not running"
        elif not self.breaker.allow():
            why = "the breaker is open"
        else:
            why = ""
        if why:
            out = await self._bypass(kind, groups, why)
        else:
            delay = self.delays.delay(kind, origin, self.wall_clock()) if self.delays else 0.0
            if delay:
                self._held_until = max(self._held_until, time.monotonic() + delay)
            if len(groups) == 1:  # one shard (one project): no task for a gather
                [(s, items)] = groups.items()
                outs = [await self._enqueue(kind, s, items, delay)]
            else:
                outs = await asyncio.gather(
                    *(self._enqueue(kind, s, items, delay) for s, items in groups.items())
                )
            out = result()
            for o in outs:
                out["ingested"] += o["ingested"]
                out["failed"] += o["failed"]
                out["errors"].extend(o["errors"])
            self.breaker.record_pending(self._pending)
        out["failed"] += len(errors)
        out["errors"] = sorted(
            errors + out["errors"], key=lambda e: e.get("index", -1) if isinstance(e, dict) else -1
        )
        return out  # type: ignore[return-value]

    async def _enqueue(
        self, kind: str, shard: int, items: list[tuple[int, dict[str, Any]]], delay: float = 0.0
    ) -> dict[str, Any]:
        entries = [e for _, e in items]
        self._pending += len(entries)  # before the await: the consumer may settle them first
        try:
            outcomes = (
                await self.transport.enqueue_many(shard, entries, delay)
                if delay
                else await self.transport.enqueue_many(shard, entries)
            )
        except TransportError as exc:
            self._pending -= len(entries)
            log.warning("shard %d: %s transport refused %d records (%s); writing them directly",
                        shard, self.transport.name, len(entries), exc)  # fmt: skip
            return await self._bypass(kind, {shard: items}, str(exc))
        self.metrics.enqueued.labels(kind, str(shard)).inc(len(entries))
        self._counts["enqueued"] += len(entries)
        if delay:
            self.metrics.delayed.labels(kind, str(shard)).inc(len(entries))
            self._counts["delayed"] += len(entries)
        if isinstance(outcomes, list):  # passthrough: the write already happened
            errs = [
                {"index": i, "error": why}
                for (i, _), why in zip(items, outcomes, strict=True)
                if why
            ]
            return result(len(items) - len(errs), len(errs), errs)
        return result(len(items))

    async def _bypass(
        self, kind: str, groups: dict[int, list[tuple[int, dict[str, Any]]]], why: str
    ) -> dict[str, Any]:
        """Write straight to storage; map the storage's error indices back to the call's."""
        index = [i for items in groups.values() for i, _ in items]
        records = self._writer.records([e for items in groups.values() for _, e in items])
        for s, items in groups.items():
            self.metrics.bypass.labels(kind, str(s)).inc(len(items))
        self._counts["bypassed"] += len(records)
        log.debug("bypassing the buffer for %d %s records: %s", len(records), kind, why)
        res = await getattr(self.storage, STORAGE_METHOD[kind])(records)
        out = result(int(res.get("ingested", 0)), int(res.get("failed", 0)))
        for e in res.get("errors") or []:
            if (
                isinstance(e, dict)
                and isinstance(e.get("index"), int)
                and 0 <= e["index"] < len(index)
            ):
                e = dict(e, index=index[e["index"]])
            out["errors"].append(e)
        return out

    # -- flush consumers ---------------------------------------------------------------------

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

    # -- pending count, breaker, health ----------------------------------------------------

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.stats_interval)
            try:
                await self.refresh_pending()
            except Exception as exc:  # noqa: BLE001 - keep the cached value
                log.warning("refreshing the pending count failed: %s", exc)

    async def refresh_pending(self) -> int:
        """Read the pending count from the transport (round trips) into the cache."""
        self._pending = sum((await self.transport.pending()).values())
        self.metrics.pending.set(self._pending)
        self.breaker.record_pending(self._pending)
        return self._pending

    def _breaker_changed(self, old: int, new: int, reason: str) -> None:
        self.metrics.breaker_state.set(new)
        level = logging.INFO if new != 1 else logging.WARNING
        log.log(level, "breaker %s -> %s: %s", STATE_NAMES[old], STATE_NAMES[new], reason)

    @property
    def pending(self) -> int:
        """Records not yet stored, as cached (no round trip)."""
        return self._pending

    def stats(self) -> dict[str, Any]:
        """Cached counters and state; never a round trip."""
        state = self.breaker.state
        self.metrics.breaker_state.set(state)
        return {
            "state": self._state,
            "transport": self.transport.name,
            "shards": self.shards,
            "pending": self._pending,
            "breaker": STATE_NAMES[state],
            "breaker_reason": self.breaker.reason,
            "failures_in_window": self.breaker.failures_in_window(),
            "consecutive_failures": self.breaker.consecutive_failures,
            "overflowed": sorted(self.overflow.moved) if self.overflow is not None else [],
            "in_flight_by_shard": dict(self._in_flight),
            **dict(self._counts),
        }

    def buffer_health(self, *, stall_after: float | None = None) -> dict[str, Any]:
        """Whether the flush consumers make progress: not if any died, or if records are
        pending and nothing was flushed for ``stall_after`` seconds (default: ten batch
        ages, at least 30 s)."""
        stall_after = max(30.0, 10 * self.batch.max_age) if stall_after is None else stall_after
        dead = (
            [s for s, t in self._consumers.items() if t.done()] if self._state == "running" else []
        )
        now = time.monotonic()
        idle = now - self._last_progress
        # Records waiting for their dispatch delay are not a stall: count from when they are due.
        stalled = now - max(self._last_progress, self._held_until) >= stall_after
        ok = not dead and (self._pending == 0 or not stalled or self._state != "running")
        return {
            "ok": ok,
            "state": self._state,
            "pending": self._pending,
            "breaker": self.breaker.state_name,
            "dead_consumers": dead,
            "seconds_since_progress": round(idle, 3),
        }

    async def health(self) -> dict[str, Any]:
        storage = await self.storage.health()
        buf = self.buffer_health()
        status = storage.get("status", "ok")
        if status == "ok" and not buf["ok"]:
            status = "degraded"
        return {**storage, "status": status, "buffer": buf}

    async def query(self, kind: str = "log", **filters: Any) -> list[dict[str, Any]]:
        return await self.storage.query(kind, **filters)

    def render_metrics(self) -> str:
        """Prometheus text for ``/metrics`` (breaker state and pending as of now)."""
        self.metrics.breaker_state.set(self.breaker.state)
        self.metrics.pending.set(self._pending)
        return self.metrics.render().decode()

    # -- DLQ -----------------------------------------------------------------------------------

    async def dlq_inspect(self, limit: int = 100) -> list[dict[str, Any]]:
        return await self.transport.dlq_inspect(limit)

    async def dlq_replay(self, limit: int | None = None) -> int:
        """Dead records back with fresh attempts, each on its shard under the current
        ``SHARDS`` and ``SHARD_KEY`` (not the shard it died on: the count may have
        changed since)."""
        n = await self.transport.dlq_replay(limit, self._dead_shard)
        self._pending += n
        return n

    def _dead_shard(self, dead: Any) -> int:
        rec = dead.get("record") if isinstance(dead.get("record"), dict) else {}
        return self.shard_of_record(str(dead.get("kind") or "log"), str(dead["project_id"]), rec)

    async def dlq_purge(self) -> int:
        return await self.transport.dlq_purge()

    async def dlq_size(self) -> int:
        return await self.transport.dlq_size()


def install_signal_handlers(
    buffer: BufferedReservoir,
    *,
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
    on_stopped: Callable[[dict[str, Any]], Any] | None = None,
    before_stop: Callable[[], Any] | None = None,
) -> Callable[[], None]:
    """On SIGTERM/SIGINT (once): call ``before_stop()`` and wait for it (stop the HTTP
    server: no new requests, in-flight ones finish into the buffer), then stop
    ``buffer`` gracefully (drain), then call ``on_stopped(report)``. That is LogTide's
    order: server first, then the drain. Either callback may be a coroutine function.
    Call from the running loop; returns a function that removes the handlers."""
    loop = asyncio.get_running_loop()
    holder: dict[str, asyncio.Task[None]] = {}

    async def shutdown(signum: int) -> None:
        log.warning(
            "signal %d: stopping the buffer (draining up to %d ms)",
            signum,
            buffer.config.graceful_shutdown_ms,
        )
        if before_stop is not None:
            try:
                res = before_stop()
                if asyncio.iscoroutine(res):
                    await res
            except Exception:  # the drain must happen anyway
                log.exception("before_stop failed; draining the buffer anyway")
        report = await buffer.stop()
        log.warning("buffer stopped: %s", report)
        if on_stopped is not None:
            res = on_stopped(report)
            if asyncio.iscoroutine(res):
                await res

    def handler(signum: int) -> None:
        if "task" not in holder:
            holder["task"] = loop.create_task(shutdown(signum))

    for sig in signals:
        loop.add_signal_handler(sig, handler, sig)

    def remove() -> None:
        for sig in signals:
            loop.remove_signal_handler(sig)

    return remove
