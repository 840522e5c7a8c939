"""The reservoir buffer: an optional decorator between a log-ingestion API and its
storage engine (docs/reservoir.md).

::

    ingest API ──▶ BufferedReservoir ──enqueue──▶ Transport (memory | redis | bucketq | passthrough)
                        │ breaker open: write through         │ one flush consumer per shard
                        ▼                                      ▼
                    Reservoir (MongoReservoir: logs, spans, metrics) ◀── batches, retries, DLQ

``redis``, ``mmh3`` and ``prometheus_client`` come with ``pip install 'bucketq[reservoir]'``
and are imported only when used. See ``docs/reservoir.md``.

What an ingest API calls:

- :class:`BufferedReservoir`: the buffer; :class:`BufferConfig` its settings,
  :func:`from_env` reads them from ``RESERVOIR_BUFFER_*``, :func:`config_table` renders
  their table; :func:`wrap_reservoir` puts a buffer around a storage engine when the
  settings enable one; :func:`install_signal_handlers` stops it gracefully on SIGTERM;
  :func:`render_metrics` is its Prometheus text.
- :class:`Reservoir`: the storage interface (returning :class:`IngestResult`;
  :data:`STORAGE_METHOD` names the method of each record kind); :class:`MongoReservoir`
  the MongoDB engine.
- :class:`Transport` and :class:`Delivery`: the transport interface; the transports
  :class:`MemoryTransport`, :class:`RedisTransport`, :class:`BucketqTransport` and
  :class:`PassthroughTransport` (``BufferConfig.transport`` picks one).

Errors are in :mod:`bucketq.errors` (``TransportError`` and its kinds, ``CircuitOpen``).
"""

from .. import _lazy
from ._buffered import BufferedReservoir, install_signal_handlers
from ._config import BufferConfig, config_table, from_env
from ._factory import wrap_reservoir
from ._metrics import render_metrics
from ._mongo import MongoReservoir
from ._reservoir import STORAGE_METHOD, IngestResult, Reservoir
from ._transport import Delivery, MemoryTransport, PassthroughTransport, Transport

__all__ = [
    "STORAGE_METHOD",
    "BucketqTransport",
    "BufferConfig",
    "BufferedReservoir",
    "Delivery",
    "IngestResult",
    "MemoryTransport",
    "MongoReservoir",
    "PassthroughTransport",
    "RedisTransport",
    "Reservoir",
    "Transport",
    "config_table",
    "from_env",
    "install_signal_handlers",
    "render_metrics",
    "wrap_reservoir",
]

# The redis and bucketq transports import their drivers: they load on first use.
__getattr__, __dir__ = _lazy.attributes(
    __name__, {"RedisTransport": "._redis", "BucketqTransport": "._bucketq"}, __all__
)
