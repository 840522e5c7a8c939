"""The FastAPI application: routes, authentication, errors, metrics, lifespan.

Thin shell: validation is the pydantic models', the OTLP mapping ``_otlp``'s, the logs
query ``_query``'s; every handler is "check the key -> one reservoir or storage call ->
answer". ``create_app()`` builds the app; ``bucketq serve`` runs it with uvicorn.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import bson
from fastapi import Depends, FastAPI, Header, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from ..errors import BucketQError
from ..reservoir import BufferConfig, BufferedReservoir, MongoReservoir, wrap_reservoir
from ..reservoir import from_env as buffer_from_env
from . import _otlp, _query
from ._config import DEFAULT_DATABASE, DEFAULT_QUERY_MAX_LIMIT, ServerConfig, from_env
from ._keys import KeyCache
from ._models import (
    Accepted,
    ErrorOut,
    Health,
    Level,
    LogIn,
    LogsIn,
    LogsPage,
    MetricIn,
    MetricsIn,
    SpanIn,
    SpansIn,
    UtcTime,
)

log = logging.getLogger("bucketq.server")

#: Seconds the buffer's stop may take beyond ``RESERVOIR_BUFFER_GRACEFUL_SHUTDOWN_MS``
#: (counting what is left, stopping the transport) before the service gives up on it.
DEFAULT_STOP_MARGIN = 5.0
#: How long ``/ready`` waits for the storage's ping, in seconds.
DEFAULT_READY_TIMEOUT = 2.0
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
OTLP_PREFIX = "/v1/"
JSON_PREFIX = "/api/v1/ingest"


# -- errors --------------------------------------------------------------------------------


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


def _request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id", "")


def _error_response(request: Request, exc: ApiError) -> Response:
    rid = _request_id(request)
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


async def _on_validation(request: Request, exc: RequestValidationError) -> Response:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        e = errors[0]
        why = (e.get("ctx") or {}).get("error", "JSON decode error")
        return _error_response(
            request, ApiError(400, "Malformed JSON", f"The body is not valid JSON: {why}.")
        )
    details = []
    for e in errors[:100]:
        index, field = _field(tuple(e.get("loc", ())))
        details.append({"index": index, "field": field, "message": e.get("msg", "invalid")})
    first = details[0] if details else {"field": "body", "message": "invalid"}
    where = f" (record {first['index']})" if first.get("index") is not None else ""
    return _error_response(
        request,
        ApiError(
            422,
            "Validation error",
            f"{first['field']}{where}: {first['message']}. Nothing of this request was stored.",
            details=details,
        ),
    )


async def _on_http(request: Request, exc: HTTPException) -> Response:
    if not isinstance(exc, ApiError):
        exc = ApiError(
            exc.status_code, "HTTP error", str(exc.detail), headers=dict(exc.headers or {})
        )
    return _error_response(request, exc)


# -- the middleware: request id, body limit, metrics, last-resort errors ----------------------


class _Observe:
    def __init__(self, app: Any, *, max_body: int, metrics: HttpMetrics) -> None:
        self.app = app
        self.max_body = max_body
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        if scope.get("path", "").startswith(JSON_PREFIX):
            # The JSON API reads its body as JSON whatever Content-Type says (curl -d sends
            # a form type): a body that is not JSON is then a 400, not a confusing 422.
            ctype = headers.get(b"content-type", b"")
            if b"json" not in ctype:
                scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope["headers"].append((b"content-type", b"application/json"))
        limit = self.max_body
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        seen = 0

        async def limited_receive() -> Any:
            nonlocal seen
            if declared > limit:
                raise BodyTooLarge(limit)
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
            return message

        status = [500]
        started = [False]

        async def tracking_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
                status[0] = message["status"]
                message.setdefault("headers", [])
                if not any(k.lower() == b"x-request-id" for k, _ in message["headers"]):
                    message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception:
            log.exception("request %s %s %s failed", rid, scope.get("method"), scope.get("path"))
            if not started[0]:
                body = (
                    b'{"error":"Internal error","message":"The service failed on this request; '
                    b'it was logged with this request_id.","request_id":"' + rid.encode() + b'"}'
                )
                await tracking_send({"type": "http.response.start", "status": 500,
                                     "headers": [(b"content-type", b"application/json"),
                                                 (b"content-length", str(len(body)).encode())]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
        finally:
            route = getattr(scope.get("route"), "path", None) or "<unmatched>"
            self.metrics.observe(
                route, scope.get("method", ""), status[0], time.perf_counter() - t0
            )


class HttpMetrics:
    """HTTP request counts and a latency histogram by route, method and status, in
    ``registry``; observing never raises."""

    def __init__(self, registry: Any) -> None:
        import prometheus_client as prom

        labels = ("route", "method", "status")
        self.requests = prom.Counter(
            "bucketq_http_requests", "HTTP requests answered.", labels, registry=registry
        )
        self.latency = prom.Histogram(
            "bucketq_http_request_duration_seconds",
            "Time to answer an HTTP request, in seconds.",
            labels,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        try:
            self.requests.labels(route, method, str(status)).inc()
            self.latency.labels(route, method, str(status)).observe(seconds)
        except Exception:
            log.debug("recording HTTP metrics failed", exc_info=True)


# -- the service state -----------------------------------------------------------------------


class Service:
    """What the routes use: the storage, the (maybe buffered) reservoir, the keys, the tee."""

    def __init__(self, config: ServerConfig, buffer_config: BufferConfig, registry: Any) -> None:
        self.config = config
        self.buffer_config = buffer_config
        self.registry = registry
        self.client: Any = None
        self.db: Any = None
        self.storage: MongoReservoir | None = None
        self.reservoir: Any = None
        self.keys: KeyCache | None = None
        self.tee: Any = None
        #: The buffer's stop ran out of time: ``bucketq serve`` then exits 1 whether or
        #: not the process gets to end by itself before the forced exit.
        self.stop_incomplete = False

    async def open(self) -> Service:
        from pymongo import AsyncMongoClient

        cfg = self.config
        if not cfg.mongodb_uri:
            raise BucketQError(
                "The ingest service needs a MongoDB URI (BUCKETQ_MONGODB_URI); "
                "`bucketq serve` starts the embedded server when none is given."
            )
        self.client = AsyncMongoClient(
            cfg.mongodb_uri,
            serverSelectionTimeoutMS=cfg.mongodb_timeout_ms,
            tz_aware=True,
            appname="bucketq-serve",
        )
        self.db = (
            self.client[cfg.database]
            if cfg.database
            else self.client.get_default_database(DEFAULT_DATABASE)
        )
        self.storage = MongoReservoir(self.db)
        self.reservoir = wrap_reservoir(
            self.storage, self.buffer_config, db=self.db, registry=self.registry
        )
        if isinstance(self.reservoir, BufferedReservoir):
            await self.reservoir.start()
        self.keys = KeyCache(self.db, ttl=cfg.key_cache_ms / 1000)
        if cfg.tee_stream:
            from ..stream import AsyncStreamQueue

            self.tee = AsyncStreamQueue(self.db, cfg.tee_stream)
        log.info(
            "storage: MongoDB database %r; buffer: %s; tee stream: %s",
            self.db.name,
            self.reservoir.transport.name if self.buffered else "off",
            cfg.tee_stream or "off",
        )
        return self

    @property
    def buffered(self) -> bool:
        return isinstance(self.reservoir, BufferedReservoir)

    async def close(self) -> None:
        if self.buffered:
            budget = self.buffer_config.graceful_shutdown_ms / 1000 + DEFAULT_STOP_MARGIN
            try:
                report = await asyncio.wait_for(self.reservoir.stop(), budget)
            except TimeoutError:
                # Storage (or the transport) does not answer: the drain could not end.
                stats = self.reservoir.stats()
                durable = self.reservoir.transport.durable
                log.error(
                    "buffer stop did not finish within %.0f s (storage or transport not answering); "
                    "%d records pending were %s",
                    budget, stats.get("pending", 0),
                    "kept by the transport for the next process" if durable else "lost",
                )  # fmt: skip
                report = None
                self.stop_incomplete = True
                # Tasks the buffer leaves behind may not end while storage is down, and
                # asyncio.run would wait for them forever: exit after a grace period.
                exit_soon(DEFAULT_STOP_MARGIN, 1)
            if report is not None:
                self._log_report(report)
        if self.tee is not None:
            try:
                await asyncio.wait_for(self.tee.close(), DEFAULT_STOP_MARGIN)
            except Exception:
                log.exception("closing the tee stream failed")
        if self.client is not None:
            await self.client.close()

    @staticmethod
    def _log_report(report: dict[str, Any]) -> None:
        # A warning only when something was not stored: a clean stop is routine.
        clean = not (report.get("left") or report.get("lost") or report.get("timed_out"))
        log.log(
            logging.INFO if clean else logging.WARNING,
            "buffer stopped: flushed=%d left=%d kept=%d lost=%d timed_out=%s (%.1f s)",
            report.get("flushed", 0), report.get("left", 0), report.get("kept", 0),
            report.get("lost", 0), report.get("timed_out", False), report.get("seconds", 0.0),
        )  # fmt: skip

    def unavailable(self, message: str) -> ApiError:
        return ApiError(
            503,
            "Service unavailable",
            message + " Nothing was acknowledged; retry after the Retry-After delay.",
            headers={"Retry-After": str(self.config.retry_after_s)},
        )

    async def accept(
        self,
        kind: str,
        project: str,
        records: list[dict[str, Any]],
        idempotency_key: str | None,
        origin: str = "api",
    ) -> int:
        """Hand ``records`` to the reservoir; raise a 503 unless every one was accepted.
        ``origin="otlp"``: a collector batched them already (the buffer does not delay them)."""
        if idempotency_key:
            for i, r in enumerate(records):
                r["_id"] = record_id(project, kind, idempotency_key, i)
        method = {"log": "ingest", "span": "ingest_spans", "metric": "ingest_metrics"}[kind]
        budget = self.config.ingest_timeout_ms / 1000
        try:
            call = getattr(self.reservoir, method)
            aw = call(records, origin=origin) if self.buffered else call(records)
            res = await asyncio.wait_for(aw, budget)
        except TimeoutError as exc:
            log.warning("%d %s records not accepted within %.1f s", len(records), kind, budget)
            raise self.unavailable(
                f"Storage did not accept the records within {budget:g} s (BUCKETQ_INGEST_TIMEOUT_MS)."
            ) from exc
        except Exception as exc:
            log.warning(
                "%d %s records not accepted: %s: %s", len(records), kind, type(exc).__name__, exc
            )
            raise self.unavailable(f"Storage is unavailable ({type(exc).__name__}).") from exc
        failed = int(res.get("failed", 0))
        if failed:
            first = (res.get("errors") or [{}])[0]
            why = first.get("error", "") if isinstance(first, dict) else str(first)
            log.warning("%d of %d %s records not accepted: %s", failed, len(records), kind, why)
            raise self.unavailable(f"{failed} of {len(records)} records were not accepted ({why}).")
        if kind == "log" and self.tee is not None:
            try:
                await asyncio.wait_for(
                    self.tee.push_many([tee_item(project, r) for r in records], durable=True),
                    budget,
                )
            except Exception as exc:
                log.warning(
                    "tee stream %r refused %d records: %s",
                    self.config.tee_stream,
                    len(records),
                    exc,
                )
                raise self.unavailable("The tee stream is unavailable.") from exc
        return len(records)


#: Called before a forced exit (``bucketq serve`` stops its embedded server there).
AT_FORCED_EXIT: list[Any] = []


def exit_soon(delay: float, code: int) -> None:
    """In ``delay`` seconds, unless the process ended by itself, run
    :data:`AT_FORCED_EXIT` and leave with ``code`` (a daemon timer thread)."""

    def force() -> None:
        log.error("the process did not end %.0f s after shutdown; exiting (%d)", delay, code)
        for fn in AT_FORCED_EXIT:
            try:
                fn()
            except Exception:
                log.exception("cleanup before a forced exit failed")
        logging.shutdown()
        os._exit(code)

    t = threading.Timer(delay, force)
    t.daemon = True
    t.start()


def record_id(project: str, kind: str, key: str, index: int) -> str:
    """The stable ``_id`` of record ``index`` of a request sent with ``Idempotency-Key: key``."""
    return hashlib.sha256(f"{project}\x00{kind}\x00{key}\x00{index}".encode()).hexdigest()


def tee_item(project: str, r: dict[str, Any]) -> dict[str, Any]:
    """A log record as ``bucketq pipeline`` reads it (``ts, project, service, level, message``)."""
    item = {"ts": r["time"], "project": project, "service": r["service"], "level": r["level"],
            "message": r["message"]}  # fmt: skip
    for k in ("metadata", "trace_id", "span_id"):
        if r.get(k) is not None:
            item[k] = r[k]
    return item


def _iso(t: datetime) -> str:
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).isoformat()


def _svc(request: Request) -> Service:
    svc: Service = request.app.state.svc
    return svc


# -- authentication -----------------------------------------------------------------------------

_api_key = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="An API key (`bucketq keys create`)."
)
_bearer = HTTPBearer(auto_error=False, description="The same API key as a bearer token.")


async def project_of(
    request: Request,
    api_key: Annotated[str | None, Security(_api_key)] = None,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
) -> str:
    """The project of the presented key; 401 when it is missing, unknown or revoked."""
    key = api_key or (bearer.credentials if bearer is not None else None)
    if not key:
        raise ApiError(
            401, "Unauthorized", "Send an API key in X-API-Key or Authorization: Bearer."
        )
    svc = _svc(request)
    try:
        info = await svc.keys.lookup(key.strip())  # type: ignore[union-attr]
    except Exception as exc:
        raise svc.unavailable("The key store is unavailable.") from exc
    if info is None:
        raise ApiError(401, "Unauthorized", "Unknown API key.")
    if info.revoked:
        raise ApiError(401, "Unauthorized", f"API key {info.prefix}... was revoked.")
    return info.project


Project = Annotated[str, Depends(project_of)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        max_length=200,
        description="Optional: a retried request with the same key is stored once.",
    ),
]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {400: "Malformed body or parameter.", 401: "Missing, unknown or revoked API key.",
            413: "Body or record count over the limit.", 422: "A field is invalid (named, with the record's index).",
            503: "Storage unavailable; nothing was acknowledged. Retry after Retry-After."}  # fmt: skip
    return {c: {"model": ErrorOut, "description": what[c]} for c in codes}


INGEST_ERRORS = _errors(400, 401, 413, 422, 503)


def _check_count(svc: Service, n: int) -> None:
    if n > svc.config.max_records:
        raise ApiError(
            413,
            "Too many records",
            f"{n} records in one request; at most {svc.config.max_records} (BUCKETQ_MAX_RECORDS).",
        )


def unstorable(records: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """(index, field, why) of each record BSON cannot encode (a NUL in a key, a lone
    surrogate in a string, an integer over 64 bits): caught here, before anything is
    queued, instead of failing at storage time."""
    bad = []
    for i, r in enumerate(records):
        try:
            bson.encode(r)
        except Exception as exc:  # noqa: BLE001 - InvalidDocument, UnicodeEncodeError, OverflowError
            field = next((k for k, v in r.items() if not _encodes({k: v})), "")
            bad.append((i, field, f"cannot be stored: {type(exc).__name__}: {exc}"[:300]))
    return bad


def _encodes(doc: dict[str, Any]) -> bool:
    try:
        bson.encode(doc)
        return True
    except Exception:  # noqa: BLE001
        return False


def _check_storable(name: str, records: list[dict[str, Any]]) -> None:
    bad = unstorable(records)
    if bad:
        details = [
            {"index": i, "field": f"{name}[{i}].{f}" if f else f"{name}[{i}]", "message": why}
            for i, f, why in bad[:100]
        ]
        first = details[0]
        raise ApiError(422, "Validation error",
                       f"{first['field']} (record {first['index']}): {first['message']}. "
                       "Nothing of this request was stored.", details=details)  # fmt: skip


def _log_record(project: str, r: LogIn) -> dict[str, Any]:
    rec = {"project_id": project, "time": _iso(r.time), "service": r.service,
           "level": r.level, "message": r.message}  # fmt: skip
    for k in ("metadata", "trace_id", "span_id", "session_id", "hostname"):
        v = getattr(r, k)
        if v is not None:
            rec[k] = v.lower() if k in ("trace_id", "span_id") else v
    return rec


def _span_record(project: str, s: SpanIn) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "project_id": project, "trace_id": s.trace_id.lower(), "span_id": s.span_id.lower(),
        "service": s.service, "name": s.name, "kind": s.kind, "start_time": _iso(s.start_time),
    }  # fmt: skip
    if s.parent_span_id:
        rec["parent_span_id"] = s.parent_span_id.lower()
    if s.end_time is not None:
        rec["end_time"] = _iso(s.end_time)
    if s.status is not None:
        rec["status"] = s.status.model_dump(exclude_none=True)
    if s.attributes is not None:
        rec["attributes"] = s.attributes
    return rec


def _metric_record(project: str, m: MetricIn) -> dict[str, Any]:
    rec = {"project_id": project, "time": _iso(m.time), "service": m.service, "name": m.name,
           "type": m.type, "value": m.value}  # fmt: skip
    if m.labels is not None:
        rec["labels"] = m.labels
    return rec


# -- the app -----------------------------------------------------------------------------------

DESCRIPTION = """Log, span and metric ingestion over bucketq's reservoir (MongoDB storage with
an optional buffer). Authenticate with an API key (`bucketq keys create --project NAME`)
in `X-API-Key` or `Authorization: Bearer`; the project always comes from the key.
A 200 means every record was accepted (stored, or held by the buffer's transport);
a 503 means none was acknowledged (retry after `Retry-After`; send an `Idempotency-Key`
so a retry is stored once)."""


@dataclass(frozen=True)
class _JsonRoute:
    """A JSON ingest route: its record kind, path, OpenAPI summary, name (it makes the
    operationId), body model, the body's list field, and what makes a stored record of
    one item of it."""

    kind: str
    path: str
    summary: str
    name: str
    model: type[Any]
    field: str
    to_record: Callable[[str, Any], dict[str, Any]]

    def handler(self) -> Callable[..., Any]:
        """The count limit, records of the key's project, a BSON check naming the body's
        field, then storage."""

        async def handler(body: Any, request: Request, project: Project,
                          idempotency_key: IdempotencyKey = None) -> Accepted:  # fmt: skip
            items = getattr(body, self.field)
            svc = _svc(request)
            _check_count(svc, len(items))
            records = [self.to_record(project, x) for x in items]
            _check_storable(self.field, records)
            n = await svc.accept(self.kind, project, records, idempotency_key)
            return Accepted(received=n, timestamp=datetime.now(UTC))

        # FastAPI takes the body's model from the annotation: this route's.
        handler.__annotations__["body"] = self.model
        return handler


_JSON_ROUTES = (
    _JsonRoute("log", JSON_PREFIX, "Ingest log records", "ingest", LogsIn, "logs", _log_record),
    _JsonRoute("span", JSON_PREFIX + "/spans", "Ingest spans", "ingest_spans", SpansIn, "spans",
               _span_record),
    _JsonRoute("metric", JSON_PREFIX + "/metrics", "Ingest metric samples", "ingest_metrics",
               MetricsIn, "metrics", _metric_record),
)  # fmt: skip


def create_app(
    config: ServerConfig | None = None,
    *,
    buffer_config: BufferConfig | None = None,
    registry: Any = None,
) -> FastAPI:
    """The ingest service as an ASGI app. ``config`` defaults to :func:`from_env` (it
    needs ``mongodb_uri``); ``buffer_config`` to ``RESERVOIR_BUFFER_*``. Storage opens
    in the app's lifespan (uvicorn runs it) and closes with the buffer's graceful stop."""
    import prometheus_client as prom

    cfg = config or from_env()
    bcfg = buffer_config or buffer_from_env()
    reg = registry if registry is not None else prom.CollectorRegistry(auto_describe=True)
    http_metrics = HttpMetrics(reg)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        svc = Service(cfg, bcfg, reg)
        app.state.svc = svc
        try:
            await svc.open()
        except BaseException:
            await svc.close()
            raise
        listen = getattr(app.state, "listen_url", None)
        if listen:
            log.info("bucketq serve listening on %s", listen)
        try:
            yield
        finally:
            log.info("shutting down: no new requests; stopping the buffer")
            await svc.close()

    app = FastAPI(
        title="bucketq ingest",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.add_exception_handler(RequestValidationError, _on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _on_http)  # type: ignore[arg-type]
    app.add_middleware(_Observe, max_body=cfg.max_body_bytes, metrics=http_metrics)

    for r in _JSON_ROUTES:
        app.post(r.path, name=r.name, response_model=Accepted, responses=INGEST_ERRORS,
                 tags=["ingest"], summary=r.summary)(r.handler())  # fmt: skip

    otlp_body = {
        "requestBody": {
            "required": True,
            "content": {
                _otlp.PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                _otlp.JSON: {"schema": {"type": "object"}},
            },
        }
    }
    otlp_answers: dict[int | str, dict[str, Any]] = {
        200: {"description": "Export(Logs|Trace)ServiceResponse in the request's content type; "
                             "partial_success when records were rejected.",
              "content": {_otlp.PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                          _otlp.JSON: {"schema": {"type": "object"}}}},
        **{c: {"description": d + " Body: google.rpc.Status.",
               "content": {_otlp.PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                           _otlp.JSON: {"schema": {"type": "object"}}}}
           for c, d in ((400, "Malformed body."), (401, "Missing, unknown or revoked API key."),
                        (413, "Body or record count over the limit."),
                        (422, "A header or parameter is invalid."),
                        (415, "Unsupported Content-Type or Content-Encoding."),
                        (503, "Storage unavailable (retryable, Retry-After)."))},
    }  # fmt: skip

    async def otlp(kind: str, request: Request, project: str, idem: str | None) -> Response:
        svc = _svc(request)
        mtype = _otlp.media_type(request.headers.get("content-type"))
        if mtype is None:
            raise ApiError(415, "Unsupported media type",
                           "Send application/x-protobuf or application/json.")  # fmt: skip
        raw = await request.body()
        try:
            body = _otlp.decompress(
                raw, request.headers.get("content-encoding"), cfg.max_body_bytes
            )
            msg = _otlp.decode(kind, body, mtype)
        except OverflowError:
            raise BodyTooLarge(cfg.max_body_bytes) from None
        except _otlp.OtlpError as exc:
            raise ApiError(exc.status, "Bad request", str(exc)) from None
        mapper = _otlp.log_records if kind == "logs" else _otlp.span_records
        records, rejected, why = mapper(msg, project, datetime.now(UTC))
        _check_count(svc, len(records) + rejected)
        for r in records:
            for k in ("time", "start_time", "end_time"):
                if isinstance(r.get(k), datetime):
                    r[k] = _iso(r[k])
        bad = unstorable(records)
        if bad:
            drop = {i for i, _, _ in bad}
            records = [r for i, r in enumerate(records) if i not in drop]
            rejected += len(bad)
            why = why or f"{bad[0][1] or 'a record'} {bad[0][2]}"
        if records:
            await svc.accept("log" if kind == "logs" else "span", project, records, idem, "otlp")
        return Response(_otlp.success(kind, rejected, why, mtype), media_type=mtype)

    def otlp_route(kind: str) -> Callable[..., Any]:
        async def handler(
            request: Request, project: Project, idempotency_key: IdempotencyKey = None
        ) -> Response:
            return await otlp(kind, request, project, idempotency_key)

        return handler

    for kind in ("logs", "traces"):
        app.post(OTLP_PREFIX + kind, name=f"otlp_{kind}", tags=["otlp"],
                 summary=f"OTLP/HTTP {kind} export", responses=otlp_answers,
                 openapi_extra=otlp_body, response_class=Response)(otlp_route(kind))  # fmt: skip

    @app.get("/api/v1/logs", response_model=LogsPage, tags=["query"], summary="Read log records",
             responses=_errors(400, 401, 422, 503))  # fmt: skip
    async def read_logs(
        request: Request,
        project: Project,
        service: Annotated[str | None, Query(max_length=100)] = None,
        level: Level | None = None,
        from_: Annotated[UtcTime | None, Query(alias="from", description="Oldest time (inclusive).")] = None,
        to: Annotated[UtcTime | None, Query(description="Newest time (exclusive).")] = None,
        q: Annotated[str | None, Query(max_length=200, description="Substring of the message (any case).")] = None,
        limit: Annotated[int, Query(ge=1, le=DEFAULT_QUERY_MAX_LIMIT)] = 100,
        cursor: Annotated[str | None, Query(max_length=500, description="next_cursor of the previous page.")] = None,
    ) -> dict[str, Any]:  # fmt: skip
        svc = _svc(request)
        try:
            after = _query.decode_cursor(cursor) if cursor else None
        except _query.CursorError as exc:
            raise ApiError(400, "Bad cursor", str(exc)) from None
        flt = _query.logs_filter(project, service=service, level=level, since=from_, until=to,
                                 q=q, cursor=after)  # fmt: skip
        try:
            docs = await svc.storage.logs.find(flt).sort(_query.SORT).limit(limit + 1).to_list()  # type: ignore[union-attr]
        except Exception as exc:
            log.warning("reading logs failed: %s", exc)
            raise svc.unavailable("Storage is unavailable.") from exc
        page = docs[:limit]
        nxt = _query.encode_cursor(page[-1]) if len(docs) > limit else None
        return {"logs": [_query.log_out(d) for d in page], "next_cursor": nxt}

    @app.get("/health", response_model=Health, tags=["ops"], summary="Alive")
    async def health() -> Health:
        return Health(status="ok")

    @app.get("/ready", response_model=Health, tags=["ops"], summary="Ready to accept records",
             responses={503: {"model": Health, "description": "Storage unreachable or the buffer stalled."}})  # fmt: skip
    async def ready(request: Request) -> Response:
        from pymongo import timeout as mongo_timeout

        svc = _svc(request)
        detail: dict[str, Any] = {}
        ok = True
        try:
            with mongo_timeout(DEFAULT_READY_TIMEOUT):
                await svc.db.command("ping")
            detail["storage"] = "ok"
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            ok = False
            detail["storage"] = f"unreachable: {type(exc).__name__}"
        if svc.buffered:
            bh = svc.reservoir.buffer_health()
            detail["buffer"] = bh
            ok = ok and bh["ok"]
        body = Health(status="ready" if ok else "unavailable", detail=detail)
        return JSONResponse(body.model_dump(mode="json"), status_code=200 if ok else 503)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "Prometheus text format."}})  # fmt: skip
    async def metrics(request: Request) -> Response:
        svc = _svc(request)
        text = (
            svc.reservoir.render_metrics().encode() if svc.buffered else prom.generate_latest(reg)
        )
        return Response(text, media_type=prom.CONTENT_TYPE_LATEST)

    return app
