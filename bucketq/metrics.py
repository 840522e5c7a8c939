"""Prometheus metrics of bucketq queues and streams: a custom collector an application
registers (``pip install 'bucketq[reservoir]'`` brings ``prometheus_client``).

::

    from prometheus_client import REGISTRY, start_http_server
    from bucketq.metrics import QueueCollector

    q = Queue(db, "emails")
    REGISTRY.register(QueueCollector(db, ["emails"], objects=[q]))
    start_http_server(9100)

Each scrape reads the named queues' sizes with :class:`bucketq.admin.Inspector` (one
aggregation per queue, see docs/operations.md) and the ``stats()`` counters of the
queue objects this process holds (no query). ``bucketq serve`` exports it for
``BUCKETQ_WATCH_QUEUES``, from a snapshot it refreshes in the background (``snapshot=``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .admin import QueueRow
from .worker import DURATION_BUCKETS, OUTCOMES

log = logging.getLogger("bucketq.metrics")

__all__ = ["COUNTERS", "QueueCollector", "WorkerCollector"]

#: ``stats()`` key -> (counter name without ``_total``, help).
COUNTERS: dict[str, tuple[str, str]] = {
    "pushed": ("bucketq_queue_pushed", "Items pushed by this process."),
    "buckets_written": ("bucketq_queue_buckets_written", "Buckets this process inserted."),
    "reserved": ("bucketq_queue_reserved", "Items this process handed to reserve()."),
    "committed": ("bucketq_queue_committed", "Items this process committed."),
    "rolled_back": ("bucketq_queue_rolled_back", "Items this process rolled back."),
    "dead_lettered": ("bucketq_queue_dead_lettered", "Items this process moved to the dead-letter queue."),
    "lease_losses": ("bucketq_queue_lease_losses", "Held buckets another consumer took over."),
    "loop_errors": ("bucketq_queue_loop_errors", "Failures a background loop survived."),
}  # fmt: skip


class QueueCollector:
    """Sizes of queues in a database and counters of queue objects, as Prometheus metrics.

    ``db``: a pymongo ``Database`` read at each scrape; ``queues``: the names to export
    (None: every queue and stream in ``db``). ``objects``: queue or stream objects of this
    process whose ``stats()`` become ``bucketq_queue_*_total`` counters (labelled by
    their name; several objects of one name are summed). ``snapshot``: instead of ``db``,
    a function returning the rows to export (``bucketq serve`` refreshes them itself).
    A scrape that cannot read MongoDB exports ``bucketq_queue_inspect_up 0`` and no
    sizes, rather than failing the whole scrape."""

    def __init__(
        self,
        db: Any = None,
        queues: Iterable[str] | None = None,
        *,
        objects: Iterable[Any] = (),
        snapshot: Callable[[], list[QueueRow] | None] | None = None,
    ) -> None:
        if db is None and snapshot is None and not objects:
            raise TypeError("QueueCollector needs db, snapshot or objects.")
        self.db = db
        self.queues = None if queues is None else list(queues)
        self.objects = list(objects)
        self.snapshot = snapshot

    def describe(self) -> list[Any]:
        return []  # no fixed metrics: the registry must not call collect() at register time

    def _rows(self) -> list[QueueRow] | None:
        if self.snapshot is not None:
            return self.snapshot()
        if self.db is None:
            return None
        from .admin import Inspector

        try:
            return Inspector(self.db).queues(self.queues)
        except Exception as exc:  # noqa: BLE001 - a scrape exports what it can, and says so
            log.warning("reading queue sizes for metrics failed: %s", exc)
            return None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if self.db is not None or self.snapshot is not None:
            rows = self._rows()
            up = GaugeMetricFamily(
                "bucketq_queue_inspect_up", "1 if the last read of the queues' sizes succeeded."
            )
            up.add_metric([], 0 if rows is None else 1)
            yield up
            if rows:
                yield from _size_metrics(rows, GaugeMetricFamily)
        totals: dict[str, dict[str, int]] = {}
        for obj in self.objects:
            try:
                stats = obj.stats()
            except Exception:  # never fail a scrape over one object
                log.debug("stats() of %r failed", obj, exc_info=True)
                continue
            mine = totals.setdefault(str(getattr(obj, "name", "?")), {})
            for k in COUNTERS:
                if k in stats:
                    mine[k] = mine.get(k, 0) + int(stats[k])
        for key, (name, text) in COUNTERS.items():
            fam = CounterMetricFamily(name, text, labels=["queue"])
            for queue, stats in sorted(totals.items()):
                if key in stats:
                    fam.add_metric([queue], stats[key])
            yield fam


def _size_metrics(rows: list[QueueRow], gauge: Any) -> Iterator[Any]:
    items = gauge("bucketq_queue_items", "Stored items not yet consumed, by state "
                  "(a stream's are all ready until acknowledged).", labels=["queue", "kind", "state"])  # fmt: skip
    buckets = gauge("bucketq_queue_buckets", "Stored bucket documents.", labels=["queue", "kind"])
    dead = gauge("bucketq_queue_dead_letters", "Items in the queue's dead-letter queue (NAME.dlq).",
                 labels=["queue"])  # fmt: skip
    quarantined = gauge("bucketq_queue_quarantined_buckets", "Damaged buckets set aside.",
                        labels=["queue", "kind"])  # fmt: skip
    oldest = gauge("bucketq_queue_oldest_ready_age_seconds",
                   "How long the first ready bucket has been claimable (a stream: written, unacknowledged).",
                   labels=["queue", "kind"])  # fmt: skip
    nxt = gauge("bucketq_queue_next_mature_timestamp_seconds",
                "When the next scheduled bucket matures (Unix time).", labels=["queue"])  # fmt: skip
    consumers = gauge("bucketq_queue_consumers", "Consumers (host:pid) holding a lease.",
                      labels=["queue"])  # fmt: skip
    lag = gauge("bucketq_stream_lag_buckets",
                "A stream's sequence numbers handed out and not acknowledged.", labels=["queue"])  # fmt: skip
    for r in rows:
        for state in ("ready", "scheduled", "leased"):
            items.add_metric([r.name, r.kind, state], getattr(r, state))
        buckets.add_metric([r.name, r.kind], r.buckets)
        quarantined.add_metric([r.name, r.kind], r.quarantined)
        if r.oldest_ready_s is not None:
            oldest.add_metric([r.name, r.kind], r.oldest_ready_s)
        if r.kind == "queue":
            dead.add_metric([r.name], r.dead)
            consumers.add_metric([r.name], len(r.consumers))
            if r.next_mature is not None:
                nxt.add_metric([r.name], r.next_mature.timestamp())
        elif r.lag is not None:
            lag.add_metric([r.name], r.lag)
    yield from (items, buckets, dead, quarantined, oldest, nxt, consumers, lag)


class WorkerCollector:
    """The counters of workers (``Worker.stats()``, or what ``bucketq worker --processes``
    children report) as Prometheus metrics, labelled by queue. ``workers()`` returns the
    stats dicts to export; one marked ``retired`` holds the summed counters of worker
    processes that exited (kept so the counters never go back), and has no gauges.

    ``bucketq_worker_items_total{outcome}`` counts items by what became of them
    (``committed``, ``failed``, ``retried``, ``timed_out``, ``dead_letter``, ``late``,
    ``lost``: see
    docs/worker.md), ``bucketq_worker_handler_seconds`` is a histogram of handler run
    times, and the gauges say how many handlers run, are in hand or stuck past their time
    limit, and how many worker processes report."""

    def __init__(self, workers: Callable[[], Iterable[dict[str, Any]]]) -> None:
        self.workers = workers

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        try:
            rows = list(self.workers())
        except Exception:  # never fail a scrape: export nothing of the workers
            log.warning("reading the workers' stats failed", exc_info=True)
            rows = []
        items = CounterMetricFamily("bucketq_worker_items", "Items the worker handled, by "
                                    "what became of them.", labels=["queue", "outcome"])  # fmt: skip
        hist = HistogramMetricFamily("bucketq_worker_handler_seconds",
                                     "How long the handler ran on a delivery.", labels=["queue"])  # fmt: skip
        gauges = {
            "concurrency": GaugeMetricFamily("bucketq_worker_handlers", "Handlers that may run at once.", labels=["queue"]),
            "in_hand": GaugeMetricFamily("bucketq_worker_in_hand", "Deliveries whose handler runs now.", labels=["queue"]),
            "stuck": GaugeMetricFamily("bucketq_worker_stuck", "Handlers still running well past their time limit.", labels=["queue"]),
        }  # fmt: skip
        procs = GaugeMetricFamily("bucketq_worker_processes", "Worker processes reporting.",
                                  labels=["queue"])  # fmt: skip
        by_queue: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_queue.setdefault(str(r.get("queue", "?")), []).append(r)
        for queue, rs in sorted(by_queue.items()):
            for k in OUTCOMES:
                items.add_metric([queue, k], sum(int(r.get(k, 0)) for r in rs))
            counts = [0] * (len(DURATION_BUCKETS) + 1)
            total = 0.0
            for r in rs:
                h = r.get("handler_seconds") or {}
                for i, c in enumerate(list(h.get("counts", []))[: len(counts)]):
                    counts[i] += int(c)
                total += float(h.get("sum", 0.0))
            cumulative, buckets = 0, []
            for bound, c in zip((*DURATION_BUCKETS, float("inf")), counts, strict=True):
                cumulative += c
                buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
            hist.add_metric([queue], buckets, total)
            live = [r for r in rs if not r.get("retired")]
            for k, fam in gauges.items():
                fam.add_metric([queue], sum(int(r.get(k, 0)) for r in live))
            procs.add_metric([queue], len(live))
        yield items
        yield hist
        yield from gauges.values()
        yield procs
