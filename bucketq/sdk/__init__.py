"""The logging SDK: send Python logs to ``bucketq serve`` without blocking the caller and
without losing a record silently.

::

    import logging
    from bucketq.sdk import IngestHandler
    logging.getLogger().addHandler(IngestHandler("http://127.0.0.1:8080", "bq_..."))

A log call puts the record on a bounded in-memory :class:`SafeQueue` and returns;
worker threads send batches to ``POST /api/v1/ingest``, fall back to ``fallback_url``
when the primary is down, and what can be neither queued nor sent is appended to a
disk spill that is replayed when the primary answers again (``bucketq sdk replay``
does it by hand). ``urllib3`` comes with ``pip install 'bucketq[sdk]'`` and is imported
when the first sender starts. See ``docs/sdk.md``.
"""

from ._client import Client, IngestHandler
from ._options import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BATCH_WAIT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_HEALTH_INTERVAL,
    DEFAULT_MAX_RETRY_AFTER,
    DEFAULT_QUEUE_SIZE,
    DEFAULT_RETRY_BACKOFF,
    DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_SPILL_MAX_BYTES,
    DEFAULT_SPILL_SEGMENT_BYTES,
    DEFAULT_TIMEOUT,
    DEFAULT_WORKERS,
    DRAIN_BATCH_SIZE,
    DRAIN_START_PERCENT,
    DRAIN_STOP_PERCENT,
    Config,
    default_spill_root,
    make_config,
)
from ._policy import Outcome, classify
from ._processor import Processor, close_all
from ._queue import SafeQueue
from ._replay import replay
from ._spill import ReplayResult, Spill

__all__ = [
    "Client",
    "Config",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_BATCH_WAIT",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_HEALTH_INTERVAL",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEFAULT_QUEUE_SIZE",
    "DEFAULT_RETRY_BACKOFF",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "DEFAULT_SPILL_MAX_BYTES",
    "DEFAULT_SPILL_SEGMENT_BYTES",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WORKERS",
    "DRAIN_BATCH_SIZE",
    "DRAIN_START_PERCENT",
    "DRAIN_STOP_PERCENT",
    "IngestHandler",
    "Outcome",
    "Processor",
    "ReplayResult",
    "SafeQueue",
    "Spill",
    "classify",
    "close_all",
    "default_spill_root",
    "make_config",
    "replay",
]
