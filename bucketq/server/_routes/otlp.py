"""OTLP/HTTP ``POST /v1/logs`` and ``/v1/traces`` (protobuf or JSON, gzip or not).

Answers are in the request's content type: ``Export*ServiceResponse`` (with
``partial_success`` when records were rejected) or a ``google.rpc.Status``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .. import _otlp
from .._auth import IdempotencyKey, Project
from .._http_errors import OTLP_PREFIX, ApiError, BodyTooLarge
from .._records import check_count, iso, unstorable
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
    """Decode, map, check the count and encodability, store; a record that cannot be
    mapped or stored is rejected (``partial_success``), the others are stored."""
    limit = svc.config.max_body_bytes
    mtype = _otlp.media_type(request.headers.get("content-type"))
    if mtype is None:
        raise ApiError(415, "Unsupported media type",
                       "Send application/x-protobuf or application/json.")  # fmt: skip
    raw = await request.body()
    try:
        body = _otlp.decompress(raw, request.headers.get("content-encoding"), limit)
        msg = _otlp.decode(kind, body, mtype)
    except OverflowError:
        raise BodyTooLarge(limit) from None
    except _otlp.OtlpError as exc:
        raise ApiError(exc.status, "Bad request", str(exc)) from None
    mapper = _otlp.log_records if kind == "logs" else _otlp.span_records
    records, rejected, why = mapper(msg, project, datetime.now(UTC))
    check_count(len(records) + rejected, svc.config.max_records)
    for r in records:
        for k in ("time", "start_time", "end_time"):
            if isinstance(r.get(k), datetime):
                r[k] = iso(r[k])
    bad = unstorable(records)
    if bad:
        drop = {i for i, _, _ in bad}
        records = [r for i, r in enumerate(records) if i not in drop]
        rejected += len(bad)
        why = why or f"{bad[0][1] or 'a record'} {bad[0][2]}"
    if records:
        await svc.accept("log" if kind == "logs" else "span", project, records, idem, "otlp")
    return Response(_otlp.success(kind, rejected, why, mtype), media_type=mtype)


@router.post(OTLP_PREFIX + "logs", name="otlp_logs", summary="OTLP/HTTP logs export", **_ROUTE)
async def otlp_logs(request: Request, svc: Svc, project: Project,
                    idempotency_key: IdempotencyKey = None) -> Response:  # fmt: skip
    return await _export("logs", svc, request, project, idempotency_key)


@router.post(OTLP_PREFIX + "traces", name="otlp_traces", summary="OTLP/HTTP traces export",
             **_ROUTE)  # fmt: skip
async def otlp_traces(request: Request, svc: Svc, project: Project,
                      idempotency_key: IdempotencyKey = None) -> Response:  # fmt: skip
    return await _export("traces", svc, request, project, idempotency_key)
