"""The reservoir buffer: an optional decorator between a log-ingestion API and its
storage engine (docs/reservoir.md).

::

    ingest API ──▶ BufferedReservoir ──enqueue──▶ Transport (memory | redis | bucketq | passthrough)
                        │ breaker open: write through         │ one flush consumer per shard
                        ▼                                      ▼
                    Reservoir (MongoReservoir: logs, spans, metrics) ◀── batches, retries, DLQ

``redis``, ``mmh3`` and ``prometheus_client`` come with ``pip install 'bucketq[reservoir]'``
and are imported only when used. See ``docs/reservoir.md``.
"""

from ..errors import (
    CircuitOpen,
    ConfigurationError,
    TransportError,
    TransportTimeout,
    TransportUnavailable,
)
from ._breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from ._buffered import BufferedReservoir, install_signal_handlers
from ._config import SETTINGS, BufferConfig, Setting, config_table, from_env
from ._factory import create_transport, wrap_reservoir
from ._metrics import BufferMetrics, render_metrics
from ._mongo import MongoReservoir
from ._policy import BatchPolicy, retry_delay, shard_for
from ._reservoir import IngestResult, Reservoir
from ._transport import Delivery, MemoryTransport, PassthroughTransport, Transport


def __getattr__(name: str) -> object:
    # The redis and bucketq transports import their drivers; load them on first use.
    if name == "RedisTransport":
        from ._redis import RedisTransport

        return RedisTransport
    if name == "BucketqTransport":
        from ._bucketq import BucketqTransport

        return BucketqTransport
    raise AttributeError(f"module 'bucketq.reservoir' has no attribute {name!r}")


__all__ = [
    "BatchPolicy",
    "BucketqTransport",
    "BufferConfig",
    "BufferMetrics",
    "BufferedReservoir",
    "CLOSED",
    "CircuitBreaker",
    "CircuitOpen",
    "ConfigurationError",
    "Delivery",
    "HALF_OPEN",
    "IngestResult",
    "MemoryTransport",
    "MongoReservoir",
    "OPEN",
    "PassthroughTransport",
    "RedisTransport",
    "Reservoir",
    "SETTINGS",
    "Setting",
    "Transport",
    "TransportError",
    "TransportTimeout",
    "TransportUnavailable",
    "config_table",
    "create_transport",
    "from_env",
    "install_signal_handlers",
    "render_metrics",
    "retry_delay",
    "shard_for",
    "wrap_reservoir",
]
