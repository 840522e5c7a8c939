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
- :class:`LogStore`: the logs of :class:`MongoReservoir` (``MongoReservoir.logstore``),
  packed into bucket documents with summaries; its reads (:meth:`LogStore.page`,
  ``record``, ``trace``, ``count``, ``aggregate``) take a :class:`LogFilter` and answer
  :class:`LogPage`, :class:`LogCount` and :class:`LogAggregate`; :func:`new_record_ids`
  and :func:`keyed_record_ids` make the record ids that pack together;
  :func:`unpack_bucket` reads a bucket document's records.
- :class:`Transport` and :class:`Delivery`: the transport interface; the transports
  :class:`MemoryTransport`, :class:`RedisTransport`, :class:`BucketqTransport` and
  :class:`PassthroughTransport` (``BufferConfig.transport`` picks one).

Errors are in :mod:`bucketq.errors` (``TransportError`` and its kinds, ``CircuitOpen``).
"""

from .. import _lazy
from ._buffered import BufferedReservoir
from ._config import BufferConfig, config_table, from_env
from ._factory import wrap_reservoir
from ._logbuckets import (
    BUCKET_SPAN,
    DEFAULT_RETENTION_DAYS,
    LogAggregate,
    LogCount,
    LogFilter,
    LogPage,
    PageBudget,
    build_bucket,
)
from ._logbuckets import keyed_ids as keyed_record_ids
from ._logbuckets import new_ids as new_record_ids
from ._logbuckets import sort_key as log_sort_key
from ._logbuckets import unpack as unpack_bucket
from ._logstore import LogStore
from ._metrics import render_metrics
from ._mongo import MongoReservoir
from ._reservoir import STORAGE_METHOD, IngestResult, Reservoir
from ._signals import install_signal_handlers
from ._transport import Delivery, MemoryTransport, PassthroughTransport, Transport

__all__ = [
    "BUCKET_SPAN",
    "DEFAULT_RETENTION_DAYS",
    "STORAGE_METHOD",
    "build_bucket",
    "BucketqTransport",
    "BufferConfig",
    "BufferedReservoir",
    "Delivery",
    "IngestResult",
    "LogAggregate",
    "LogCount",
    "LogFilter",
    "LogPage",
    "LogStore",
    "MemoryTransport",
    "MongoReservoir",
    "PageBudget",
    "PassthroughTransport",
    "RedisTransport",
    "Reservoir",
    "Transport",
    "config_table",
    "from_env",
    "install_signal_handlers",
    "keyed_record_ids",
    "log_sort_key",
    "new_record_ids",
    "render_metrics",
    "unpack_bucket",
    "wrap_reservoir",
]

# The redis and bucketq transports import their drivers: they load on first use.
__getattr__, __dir__ = _lazy.attributes(
    __name__, {"RedisTransport": "._redis", "BucketqTransport": "._bucketq"}, __all__
)
