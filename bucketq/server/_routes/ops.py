"""Operations: ``/health`` (alive), ``/ready`` (storage answers, buffer not stalled),
``/metrics`` (Prometheus). No API key."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from .._models import Health
from .._service import Svc

#: How long ``/ready`` waits for the storage's ping, in seconds.
DEFAULT_READY_TIMEOUT = 2.0

router = APIRouter(tags=["ops"])


@router.get("/health", response_model=Health, summary="Alive")
async def health() -> Health:
    return Health(status="ok")


@router.get("/ready", response_model=Health, summary="Ready to accept records",
            responses={503: {"model": Health, "description": "Storage unreachable or the buffer stalled."}})  # fmt: skip
async def ready(svc: Svc, request: Request) -> Response:
    from pymongo import timeout as mongo_timeout

    detail: dict[str, Any] = {}
    ok = True
    store = getattr(request.app.state, "store", None)
    state = store() if store is not None else None
    if state is not None:
        # The embedded store's supervisor says what it does: down is not ready, at once.
        detail["store"] = state.describe()
    if state is not None and not state.up:
        ok = False
        detail["storage"] = f"unreachable: the embedded store is {state.phase}"
    else:
        try:
            # pymongo's deadline, not the event loop's: see the read route.
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


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format."}})  # fmt: skip
async def metrics(svc: Svc) -> Response:
    import prometheus_client as prom

    text = (
        svc.reservoir.render_metrics().encode()
        if svc.buffered
        else prom.generate_latest(svc.registry)
    )
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # `bucketq serve --workers N`: every worker's metrics from prometheus_client's
        # files (this worker's buffer gauges were brought up to date just above).
        from prometheus_client import multiprocess

        every = prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(every)
        for c in svc.shared_collectors:
            every.register(c)
        text = prom.generate_latest(every)
    return Response(text, media_type=prom.CONTENT_TYPE_LATEST)
