"""The service's error answers: :class:`ApiError` and the handlers that turn it (and
FastAPI's validation errors) into the documented bodies.

JSON routes answer ``{error, message, request_id, details?}``; OTLP routes answer a
``google.rpc.Status`` in the request's content type, as OTLP/HTTP requires.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ..errors import Overloaded
from . import _otlp
from ._models import ErrorOut

OTLP_PREFIX = "/v1/"


class ApiError(HTTPException):
    """An answer other than 200, with the service's error body."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        *,
        details: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, message, headers)
        self.error = error
        self.message = message
        self.details = details


class BodyTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            "Payload too large",
            f"The body is larger than {limit} bytes (BUCKETQ_MAX_BODY_BYTES).",
        )


def request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id", "")


def error_response(request: Request, exc: ApiError) -> Response:
    rid = request_id(request)
    headers = {**(exc.headers or {}), "X-Request-ID": rid}
    if request.url.path.startswith(OTLP_PREFIX):
        mtype = _otlp.media_type(request.headers.get("content-type")) or _otlp.JSON
        return Response(
            _otlp.status(exc.status_code, exc.message, mtype),
            status_code=exc.status_code,
            media_type=mtype,
            headers=headers,
        )
    body: dict[str, Any] = {"error": exc.error, "message": exc.message, "request_id": rid}
    if exc.details is not None:
        body["details"] = exc.details
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


def _field(loc: tuple[Any, ...]) -> tuple[int | None, str]:
    """(record index, ``logs[3].level``) from a pydantic error location."""
    parts = list(loc[1:]) if loc and loc[0] in ("body", "query", "header", "path") else list(loc)
    index = parts[1] if len(parts) > 1 and isinstance(parts[1], int) else None
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return index, text or "body"


def invalid(errors: list[Any], *, prefix: tuple[Any, ...] = (), stored: bool = True) -> ApiError:
    """The 422 for pydantic ``errors`` (locations under ``prefix``): each named field
    with its record's index; ``stored``: the request was one that stores (not a read)."""
    details = []
    for e in errors[:100]:
        index, field = _field((*prefix, *e.get("loc", ())))
        details.append({"index": index, "field": field, "message": e.get("msg", "invalid")})
    first = details[0] if details else {"field": "body", "message": "invalid"}
    where = f" (record {first['index']})" if first.get("index") is not None else ""
    note = " Nothing of this request was stored." if stored else ""
    return ApiError(
        422,
        "Validation error",
        f"{first['field']}{where}: {first['message']}.{note}",
        details=details,
    )


async def on_validation(request: Request, exc: RequestValidationError) -> Response:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        e = errors[0]
        why = (e.get("ctx") or {}).get("error", "JSON decode error")
        return error_response(
            request, ApiError(400, "Malformed JSON", f"The body is not valid JSON: {why}.")
        )
    return error_response(request, invalid(errors, stored=request.method not in ("GET", "HEAD")))


async def on_overloaded(request: Request, exc: Overloaded) -> Response:
    """Admission control refused the request (``_admission``): 503, or 429 for too many
    lookups of unknown keys, with ``Retry-After``."""
    error = "Too many requests" if exc.status == 429 else "Service unavailable"
    done = "Nothing of this request was stored; r" if request.method != "GET" else "R"
    return error_response(request, ApiError(
        exc.status, error, f"{exc}. {done}etry after the Retry-After delay.",
        headers={"Retry-After": str(max(1, round(exc.retry_after)))}))  # fmt: skip


async def on_body_timeout(request: Request, exc: HTTPException) -> Response:
    return error_response(request, ApiError(
        408, "Request timeout", f"{exc.detail} Nothing was stored."))  # fmt: skip


async def on_http(request: Request, exc: HTTPException) -> Response:
    if not isinstance(exc, ApiError):
        exc = ApiError(
            exc.status_code, "HTTP error", str(exc.detail), headers=dict(exc.headers or {})
        )
    return error_response(request, exc)


def documented(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a JSON route's error answers."""
    what = {400: "Malformed body or parameter.", 401: "Missing, unknown or revoked API key.",
            413: "Body or record count over the limit.",
            415: "Unsupported Content-Encoding (send gzip, deflate or none).", 422: "A field is invalid (named, with the record's index).",
            429: "Too many reads of this project at once (BUCKETQ_READS_PER_PROJECT). Retry after Retry-After.",
            503: "Overloaded or storage unavailable; the message says whether some records may be stored. Retry after Retry-After."}  # fmt: skip
    return {c: {"model": ErrorOut, "description": what[c]} for c in codes}
