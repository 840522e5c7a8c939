"""``GET /api/v1/logs``: one page of the key's project's log records, newest first."""

from __future__ import annotations

import json
import logging
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from ...errors import Overloaded
from .. import _query
from .._admission import remaining
from .._auth import Project
from .._config import DEFAULT_QUERY_MAX_LIMIT
from .._http_errors import ApiError, documented
from .._models import Level, LogsPage, UtcTime
from .._params import KnownQuery
from .._service import Svc

log = logging.getLogger("bucketq.server")

router = APIRouter(tags=["query"])


@router.get("/api/v1/logs", response_model=LogsPage, summary="Read log records",
            responses=documented(400, 401, 422, 429, 503), dependencies=[KnownQuery])  # fmt: skip
async def read_logs(
    svc: Svc,
    project: Project,
    service: Annotated[str | None, Query(max_length=100)] = None,
    level: Level | None = None,
    from_: Annotated[UtcTime | None, Query(alias="from", description="Oldest time (inclusive).")] = None,
    to: Annotated[UtcTime | None, Query(description="Newest time (exclusive).")] = None,
    q: Annotated[str | None, Query(max_length=200, description="Substring of the message (any case).")] = None,
    limit: Annotated[int, Query(ge=1, le=DEFAULT_QUERY_MAX_LIMIT)] = 100,
    cursor: Annotated[str | None, Query(max_length=500, description="next_cursor of the previous page.")] = None,
) -> Response:  # fmt: skip
    try:
        after = _query.decode_cursor(cursor) if cursor else None
    except _query.CursorError as exc:
        raise ApiError(400, "Bad cursor", str(exc)) from None
    flt = _query.logs_filter(service=service, level=level, since=from_, until=to, q=q, cursor=after)
    budget = remaining(svc.config.read_timeout_ms / 1000)  # BUCKETQ_READ_TIMEOUT_MS
    try:
        # pymongo's deadline (the server gives up on the query too), not the event loop's:
        # cancelling the driver mid-reply (asyncio.wait_for) left its connections wedged,
        # and every later read, ingest and /ready failed until a restart.
        page = await _query.read_page(svc, project, flt, limit, budget)
    except Overloaded:
        raise
    except Exception as exc:
        log.warning("reading logs failed: %s: %s", type(exc).__name__, exc)
        raise svc.unavailable(
            f"Storage did not answer the read within {budget:g} s (BUCKETQ_READ_TIMEOUT_MS)."
        ) from exc
    nxt = _query.encode_cursor(page.next_before) if page.next_before else None
    logs = [_query.log_out(d) for d in page.records]
    # Rendered here, not by the response model: stored data (written by any client of
    # the database) must not make a read fail; log_out made every value JSON.
    for rec in logs:
        rec["time"] = rec["time"].isoformat() if rec["time"] is not None else None
    body = {"logs": logs, "next_cursor": nxt}
    try:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate stored by another writer
        text = json.dumps(body, separators=(",", ":")).encode()
    return Response(text, media_type="application/json")
