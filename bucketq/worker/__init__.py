"""A worker: run a handler on a queue's items, with concurrency, time limits, back-off
on failure, dead letters and a clean stop on SIGTERM (docs/worker.md).

``Queue.consume(handler, **options)`` and ``AsyncQueue.consume`` run :class:`Worker` and
:class:`AsyncWorker`; ``bucketq worker MODULE:FUNCTION --queue NAME`` runs one from the
command line, in one process or several (``processes``).

Layout: ``core`` (the decisions: options, outcomes, time limits, the stop, counters,
restarts; no I/O), ``calls`` (calling the handler and hearing signals, in both
flavours), ``_async/worker.py`` (the I/O shell; the sync twin in ``_sync/`` is
generated), ``handlers`` (finding a handler by name), ``processes`` (several worker
processes and their supervisor), ``endpoint`` (``/metrics`` and ``/health``).
"""

from ._async.worker import AsyncWorker
from ._sync.worker import Worker
from .core import (
    DEFAULT_CONCURRENCY,
    DEFAULT_TIME_LIMIT,
    DURATION_BUCKETS,
    OUTCOMES,
    Retry,
    TimeLimitExceeded,
    WorkerOptions,
)
from .handlers import is_async, load_handler

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_TIME_LIMIT",
    "DURATION_BUCKETS",
    "OUTCOMES",
    "AsyncWorker",
    "Retry",
    "TimeLimitExceeded",
    "Worker",
    "WorkerOptions",
    "is_async",
    "load_handler",
]
