"""What the reservoir buffer holds, and what it reports of it.

:class:`BufferState` is the base of :class:`~bucketq.reservoir.BufferedReservoir`
(``_buffered``): the storage engine and the transport, the policies it is built with
(batches, retries, dispatch delays, the breaker), the shards and the projects on the
overflow shard, the cached pending count and the counters; and what it reports from
them without a round trip: ``stats()``, ``buffer_health()``, ``health()`` and the
Prometheus text.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from .._validate import printable
from ._breaker import STATE_NAMES, CircuitBreaker
from ._config import BufferConfig
from ._isolation import RecordWriter
from ._metrics import BufferMetrics
from ._policy import BatchPolicy, ProjectOverflow, record_shard, shard_for
from ._reservoir import Reservoir
from ._transport import Transport

log = logging.getLogger("bucketq.reservoir")

#: How often the cached pending count is checked against the transport.
DEFAULT_STATS_INTERVAL = 5.0


class BufferState(Reservoir):
    """What one buffer holds and reports; the arguments are
    :class:`~bucketq.reservoir.BufferedReservoir`'s."""

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

    # -- shards and the overflow shard -----------------------------------------------------

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
