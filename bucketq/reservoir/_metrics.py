"""Prometheus metrics of the buffer, with the seed's names, in their own registry."""

from __future__ import annotations

from typing import Any

from .._deps import require

NAMES = {
    "enqueued": "reservoir_buffer_enqueued_total",
    "delayed": "reservoir_buffer_delayed_total",
    "bypass": "reservoir_buffer_bypass_total",
    "flush_success": "reservoir_buffer_flush_success_total",
    "flush_failure": "reservoir_buffer_flush_failure_total",
    "flush_duration": "reservoir_buffer_flush_duration_ms",
    "dlq": "reservoir_buffer_dlq_total",
    "dlq_dropped": "reservoir_buffer_dlq_dropped_total",
    "breaker_state": "reservoir_buffer_breaker_state",
    "overflow_moves": "reservoir_buffer_overflow_moves_total",
    "overflow_projects": "reservoir_buffer_overflow_projects",
    "pending": "reservoir_buffer_pending",
}
#: Flush durations in milliseconds.
DURATION_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class BufferMetrics:
    """The buffer's collectors in ``registry`` (a fresh ``CollectorRegistry`` unless one
    is given, so several buffers, or tests, never collide).

    Counters count records, labelled by ``kind`` (log, span, metric) and ``shard``;
    ``flush_duration_ms`` observes each storage write; ``breaker_state`` is 0 closed,
    1 open, 2 half-open; ``pending`` is the cached pending count.
    """

    def __init__(self, registry: Any = None) -> None:
        prom = require("prometheus_client", "reservoir")
        self.registry = prom.CollectorRegistry(auto_describe=True) if registry is None else registry
        labels = ("kind", "shard")

        def counter(key: str, text: str, by: tuple[str, ...] = labels) -> Any:
            # prometheus_client appends "_total" to counter names itself.
            return prom.Counter(NAMES[key].removesuffix("_total"), text, by, registry=self.registry)

        def gauge(key: str, text: str) -> Any:
            return prom.Gauge(NAMES[key], text, registry=self.registry)

        self.enqueued = counter("enqueued", "Records accepted into the buffer.")
        self.delayed = counter(
            "delayed", "Records accepted with a dispatch delay (their flush waits)."
        )
        self.bypass = counter(
            "bypass", "Records written straight to storage (breaker open or transport down)."
        )
        self.flush_success = counter("flush_success", "Records a flush stored.")
        self.flush_failure = counter(
            "flush_failure", "Records a flush failed to store (retried or dead-lettered)."
        )
        self.dlq = counter("dlq", "Records moved to the dead-letter queue.")
        self.dlq_dropped = counter(
            "dlq_dropped",
            "Oldest dead-lettered records dropped to keep the DLQ within DLQ_MAX.",
            (),
        )
        self.flush_duration = prom.Histogram(
            NAMES["flush_duration"],
            "Duration of one storage write in milliseconds.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.breaker_state = gauge(
            "breaker_state", "Circuit breaker: 0 closed, 1 open, 2 half-open."
        )
        self.overflow_moves = counter(
            "overflow_moves",
            "Projects moved to the overflow shard by their failures "
            "(event=moved) and back after the cool-down (event=back).",
            ("event",),
        )
        self.overflow_projects = gauge(
            "overflow_projects", "Projects on the overflow shard by their failures now."
        )
        self.pending = gauge("pending", "Records pending in the buffer (cached).")
        self._prom = prom

    def render(self) -> bytes:
        """The registry in the Prometheus text format (the body of ``/metrics``)."""
        return self._prom.generate_latest(self.registry)

    @property
    def content_type(self) -> str:
        return str(self._prom.CONTENT_TYPE_LATEST)


def render_metrics(registry: Any) -> str:
    """Prometheus text of ``registry`` (a ``BufferMetrics``, a ``BufferedReservoir`` or a
    ``CollectorRegistry``), for a ``/metrics`` endpoint."""
    prom = require("prometheus_client", "reservoir")
    target = getattr(registry, "metrics", registry)
    target = getattr(target, "registry", target)
    return prom.generate_latest(target).decode()
