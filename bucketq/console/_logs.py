"""The logs pages: search with a chart of levels and the project's retention, the live
tail, a record's page and a trace's page."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pymongo import timeout as mongo_timeout
from pymongo.errors import PyMongoError

from .._validate import one_line, printable
from ..errors import BucketQError
from ..server import _query
from ..server._keys import KEYS_COLLECTION, OPERATOR
from ..server._models import LEVELS
from ._page import READ_TIMEOUT, SignedIn, _sparkline, _svc, _when, pages, render

log = logging.getLogger("bucketq.console")

#: Records one logs page shows.
PAGE = 50
#: Records one tail poll returns at most, and how far before the newest seen it looks
#: again (records stamped a little earlier than the last one shown still appear).
TAIL_LIMIT = 100
TAIL_SLACK = timedelta(seconds=10)
#: Characters of a message a list of records (and the live tail) shows, and of a service
#: name: a table cell holding a very long word keeps the browser laying the page out for
#: long. The record's own page shows the whole message.
LIST_CHARS = 500
SHOWN_SERVICE = 100
#: A trace's records its page shows at most (oldest first), and the longest trace id.
TRACE_RECORDS = 1000
TRACE_ID_CHARS = 128

router = pages()


async def _projects(svc: Any) -> list[str]:
    col = svc.db.get_collection(KEYS_COLLECTION)
    with mongo_timeout(READ_TIMEOUT):
        names = await col.distinct("project", {"project": {"$ne": OPERATOR}})
    return sorted(str(n) for n in names)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        return t.replace(tzinfo=UTC)
    try:
        return t.astimezone(UTC)
    except OverflowError:
        # Before year 1 or after 9999 once in UTC (0001-01-01T00:00+14:00): the first or
        # last time there is, not a query that fails with "reading the logs failed".
        edge = datetime.min if (t.utcoffset() or timedelta()) > timedelta() else datetime.max
        return edge.replace(tzinfo=UTC)


def _filters(params: Any, projects: list[str]) -> dict[str, Any]:
    level = (params.get("level") or "").lower()
    return {
        "project": params.get("project") or (projects[0] if projects else ""),
        "service": (params.get("service") or "")[:100],
        "level": level if level in LEVELS else "",
        "from": params.get("from") or "",
        "to": params.get("to") or "",
        "q": (params.get("q") or "")[:200],
    }


def _logs_filter(f: dict[str, Any], cursor: Any = None, since: datetime | None = None) -> Any:
    frm = _parse_time(f["from"])
    if since is not None:
        frm = max(frm, since) if frm else since
    return _query.logs_filter(service=f["service"] or None, level=f["level"] or None,
                              since=frm, until=_parse_time(f["to"]), q=f["q"] or None,
                              cursor=cursor)  # fmt: skip


async def _find_logs(svc: Any, project: str, flt: Any, limit: int) -> Any:
    """A page of at most ``limit`` records and :data:`_query.PAGE_BYTES` (the store's)."""
    return await _query.read_page(svc, project, flt, limit, READ_TIMEOUT)


def _out(doc: dict[str, Any]) -> dict[str, Any]:
    out = _query.log_out(doc)
    out["time_text"] = _when(out["time"])
    out["time"] = out["time"].isoformat() if out["time"] else None
    return out


def _row(doc: dict[str, Any]) -> dict[str, Any]:
    """A record as a list shows it (the logs page, the live tail): its message cut to
    :data:`LIST_CHARS` (``cut``, and ``message_chars`` its whole length: the record's own
    page shows it all), its service to :data:`SHOWN_SERVICE`, without its metadata."""
    out = _out(doc)
    out.pop("metadata", None)
    message = out.get("message") or ""
    out["message_chars"] = len(message)
    out["cut"] = len(message) > LIST_CHARS
    if out["cut"]:
        out["message"] = message[:LIST_CHARS]
    if out.get("service"):
        out["service"] = out["service"][:SHOWN_SERVICE]
    return out


@router.get("/logs")
async def logs_page(request: Request, op: SignedIn) -> Response:
    svc = _svc(request)
    error = None
    rows: list[dict[str, Any]] = []
    nxt = None
    projects: list[str] = []
    cursor_text = request.query_params.get("cursor")
    f = _filters(request.query_params, projects)
    try:
        projects = await _projects(svc)
        f = _filters(request.query_params, projects)
        cursor = _query.decode_cursor(cursor_text) if cursor_text else None
        if f["project"]:
            page = await _find_logs(svc, f["project"], _logs_filter(f, cursor), PAGE)
            rows = [_row(d) for d in page.records]
            if page.next_before:
                nxt = urlencode({**f, "cursor": _query.encode_cursor(page.next_before)})
    except _query.CursorError as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - the page says storage failed instead of a 500
        log.warning("console: reading logs failed: %s", printable(exc))
        error = f"Reading the logs failed ({type(exc).__name__}); try again."
    chart, retention = None, None
    if f["project"] and error is None:
        try:
            chart = await _chart(svc, f)
            retention = await _retention(svc, f["project"])
        except Exception as exc:  # noqa: BLE001 - the table stands without its chart
            log.warning("console: reading the aggregation failed: %s", printable(exc))
            chart = {"error": f"Reading the counts failed ({type(exc).__name__})."}
    return render(request, "logs.html", op=op, projects=projects, f=f, rows=rows, next=nxt,
                  levels=LEVELS, error=error, chart=chart, retention=retention,
                  tail_since=(datetime.now(UTC) - TAIL_SLACK).isoformat())  # fmt: skip


# -- the logs page's chart, retention, a trace's page ----------------------------------------

#: Intervals the logs page's chart takes, the shortest that gives at most
#: :data:`CHART_POINTS` of them over the range shown.
CHART_STEPS = (timedelta(minutes=1), timedelta(minutes=5), timedelta(minutes=15),
               timedelta(hours=1), timedelta(hours=6), timedelta(days=1), timedelta(days=7))  # fmt: skip
CHART_POINTS = 120
#: The range the chart shows without ``from``: this long before ``to`` (or now).
CHART_RANGE = timedelta(hours=24)
CHART_W, CHART_H = 800, 120
#: Levels drawn as errors (one red line, drawn over the others).
ERROR_LEVELS = ("error", "fatal", "critical")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CHART_LAST = datetime.max.replace(tzinfo=UTC) - 2 * CHART_STEPS[-1]


def _slot(t: datetime, step: timedelta) -> datetime:
    """The start of ``t``'s interval, as the log store's aggregation counts it."""
    s = step.total_seconds()
    return _EPOCH + timedelta(seconds=((t - _EPOCH).total_seconds() // s) * s)


def _step_text(step: timedelta) -> str:
    m = int(step.total_seconds() // 60)
    return f"{m // 1440} d" if m >= 1440 else f"{m // 60} h" if m >= 60 else f"{m} min"


async def _chart(svc: Any, f: dict[str, Any]) -> dict[str, Any] | None:
    """Records per interval by level for the page's filters (service, level, from, to;
    not the text: summaries do not hold it), from the log store's bucket summaries:
    polylines on one scale, errors one red line over the others."""
    until = _parse_time(f["to"]) or datetime.now(UTC) + timedelta(minutes=1)
    # Room for the intervals' arithmetic at the calendar's end (a `to` of year 9999).
    until = min(until, CHART_LAST)
    since = _parse_time(f["from"]) or until - CHART_RANGE
    if since >= until:
        return None
    step = next((s for s in CHART_STEPS if (until - since) / s <= CHART_POINTS), CHART_STEPS[-1])
    since = max(since, until - step * CHART_POINTS)
    store = svc.storage.logstore
    async with svc.reads.admit(f["project"], READ_TIMEOUT):
        with mongo_timeout(READ_TIMEOUT):
            agg = await store.aggregate(f["project"], since=since, until=until, interval=step,
                                        service=f["service"] or None, top=5)  # fmt: skip
    slots: list[datetime] = []
    t = _slot(since, step)
    while t < until:
        slots.append(t)
        t += step
    counts = dict(agg.series)
    shown = [f["level"]] if f["level"] else sorted(
        {lv for c in counts.values() for lv in c}, key=lambda lv: LEVELS.index(lv) if lv in LEVELS else 99
    )  # fmt: skip
    per: dict[str, list[float]] = {lv: [float(counts.get(t, {}).get(lv, 0)) for t in slots]
                                   for lv in shown if lv not in ERROR_LEVELS}  # fmt: skip
    errs = [lv for lv in shown if lv in ERROR_LEVELS]
    if errs:
        per["errors"] = [float(sum(counts.get(t, {}).get(lv, 0) for lv in errs)) for t in slots]
    top = max((v for vals in per.values() for v in vals), default=0.0) or 1.0
    totals = {lv: sum(int(c.get(lv, 0)) for c in counts.values()) for lv in shown}
    lines = [{"name": name, "points": _sparkline(vals, CHART_W, CHART_H, (0.0, top))}
             for name, vals in per.items() if name != "errors"]  # fmt: skip
    if "errors" in per:  # last: drawn over the others
        lines.append(
            {"name": "errors", "points": _sparkline(per["errors"], CHART_W, CHART_H, (0.0, top))}
        )
    return {
        "lines": lines,
        "totals": totals,
        "errors": sum(totals.get(lv, 0) for lv in ERROR_LEVELS),
        "total": sum(totals.values()),
        "step": _step_text(step),
        "peak": int(top),
        "since": _when(since),
        "until": _when(until),
        "complete": agg.complete,
        "w": CHART_W,
        "h": CHART_H,
    }


async def _retention(svc: Any, project: str) -> dict[str, Any]:
    """How long ``project``'s records are kept: its own setting or the default."""
    from ..server._keys import PROJECTS_COLLECTION

    with mongo_timeout(READ_TIMEOUT):
        doc = await svc.db.get_collection(PROJECTS_COLLECTION).find_one({"_id": project})
    own = doc.get("retention_days") if doc else None
    days = own if isinstance(own, int) else svc.config.retention_days
    return {"days": days, "own": isinstance(own, int)}


@router.get("/traces/{trace_id}")
async def trace_page(request: Request, op: SignedIn, trace_id: str) -> Response:
    """A trace's records on one page, oldest first (at most :data:`TRACE_RECORDS`)."""
    from ..server._records import text_id

    svc = _svc(request)
    project = (request.query_params.get("project") or "")[:200]
    tid = text_id(trace_id[:TRACE_ID_CHARS])
    try:
        async with svc.reads.admit(project, READ_TIMEOUT):
            with mongo_timeout(READ_TIMEOUT):
                docs = await svc.storage.logstore.trace(project, tid, limit=TRACE_RECORDS)
    except (PyMongoError, BucketQError) as exc:
        return render(request, "denied.html", 503, op=op,
                      message=f"Reading the trace failed: {one_line(exc)}")  # fmt: skip
    rows = [_row(d) for d in docs]
    span = None
    if len(rows) > 1 and docs[0].get("time") and docs[-1].get("time"):
        span = (docs[-1]["time"] - docs[0]["time"]).total_seconds()
    return render(request, "trace.html", op=op, rows=rows, trace_id=tid, project=project,
                  span=span, cut=len(rows) >= TRACE_RECORDS)  # fmt: skip


@router.get("/api/tail")
async def tail(request: Request, op: SignedIn) -> Response:
    svc = _svc(request)
    f = _filters(request.query_params, [])
    since = _parse_time(request.query_params.get("since")) or datetime.now(UTC) - TAIL_SLACK
    if not f["project"]:
        return JSONResponse({"logs": [], "since": since.isoformat()})
    try:
        docs = (
            await _find_logs(svc, f["project"], _logs_filter(f, since=since), TAIL_LIMIT)
        ).records
    except Exception as exc:  # noqa: BLE001 - the tail shows the failure and polls on
        return JSONResponse({"error": f"Reading the logs failed ({type(exc).__name__})."},
                            status_code=503, headers={"Retry-After": "2"})  # fmt: skip
    rows = [_row(d) for d in docs]
    newest = max((d["time"] for d in docs), default=None)
    nxt_since = (newest.replace(tzinfo=newest.tzinfo or UTC) - TAIL_SLACK) if newest else since
    return JSONResponse({"logs": rows, "since": max(nxt_since, since).isoformat()})


@router.get("/logs/{rid}")
async def log_detail(request: Request, op: SignedIn, rid: str) -> Response:
    svc = _svc(request)
    project = (request.query_params.get("project") or "")[:200]
    try:
        async with svc.reads.admit(project, READ_TIMEOUT):
            with mongo_timeout(READ_TIMEOUT):
                doc = await svc.storage.logstore.record(project or None, rid[:200])
    except (PyMongoError, BucketQError) as exc:
        return render(
            request,
            "denied.html",
            503,
            op=op,
            message=f"Reading the record failed: {one_line(exc)}",
        )
    if doc is None:
        return render(request, "denied.html", 404, op=op, message=f"No log record {rid!r}.")
    import json

    rec = _out(doc)
    extra = {k: doc.get(k) for k in ("project_id", "session_id", "hostname") if doc.get(k)}
    rec["project"] = doc.get("project_id") or project
    meta = json.dumps(doc.get("metadata"), indent=2, default=str) if doc.get("metadata") else None
    return render(request, "log.html", op=op, rec=rec, extra=extra, meta=meta)
