"""``GET /api/v1/logs``: one page of the key's project's log records, newest first, by
cursor (``next_cursor``) or by ``offset`` (LogTide's paging), with their ``total``."""

from __future__ import annotations

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
from .._models import Level, LogsPage, ServiceName, UtcTime
from .._params import MAX_VALUES, KnownQuery
from .._service import Svc

log = logging.getLogger("bucketq.server")

router = APIRouter(tags=["query"])


@router.get("/api/v1/logs", response_model=LogsPage, summary="Read log records",
            responses=documented(400, 401, 422, 429, 503), dependencies=[KnownQuery])  # fmt: skip
async def read_logs(
    svc: Svc,
    project: Project,
    service: Annotated[list[ServiceName] | None, Query(max_length=MAX_VALUES, description=(
        f"A service, or up to {MAX_VALUES} (`service=a&service=b`): records of any of them."))] = None,
    level: Annotated[list[Level] | None, Query(max_length=MAX_VALUES, description=(
        "A level, or several (`level=error&level=critical`): records of any of them."))] = None,
    from_: Annotated[UtcTime | None, Query(alias="from", description="Oldest time (inclusive).")] = None,
    to: Annotated[UtcTime | None, Query(description="Newest time (exclusive).")] = None,
    q: Annotated[str | None, Query(max_length=200, description="Substring of the message (any case).")] = None,
    limit: Annotated[int, Query(ge=1, le=DEFAULT_QUERY_MAX_LIMIT)] = 100,
    offset: Annotated[int, Query(ge=0, le=_query.MAX_OFFSET, description=(
        "Records to skip (LogTide's paging); `offset + limit` at most "
        f"{_query.MAX_OFFSET}: past it, go on with `cursor`."))] = 0,
    cursor: Annotated[str | None, Query(max_length=500, description="next_cursor of the previous page.")] = None,
) -> Response:  # fmt: skip
    if offset + limit > _query.MAX_OFFSET:
        raise ApiError(400, "Bad request", f"offset + limit is {offset + limit}; offset paging "
                       f"reaches {_query.MAX_OFFSET} records at most: go on with the page's "
                       "next_cursor as `cursor` (offset 0).")  # fmt: skip
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
        records, next_before, total = await _query.read_offset_page(
            svc, project, flt, limit, offset, budget
        )
    except Overloaded:
        raise
    except Exception as exc:
        log.warning("reading logs failed: %s: %s", type(exc).__name__, exc)
        raise svc.unavailable(
            f"Storage did not answer the read within {budget:g} s (BUCKETQ_READ_TIMEOUT_MS)."
        ) from exc
    nxt = _query.encode_cursor(next_before) if next_before else None
    # Rendered here, not by the response model: stored data (written by any client of
    # the database) must not make a read fail; log_out made every value JSON.
    body = {"logs": [_query.shown(d, project) for d in records], "next_cursor": nxt,
            "total": total.count, "total_exact": total.exact, "limit": limit,
            "offset": offset, "nextCursor": nxt}  # fmt: skip
    return Response(_query.render(body), media_type="application/json")
