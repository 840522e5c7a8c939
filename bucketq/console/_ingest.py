"""The ingest page: the buffer's shards, breaker and dead-letter queue, and its replay."""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from ._page import PREFIX, Posted, SignedIn, _svc, pages, render

log = logging.getLogger("bucketq.console")
router = pages()


def _counter(registry: Any, name: str) -> float:
    total = 0.0
    for metric in registry.collect():
        if metric.name == name:
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


async def _ingest_state(svc: Any) -> dict[str, Any]:
    state: dict[str, Any] = {"buffered": svc.buffered, "at": time.time(),
                             "requests": _counter(svc.registry, "bucketq_http_requests")}  # fmt: skip
    if not svc.buffered:
        return state
    res = svc.reservoir
    stats = res.stats()
    state.update({k: stats.get(k) for k in ("state", "transport", "shards", "pending", "breaker",
                                            "breaker_reason", "enqueued", "stored", "dead_lettered",
                                            "retried", "bypassed")})  # fmt: skip
    state["records"] = int(stats.get("enqueued", 0)) + int(stats.get("bypassed", 0))
    in_flight = stats.get("in_flight_by_shard") or {}
    health = res.buffer_health()
    dead = set(health.get("dead_consumers") or [])
    try:
        pend = await res.transport.pending()
        state["dlq"] = await res.dlq_size()
    except Exception as exc:  # noqa: BLE001 - the page shows the transport is not answering
        pend, state["dlq"], state["error"] = (
            {},
            None,
            f"The transport did not answer ({type(exc).__name__}).",
        )
    state["per_shard"] = [
        {"shard": s, "pending": pend.get(s), "consumer": "stopped" if s in dead else "running",
         "breaker": stats.get("breaker"), "in_flight": in_flight.get(s, 0)}
        for s in range(int(stats.get("shards") or 0))
    ]  # fmt: skip
    state["seconds_since_progress"] = health.get("seconds_since_progress")
    return state


@router.get("/ingest")
async def ingest_page(request: Request, op: SignedIn) -> Response:
    return render(request, "ingest.html", op=op, s=await _ingest_state(_svc(request)),
                  done=request.query_params.get("done"))  # fmt: skip


@router.get("/api/ingest")
async def ingest_json(request: Request, op: SignedIn) -> Response:
    return JSONResponse(await _ingest_state(_svc(request)))


@router.post("/ingest/dlq/replay")
async def dlq_replay(request: Request, posted: Posted) -> Response:
    op, data = posted
    svc = _svc(request)
    if not svc.buffered:
        return render(
            request, "denied.html", 400, op=op, message="The buffer is off: there is no DLQ."
        )
    if data.get("confirmed") != "yes":
        return render(request, "confirm.html", op=op, title="Replay the buffer's dead-letter queue",
                      name="", action=f"{PREFIX}/ingest/dlq/replay", ids=[], back=f"{PREFIX}/ingest")  # fmt: skip
    n = await svc.reservoir.dlq_replay()
    log.warning("console: DLQ replay of %d records by operator key %s", n, op.prefix)
    return RedirectResponse(f"{PREFIX}/ingest?{urlencode({'done': f'replayed {n} records'})}",
                            status_code=303)  # fmt: skip
