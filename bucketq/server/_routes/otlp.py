"""OTLP/HTTP ``POST /v1/logs`` and ``/v1/traces`` (protobuf or JSON, gzip or not), and
LogTide's paths for them, ``/v1/otlp/logs`` and ``/v1/otlp/traces`` (its SDK's exporters
post there).

Answers are in the request's content type: ``Export*ServiceResponse`` (with
``partial_success`` when records were rejected) or a ``google.rpc.Status``.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .. import _otlp
from .._auth import IdempotencyKey, Project
from .._config import ServerConfig
from .._decode import (
    FIELDS_PER_RECORD,
    VALUES_PER_RECORD,
    decompress,
    encoding_of,
    json_document,
    protobuf_budget,
)
from .._http_errors import OTLP_PREFIX, ApiError
from .._records import check_amplification, check_count, encoded, iso
from .._service import Service, Svc

router = APIRouter(tags=["otlp"])

_BINARY = {"schema": {"type": "string", "format": "binary"}}
_EITHER = {_otlp.PROTOBUF: _BINARY, _otlp.JSON: {"schema": {"type": "object"}}}
_BODY = {"requestBody": {"required": True, "content": _EITHER}}
_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "Export(Logs|Trace)ServiceResponse in the request's content type; "
                         "partial_success when records were rejected.", "content": _EITHER},
    **{c: {"description": d + " Body: google.rpc.Status.", "content": _EITHER}
       for c, d in ((400, "Malformed body."), (401, "Missing, unknown or revoked API key."),
                    (413, "Body or record count over the limit."),
                    (422, "A header or parameter is invalid."),
                    (415, "Unsupported Content-Type or Content-Encoding."),
                    (503, "Storage unavailable (retryable, Retry-After)."))},
}  # fmt: skip
_ROUTE: dict[str, Any] = {"responses": _ANSWERS, "openapi_extra": _BODY, "response_class": Response}


async def _export(kind: str, svc: Service, request: Request, project: str,
                  idem: str | None) -> Response:  # fmt: skip
    """Decode within limits, map, check encodability and what would be stored, store;
    a record that cannot be mapped or stored is rejected (``partial_success``), the
    others are stored."""
    cfg = svc.config
    mtype = _otlp.media_type(request.headers.get("content-type"))
    if mtype is None:
        raise ApiError(415, "Unsupported media type",
                       "Send application/x-protobuf or application/json.")  # fmt: skip
    encoding = encoding_of(request.headers.get("content-encoding"))
    body = decompress(await request.body(), encoding, cfg.max_body_bytes)
    records, rejected, why = await svc.offload(len(body), _records, kind, body, mtype,
                                               project, cfg)  # fmt: skip
    route = request.url.path
    if idem:
        await svc.claim_idempotency_key(route, project, idem, hashlib.sha256(body).hexdigest())
    if records:
        await svc.accept("log" if kind == "logs" else "span", project, records, idem, "otlp",
                         route=route)  # fmt: skip
    return Response(_otlp.success(kind, rejected, why, mtype), media_type=mtype)


def _records(kind: str, body: bytes, mtype: str, project: str,
             cfg: ServerConfig) -> tuple[list[dict[str, Any]], int, str]:  # fmt: skip
    """(records, rejected, why) of a decoded body: counted before it is parsed, mapped,
    each record BSON cannot store rejected, what would be stored bounded."""
    try:
        if mtype == _otlp.PROTOBUF:
            fields = FIELDS_PER_RECORD * cfg.max_records
            protobuf_budget(kind, body, max_records=cfg.max_records, max_fields=fields)
            msg = _otlp.parse_protobuf(kind, body)
        else:
            doc = json_document(body, budget=VALUES_PER_RECORD * cfg.max_records)
            check_count(_otlp.json_record_count(kind, doc), cfg.max_records)
            msg = _otlp.from_json(kind, doc)
    except _otlp.OtlpError as exc:
        raise ApiError(exc.status, "Bad request", str(exc)) from None
    mapper = _otlp.log_records if kind == "logs" else _otlp.span_records
    records, rejected, why = mapper(msg, project, datetime.now(UTC), cfg.max_depth)
    check_count(len(records) + rejected, cfg.max_records)
    for r in records:
        for k in ("time", "start_time", "end_time"):
            if isinstance(r.get(k), datetime):
                r[k] = iso(r[k])
    size, bad = encoded(records)
    if bad:
        drop = {i for i, _, _ in bad}
        records = [r for i, r in enumerate(records) if i not in drop]
        rejected += len(bad)
        why = why or f"{bad[0][1] or 'a record'} {bad[0][2]}"
    check_amplification(size, len(body), len(records))
    return records, rejected, why


@router.post(OTLP_PREFIX + "logs", name="otlp_logs", summary="OTLP/HTTP logs export", **_ROUTE)
@router.post(OTLP_PREFIX + "otlp/logs", name="otlp_logs_logtide",
             summary="OTLP/HTTP logs export (LogTide's path)", **_ROUTE)  # fmt: skip
async def otlp_logs(request: Request, svc: Svc, project: Project,
                    idempotency_key: IdempotencyKey = None) -> Response:  # fmt: skip
    return await _export("logs", svc, request, project, idempotency_key)


@router.post(OTLP_PREFIX + "traces", name="otlp_traces", summary="OTLP/HTTP traces export",
             **_ROUTE)  # fmt: skip
@router.post(OTLP_PREFIX + "otlp/traces", name="otlp_traces_logtide",
             summary="OTLP/HTTP traces export (LogTide's path)", **_ROUTE)  # fmt: skip
async def otlp_traces(request: Request, svc: Svc, project: Project,
                      idempotency_key: IdempotencyKey = None) -> Response:  # fmt: skip
    return await _export("traces", svc, request, project, idempotency_key)
