"""``POST /api/v1/ingest`` (logs), ``/spans`` and ``/metrics``: the LogTide-shaped JSON API.

Each route is "the count limit -> records of the key's project -> a BSON check naming
the body's field -> one reservoir call -> answer", in :func:`_ingest`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter

from .._auth import IdempotencyKey, Project
from .._http_errors import documented
from .._models import Accepted, LogsIn, MetricsIn, SpansIn
from .._records import check_count, check_storable, log_record, metric_record, span_record
from .._service import Service, Svc

PREFIX = "/api/v1/ingest"

router = APIRouter(tags=["ingest"])
_ROUTE: dict[str, Any] = {
    "response_model": Accepted,
    "responses": documented(400, 401, 413, 422, 503),
}


async def _ingest(svc: Service, kind: str, field: str, project: str, items: Sequence[Any],
                  to_record: Callable[[str, Any], dict[str, Any]], idem: str | None) -> Accepted:  # fmt: skip
    check_count(len(items), svc.config.max_records)
    records = [to_record(project, x) for x in items]
    check_storable(field, records)
    n = await svc.accept(kind, project, records, idem)
    return Accepted(received=n, timestamp=datetime.now(UTC))


@router.post(PREFIX, name="ingest", summary="Ingest log records", **_ROUTE)
async def ingest(body: LogsIn, svc: Svc, project: Project,
                 idempotency_key: IdempotencyKey = None) -> Accepted:  # fmt: skip
    return await _ingest(svc, "log", "logs", project, body.logs, log_record, idempotency_key)


@router.post(PREFIX + "/spans", name="ingest_spans", summary="Ingest spans", **_ROUTE)
async def ingest_spans(body: SpansIn, svc: Svc, project: Project,
                       idempotency_key: IdempotencyKey = None) -> Accepted:  # fmt: skip
    return await _ingest(svc, "span", "spans", project, body.spans, span_record, idempotency_key)


@router.post(PREFIX + "/metrics", name="ingest_metrics", summary="Ingest metric samples", **_ROUTE)
async def ingest_metrics(body: MetricsIn, svc: Svc, project: Project,
                         idempotency_key: IdempotencyKey = None) -> Accepted:  # fmt: skip
    return await _ingest(svc, "metric", "metrics", project, body.metrics, metric_record,
                         idempotency_key)  # fmt: skip
