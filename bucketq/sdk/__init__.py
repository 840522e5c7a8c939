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

What a program calls: :class:`IngestHandler` (a ``logging.Handler``) or :class:`Client`
(``client.log(...)``, the same machinery without the logging module), each taking the
options of ``docs/sdk.md`` as keywords; :func:`close_all` flushes and closes every
handler and client now (the exit hook does it at exit); :func:`replay` re-sends a spill
by hand and returns a :class:`ReplayResult`.
"""

from ._client import Client, IngestHandler
from ._registry import close_all
from ._replay import replay
from ._spill import ReplayResult

__all__ = ["Client", "IngestHandler", "ReplayResult", "close_all", "replay"]
