"""``BufferedReservoir``: the reservoir buffer's asyncio shell, its face.

Ingests are split by shard and handed to the transport; one flush consumer task per
shard writes batches to the storage engine and settles every record
(``_flush_consumers``). Policy (breaker, backoff, shards, batches, reading a storage
result) lives in the pure modules; this file builds, calls, interprets.

One job a module, each class built on the one below: what the buffer holds and
reports (``_buffer_state``), the flush consumers (``_flush_consumers``); this module
starts and stops the buffer, takes ingests (to the transport, or straight to storage
while it cannot) and serves the DLQ. ``_signals`` stops it on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..errors import TransportError
from ._flush_consumers import FlushConsumers
from ._policy import ORIGINS, new_entry, record_shard, result, sharded_by_project
from ._reservoir import STORAGE_METHOD, IngestResult

log = logging.getLogger("bucketq.reservoir")


class BufferedReservoir(FlushConsumers):
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
