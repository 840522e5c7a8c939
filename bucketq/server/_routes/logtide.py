"""LogTide's read routes beside ``GET /api/v1/logs``, answered as LogTide answers them
(its names: ``timeseries``, ``by_level``, ``top_services``...): a trace's records, the
aggregation (from bucket summaries: nothing unpacked), the top services and errors, and
the live stream as Server-Sent Events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from ...errors import Overloaded
from ...reservoir import LogAggregate, LogFilter, log_sort_key
from .. import _query
from .._admission import ABORT, remaining
from .._auth import Project, StreamProject
from .._http_errors import ApiError, documented, on_overloaded
from .._models import TEXT_ID_CHARS, Level, UtcTime
from .._params import KnownQuery
from .._records import text_id
from .._service import Service, Svc

log = logging.getLogger("bucketq.server")

router = APIRouter(tags=["query"], dependencies=[KnownQuery])

#: LogTide's aggregation intervals.
INTERVALS = {"1m": timedelta(minutes=1), "5m": timedelta(minutes=5),
             "1h": timedelta(hours=1), "1d": timedelta(days=1)}  # fmt: skip
#: Intervals one aggregation may span at most (a year of hours).
MAX_INTERVALS = 9000
#: Records of one trace answered at most, oldest first.
TRACE_RECORDS = 1000
#: Seconds between a live stream's reads of new records (LogTide polls every second).
STREAM_POLL_S = 1.0
#: Records one poll of a live stream sends at most (the newest of them).
STREAM_BATCH = 100


async def _read(svc: Service, project: str, what: str, fn: Any) -> Any:
    """``fn()`` as one of ``project``'s reads under the read deadline (503 when storage
    does not answer within it)."""
    from pymongo import timeout as mongo_timeout

    budget = remaining(svc.config.read_timeout_ms / 1000)
    try:
        async with svc.reads.admit(project, budget):
            with mongo_timeout(budget):
                return await fn()
    except Overloaded:
        raise
    except Exception as exc:
        log.warning("reading %s failed: %s: %s", what, type(exc).__name__, exc)
        raise svc.unavailable(
            f"Storage did not answer the read within {budget:g} s (BUCKETQ_READ_TIMEOUT_MS)."
        ) from exc


def _json(body: dict[str, Any]) -> Response:
    return Response(_query.render(body), media_type="application/json")


@router.get("/api/v1/logs/trace/{trace_id}", summary="A trace's log records (LogTide)",
            responses=documented(400, 401, 422, 429, 503))  # fmt: skip
async def trace_logs(
    svc: Svc,
    project: Project,
    trace_id: Annotated[str, Path(min_length=1, max_length=TEXT_ID_CHARS)],
) -> Response:
    """The records of a trace, oldest first (at most 1000): ``{"logs": [...]}``."""
    tid = text_id(trace_id)
    store = svc.storage.logstore  # type: ignore[union-attr]
    recs = await _read(svc, project, "a trace",
                       lambda: store.trace(project, tid, limit=TRACE_RECORDS))  # fmt: skip
    return _json({"logs": [_query.shown(d, project) for d in recs]})


async def _aggregate(
    svc: Service, project: str, since: datetime, until: datetime, interval: timedelta,
    service: str | None = None, top: int = 10,
) -> LogAggregate:  # fmt: skip
    if until <= since:
        raise ApiError(400, "Bad request", "`to` must be after `from`.")
    if (until - since) / interval > MAX_INTERVALS:
        raise ApiError(400, "Bad request", f"from..to spans more than {MAX_INTERVALS} "
                       "intervals; take a longer interval or a shorter range.")  # fmt: skip
    store = svc.storage.logstore  # type: ignore[union-attr]
    agg: LogAggregate = await _read(svc, project, "an aggregation", lambda: store.aggregate(
        project, since=since, until=until, interval=interval, service=service, top=top))  # fmt: skip
    return agg


def _coverage(agg: LogAggregate) -> dict[str, Any]:
    """What bucketq adds: whether the figures cover the whole range."""
    cov = agg.covered_from
    return {"complete": agg.complete, "covered_from": cov.isoformat() if cov else None}


@router.get("/api/v1/logs/aggregated", summary="Records per interval by level (LogTide)",
            responses=documented(400, 401, 422, 429, 503))  # fmt: skip
async def aggregated(
    svc: Svc,
    project: Project,
    from_: Annotated[UtcTime, Query(alias="from")],
    to: UtcTime,
    interval: Literal["1m", "5m", "1h", "1d"] = "1h",
    service: Annotated[str | None, Query(max_length=100)] = None,
) -> Response:
    """``timeseries`` (``bucket``, ``total``, ``by_level``), ``top_services`` and
    ``top_errors``, from bucket summaries; a bucket's records count in the interval of its
    newest record. ``complete`` false: the read stopped at its budget, the figures cover
    ``covered_from`` to ``to``."""
    agg = await _aggregate(svc, project, from_, to, INTERVALS[interval], service)
    series = [{"bucket": t.isoformat(), "total": sum(c.values()), "by_level": c}
              for t, c in agg.series]  # fmt: skip
    return _json({
        "timeseries": series,
        "top_services": [{"service": s, "count": n} for s, n in agg.services],
        "top_errors": [{"message": m, "count": n} for m, n in agg.errors],
        **_coverage(agg),
    })  # fmt: skip


def _range(from_: datetime | None, to: datetime | None) -> tuple[datetime, datetime]:
    until = to or datetime.now(UTC) + timedelta(days=1)
    return from_ or until - timedelta(days=MAX_INTERVALS - 1), until


@router.get("/api/v1/logs/top-services", summary="Services by records (LogTide)",
            responses=documented(400, 401, 422, 429, 503))  # fmt: skip
async def top_services(
    svc: Svc,
    project: Project,
    limit: Annotated[int, Query(ge=1, le=50)] = 5,
    from_: Annotated[UtcTime | None, Query(alias="from")] = None,
    to: UtcTime | None = None,
) -> Response:
    since, until = _range(from_, to)
    agg = await _aggregate(svc, project, since, until, INTERVALS["1d"], top=limit)
    return _json({"services": [{"service": s, "count": n} for s, n in agg.services],
                  **_coverage(agg)})  # fmt: skip


@router.get("/api/v1/logs/top-errors", summary="Error messages by records (LogTide)",
            responses=documented(400, 401, 422, 429, 503))  # fmt: skip
async def top_errors(
    svc: Svc,
    project: Project,
    limit: Annotated[int, Query(ge=1, le=50)] = 10,
    from_: Annotated[UtcTime | None, Query(alias="from")] = None,
    to: UtcTime | None = None,
) -> Response:
    since, until = _range(from_, to)
    agg = await _aggregate(svc, project, since, until, INTERVALS["1d"], top=limit)
    return _json({"errors": [{"message": m, "count": n} for m, n in agg.errors],
                  **_coverage(agg)})  # fmt: skip


# -- the live stream ----------------------------------------------------------------------


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + _query.render(body) + b"\n\n"


async def _new_records(
    svc: Service, project: str, flt: LogFilter, seen: set[str]
) -> list[dict[str, Any]]:
    """Records ``flt`` keeps not sent yet (``seen``: the ids sent at its ``since``), oldest
    first, the newest :data:`STREAM_BATCH` of them. A poll that finds the project's reads
    busy or storage slow sends nothing this time."""
    from pymongo import timeout as mongo_timeout

    budget = svc.config.read_timeout_ms / 1000
    try:
        async with svc.reads.admit(project, budget):
            with mongo_timeout(budget):
                page = await svc.storage.logstore.page(  # type: ignore[union-attr]
                    project, flt, limit=STREAM_BATCH, max_bytes=_query.PAGE_BYTES
                )
    except Overloaded:
        return []
    except Exception as exc:  # noqa: BLE001 - the next poll tries again
        log.info("a live stream's read failed: %s: %s", type(exc).__name__, exc)
        return []
    return [r for r in reversed(page.records) if str(r.get("_id")) not in seen]


async def _events(
    svc: Service, project: str, service: str | None, level: str | None
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    now = datetime.now(UTC)
    yield _event({"type": "connected", "timestamp": now.isoformat()})
    flt = _query.logs_filter(service=service, level=level, since=now)
    seen: set[str] = set()
    beat = svc.config.stream_heartbeat_ms / 1000
    quiet_since = loop.time()
    while not svc.stopping:  # the server stops: the stream ends (readers reconnect)
        await asyncio.sleep(STREAM_POLL_S)
        recs = await _new_records(svc, project, flt, seen)
        if recs:
            out = b"".join(_event({"type": "log", "data": _query.shown(r, project)}) for r in recs)
            newest = log_sort_key(recs[-1])[0]
            if newest > (flt.since or newest):
                seen = set()
            seen.update(str(r.get("_id")) for r in recs if log_sort_key(r)[0] == newest)
            flt = replace(flt, since=newest)
            quiet_since = loop.time()
            yield out
        elif loop.time() - quiet_since >= beat:
            quiet_since = loop.time()
            yield b": heartbeat\n\n"


class EventStream(Response):
    """Server-Sent Events from an async iterator of chunks, holding one of the service's
    stream places (:class:`~.._admission.StreamSlots`) from its start to its end: taken
    when the response starts (refused there, 429 or 503), given back however it ends; a
    response never started holds none. A chunk the reader does not take within
    ``BUCKETQ_STREAM_SEND_TIMEOUT_MS`` drops the connection: nothing is kept for a slow
    reader beyond the connection's own buffer."""

    media_type = "text/event-stream"

    def __init__(self, svc: Service, project: str, chunks: AsyncIterator[bytes]) -> None:
        super().__init__()
        # No Content-Length: the body goes on for as long as the stream is open.
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]  # fmt: skip
        self.svc = svc
        self.project = project
        self.chunks = chunks

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            self.svc.streams.take(self.project)
        except Overloaded as exc:
            await self.chunks.aclose()  # type: ignore[attr-defined]
            refused = await on_overloaded(Request(scope), exc)
            await refused(scope, receive, send)
            return
        try:
            await self._serve(scope, receive, send)
        finally:
            self.svc.streams.give_back(self.project)

    async def _serve(self, scope: Any, receive: Any, send: Any) -> None:
        timeout = self.svc.config.stream_send_timeout_ms / 1000

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        async def pump() -> None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.raw_headers})  # fmt: skip
            async for chunk in self.chunks:
                try:
                    async with asyncio.timeout(timeout):
                        await send({"type": "http.response.body", "body": chunk,
                                    "more_body": True})  # fmt: skip
                except TimeoutError:
                    log.info("a live stream's reader took nothing for %g s "
                             "(BUCKETQ_STREAM_SEND_TIMEOUT_MS): connection dropped", timeout)  # fmt: skip
                    abort = (scope.get("extensions") or {}).get(ABORT)
                    if abort is not None:
                        abort()
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        # The reader's leaving ends the stream at once (not at its next event): its place
        # among the streams open is free for the next one.
        tasks = {asyncio.create_task(watch()), asyncio.create_task(pump())}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.chunks.aclose()  # type: ignore[attr-defined]


@router.get("/api/v1/logs/stream", summary="Live log records as Server-Sent Events (LogTide)",
            response_class=Response,
            responses={200: {"description": "Server-Sent Events.",
                             "content": {"text/event-stream": {}}},
                       **documented(400, 401, 422, 429, 503)})  # fmt: skip
async def stream(
    svc: Svc,
    project: StreamProject,
    service: Annotated[str | None, Query(max_length=100)] = None,
    level: Level | None = None,
) -> Response:
    """``data: {"type": "connected", ...}``, then ``data: {"type": "log", "data": record}``
    for each new record (by its time, from the stream's start), and a ``: heartbeat``
    comment when nothing went out for ``BUCKETQ_STREAM_HEARTBEAT_MS``. The key may be
    given as ``token`` (on this route only)."""
    return EventStream(svc, project, _events(svc, project, service, level))
