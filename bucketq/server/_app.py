"""The FastAPI application: ``create_app()`` assembles the routers, the middleware, the
error handlers and the lifespan that opens and closes the :class:`~._service.Service`.

Where things are: ``_routes/`` (JSON ingest, OTLP, query, operations), ``_middleware/``
(one concern each), ``_service`` (storage, reservoir, keys, tee), ``_auth`` (the key's
project), ``_http_errors`` (error answers), ``_records`` (stored records and their
checks), ``_models`` (bodies and schema), ``_otlp`` and ``_query`` (pure mapping).
``bucketq serve`` runs the app with uvicorn.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from .._version import version
from ..errors import Overloaded
from ..reservoir import BufferConfig
from ..reservoir import from_env as buffer_from_env
from ._admission import Admission, AdmissionMetrics, BodyTimeout
from ._config import ServerConfig, from_env
from ._http_errors import on_body_timeout, on_http, on_overloaded, on_validation
from ._middleware import (
    AnswerHeaders,
    BodyLimit,
    HttpMetrics,
    LastResort,
    Observe,
    RequestHead,
    RequestId,
)
from ._routes import ingest, logtide, ops, otlp, query
from ._service import AT_FORCED_EXIT, Service

__all__ = ["AT_FORCED_EXIT", "create_app"]

log = logging.getLogger("bucketq.server")

#: How long a thread holds the interpreter lock before another that waits for it gets it
#: (Python's default is 5 ms). A large body is decoded on a thread (Service.offload), and
#: every answer on the event loop then waits up to this long for the lock, each time it
#: needs it: a shorter interval keeps good traffic's latency beside hostile bodies close
#: to its latency without them.
SWITCH_INTERVAL_S = 0.001

DESCRIPTION = """Log, span and metric ingestion over bucketq's reservoir (MongoDB storage with
an optional buffer). Authenticate with an API key (`bucketq keys create --project NAME`)
in `X-API-Key` or `Authorization: Bearer`; the project always comes from the key.
A 200 means every record was accepted (stored, or held by the buffer's transport);
a 503 or 429 means none was stored, unless its message says some may be (storage failed
or went silent after the records were handed to it): retry after `Retry-After`, and send
an `Idempotency-Key` so a retry is stored once."""


def create_app(
    config: ServerConfig | None = None,
    *,
    buffer_config: BufferConfig | None = None,
    registry: Any = None,
    store: Callable[[], Any] | None = None,
) -> FastAPI:
    """The ingest service as an ASGI app. ``config`` defaults to :func:`from_env` (it
    needs ``mongodb_uri``); ``buffer_config`` to ``RESERVOIR_BUFFER_*``. Storage opens
    in the app's lifespan (uvicorn runs it) and closes with the buffer's graceful stop.
    ``store()``: the embedded store's ``bucketq.supervisor.StoreState`` (``bucketq serve``
    with its embedded store): while it is not up, requests get 503 at once and ``/ready``
    names the state."""
    import prometheus_client as prom

    cfg = config or from_env()
    bcfg = buffer_config or buffer_from_env()
    reg = registry if registry is not None else prom.CollectorRegistry(auto_describe=True)
    admission = AdmissionMetrics(reg)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        svc = Service(cfg, bcfg, reg, admission)
        app.state.svc = svc
        try:
            await svc.open()
        except BaseException:
            await svc.close()
            raise
        # What is loaded and built by now lives as long as the process: out of the
        # collector's sight, a full collection no longer walks it (a pause every request
        # waits out, /health too).
        gc.freeze()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        listen = getattr(app.state, "listen_url", None)
        if listen:
            log.info("bucketq serve listening on %s", listen)
        restore_signals = svc.watch_stop_signals()
        try:
            yield
        finally:
            restore_signals()
            log.info("shutting down: no new requests; stopping the buffer")
            await svc.close()

    app = FastAPI(
        title="bucketq ingest",
        version=version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, on_http)  # type: ignore[arg-type]
    app.add_exception_handler(Overloaded, on_overloaded)  # type: ignore[arg-type]
    app.add_exception_handler(BodyTimeout, on_body_timeout)  # type: ignore[arg-type]
    # add_middleware wraps: the last added is the outermost.
    app.add_middleware(BodyLimit, max_body=cfg.max_body_bytes)
    # Admission control (_admission): inside Observe and RequestId, so its refusals are
    # counted and carry a request id.
    app.state.store = store
    app.add_middleware(Admission, config=cfg, on_refused=admission.refused, store=store)
    app.add_middleware(LastResort)
    # The head's limits and HEAD: inside Observe, so refusals are counted.
    app.add_middleware(RequestHead)
    app.add_middleware(Observe, metrics=HttpMetrics(reg))
    app.add_middleware(RequestId)
    app.add_middleware(AnswerHeaders)
    from ..console import router as console

    for r in (ingest.router, otlp.router, query.router, logtide.router, ops.router, console):
        app.include_router(r)
    _document_bodies(app)
    return app


def _document_bodies(app: FastAPI) -> None:
    """The JSON ingest routes read their bodies themselves (within limits, after the key
    is checked): their body models join the OpenAPI components here (FastAPI's
    "extending OpenAPI" hook), so the served schema documents them as before."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        first = app.openapi_schema is None
        schema = build()
        if first:
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, body in ingest.body_schemas().items():
                schemas.setdefault(name, body)
            schema["components"]["schemas"] = dict(sorted(schemas.items()))
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
