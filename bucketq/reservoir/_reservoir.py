"""The :class:`Reservoir` interface: what the ingest API talks to. No I/O here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict


class IngestResult(TypedDict):
    """What every ingest method returns.

    ``errors`` holds one entry per failed record where the engine can say which one:
    ``{"index": <position in the call>, "error": "<why>"}``. A result with
    ``failed > 0`` means those records were NOT stored.
    """

    ingested: int
    failed: int
    errors: list[Any]


#: The :class:`Reservoir` method that stores each record kind.
STORAGE_METHOD = {"log": "ingest", "span": "ingest_spans", "metric": "ingest_metrics"}


class Reservoir:
    """Log, span and metric storage, as the ingest API sees it.

    Contract for implementations:

    - ``ingest(logs)``, ``ingest_spans(spans)``, ``ingest_metrics(metrics)`` store the
      records and return :class:`IngestResult`. They never report a record as ingested
      that is not stored; a record that fails is counted in ``failed`` and, where the
      engine knows which, listed in ``errors`` with its ``index``. They may raise when
      the whole write failed (nothing of that call is then considered stored).
    - ``query(...)`` and ``health()`` read; a buffer passes them through unchanged.
    - ``close()`` releases resources; it must be idempotent.

    Each record is a dict with at least a ``project_id``. It may carry a string ``_id``,
    the record's stable id.

    ``idempotent``: True when the engine stores a record carrying an ``_id`` under that
    id and counts a record whose ``_id`` is already stored as stored (not failed), so
    writing the same record again is a no-op. A buffer then gives every record an
    ``_id`` when it accepts it and keeps it through retries, redeliveries and DLQ
    replays: each record is stored once. An engine that cannot (the default) gets the
    records as they came, and a crash or a retry may store a record twice.
    """

    idempotent: bool = False

    async def ingest(self, logs: Sequence[dict[str, Any]]) -> IngestResult:
        raise NotImplementedError

    async def ingest_spans(self, spans: Sequence[dict[str, Any]]) -> IngestResult:
        raise NotImplementedError

    async def ingest_metrics(self, metrics: Sequence[dict[str, Any]]) -> IngestResult:
        raise NotImplementedError

    async def query(self, kind: str = "log", **filters: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    async def close(self) -> None:
        return None
