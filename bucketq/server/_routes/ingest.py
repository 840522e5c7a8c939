"""``POST /api/v1/ingest`` (logs), ``/spans`` and ``/metrics``: the LogTide-shaped JSON API.

The key is checked first (a dependency), then :func:`_ingest` reads the body within its
limits (``_decode``: encoding, size, record count and nesting as it decodes), validates
the records with the body's model, builds the stored records, checks that BSON can
store them and how much they would store, and makes one reservoir call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

from .._auth import IdempotencyKey, Project
from .._config import ServerConfig
from .._decode import (
    VALUES_PER_RECORD,
    check_depth,
    decompress,
    encoding_of,
    few_values,
    json_records,
    too_many,
)
from .._http_errors import documented, invalid
from .._models import Accepted, LogsIn, MetricsIn, SpansIn
from .._records import check_storable, log_record, metric_record, span_record
from .._service import Service, Svc

PREFIX = "/api/v1/ingest"

router = APIRouter(tags=["ingest"])


@dataclass(frozen=True)
class _Body:
    """One route's body: the record kind, the body's model and list field, and what
    makes a stored record of one validated item."""

    kind: str
    model: type[BaseModel]
    field: str
    to_record: Callable[[str, Any], dict[str, Any]]
    #: The item's free-form fields (their nesting is limited).
    free: tuple[str, ...]

    def openapi(self) -> dict[str, Any]:
        """The route's documented request body (the body is read by :func:`_ingest`)."""
        ref = {"$ref": f"#/components/schemas/{self.model.__name__}"}
        return {"requestBody": {"content": {"application/json": {"schema": ref}}, "required": True}}


_LOGS = _Body("log", LogsIn, "logs", log_record, ("metadata",))
_SPANS = _Body("span", SpansIn, "spans", span_record, ("attributes",))
_METRICS = _Body("metric", MetricsIn, "metrics", metric_record, ())
_ROUTE: dict[str, Any] = {"response_model": Accepted,
                          "responses": documented(400, 401, 413, 415, 422, 503)}  # fmt: skip


def body_schemas() -> dict[str, Any]:
    """The JSON schemas of the bodies, for the OpenAPI document's components."""
    _, top = models_json_schema(
        [(b.model, "validation") for b in (_LOGS, _SPANS, _METRICS)],
        ref_template="#/components/schemas/{model}",
    )
    schemas: dict[str, Any] = top.get("$defs", {})
    return schemas


async def _ingest(request: Request, svc: Service, project: str, idem: str | None,
                  body: _Body) -> Accepted:  # fmt: skip
    cfg = svc.config
    encoding = encoding_of(request.headers.get("content-encoding"))
    raw = decompress(await request.body(), encoding, cfg.max_body_bytes)
    records = await svc.offload(len(raw), _records, raw, body, project, cfg)
    route = request.url.path
    if idem:
        await svc.claim_idempotency_key(route, project, idem, hashlib.sha256(raw).hexdigest())
    n = await svc.accept(body.kind, project, records, idem, route=route)
    return Accepted(received=n, timestamp=datetime.now(UTC))


def _records(raw: bytes, body: _Body, project: str, cfg: ServerConfig) -> list[dict[str, Any]]:
    """The stored records of a decoded body: within the limits, valid, storable."""
    items = _fast(raw, body, cfg)
    fast = items is not None
    if items is None:
        items = _checked(raw, body, cfg)
    records = [body.to_record(project, x) for x in items]
    if not (fast and _surely_storable(raw)):
        check_storable(body.field, records, len(raw))
    return records


#: Every digit to "0", every other byte to " ": a run of 19 zeros is a run of digits an
#: integer over 64 bits would need (anywhere: a string's digits too). Two C passes; a
#: regular expression took ten times as long.
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_DIGITS = b"0" * 19


def _surely_storable(raw: bytes) -> bool:
    """Whether BSON surely stores every record of a body that passed :func:`_fast`: only
    a NUL in a key (``\\u0000``) or an integer over 64 bits could fail (pydantic's parser
    refused lone surrogates, :func:`_fast` NaN), and nothing the records add to the body
    can make them much larger than it. Then the records are encoded once, by the insert."""
    return b"\\u0000" not in raw and _LONG_DIGITS not in raw.translate(_DIGITS)


def _fast(raw: bytes, body: _Body, cfg: ServerConfig) -> list[Any] | None:
    """The validated items of a body that surely holds few values and no NaN or
    Infinity, decoded and validated in one pass (pydantic's JSON parser); None when
    that is not sure, or the body is refused: :func:`_checked` then says why."""
    if b"NaN" in raw or b"Infinity" in raw:  # pydantic's parser would take them
        return None
    if not few_values(raw, VALUES_PER_RECORD * cfg.max_records):
        return None
    try:
        items: list[Any] = getattr(body.model.model_validate_json(raw), body.field)
    except ValidationError:
        return None
    if len(items) > cfg.max_records:
        raise too_many(cfg.max_records)
    for name in body.free:
        for i, item in enumerate(items):
            check_depth(getattr(item, name), cfg.max_depth, body.field, i, name)
    return items


def _checked(raw: bytes, body: _Body, cfg: ServerConfig) -> list[Any]:
    """The validated items of a body, every limit checked as it is decoded (counted
    first, then the C decoder), each refusal named: 400, 413 or 422."""
    items = json_records(raw, body.field, max_records=cfg.max_records, max_depth=cfg.max_depth)
    try:
        parsed = body.model.model_validate({} if items is None else {body.field: items})
    except ValidationError as exc:
        raise invalid(exc.errors(include_url=False)) from None
    result: list[Any] = getattr(parsed, body.field)
    return result


@router.post(PREFIX, name="ingest", summary="Ingest log records",
             openapi_extra=_LOGS.openapi(), **_ROUTE)  # fmt: skip
async def ingest(request: Request, svc: Svc, project: Project,
                 idempotency_key: IdempotencyKey = None) -> Accepted:  # fmt: skip
    return await _ingest(request, svc, project, idempotency_key, _LOGS)


@router.post(PREFIX + "/spans", name="ingest_spans", summary="Ingest spans",
             openapi_extra=_SPANS.openapi(), **_ROUTE)  # fmt: skip
async def ingest_spans(request: Request, svc: Svc, project: Project,
                       idempotency_key: IdempotencyKey = None) -> Accepted:  # fmt: skip
    return await _ingest(request, svc, project, idempotency_key, _SPANS)


@router.post(PREFIX + "/metrics", name="ingest_metrics", summary="Ingest metric samples",
             openapi_extra=_METRICS.openapi(), **_ROUTE)  # fmt: skip
async def ingest_metrics(request: Request, svc: Svc, project: Project,
                         idempotency_key: IdempotencyKey = None) -> Accepted:  # fmt: skip
    return await _ingest(request, svc, project, idempotency_key, _METRICS)
