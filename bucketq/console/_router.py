"""The console's routes under ``/console``: logs, queues and streams, ingest.

Pages are rendered on the server from ``templates/`` (Jinja2); ``static/`` holds the
stylesheet and the little JavaScript (the live tail, the charts' refresh, confirmations
are server pages). Every route checks the operator (``_access``); every action is a POST
with the CSRF token and asks for confirmation on a page of its own first.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pymongo import timeout as mongo_timeout
from pymongo.errors import PyMongoError
from starlette.convertors import PathConvertor, register_url_convertor

from .._validate import one_line, printable
from ..admin import AsyncInspector
from ..admin.watch import QueueWatch, parse_watch
from ..errors import BucketQError
from ..server import _query
from ..server._keys import KEYS_COLLECTION, OPERATOR
from ..server._models import LEVELS
from . import _access as access

log = logging.getLogger("bucketq.console")

PREFIX = "/console"
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
#: Longest a console read may take before the page says storage is slow.
READ_TIMEOUT = 5.0
#: Longest an action (requeue, delete) may take; what it did by then stays done.
ACTION_TIMEOUT = 30.0
#: Largest form body an action reads.
MAX_FORM = 64 * 1024
CROSS_SITE = "A form sent from another site is refused: open the console itself and try again."
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """After the service opened (the app's own lifespan runs first): the queue watch and
    its metrics in the service's registry."""
    from ..metrics import QueueCollector

    svc = app.state.svc
    watch = QueueWatch(svc.db, parse_watch(svc.config.watch_queues)).start()
    objects = [svc.tee] if svc.tee is not None else []
    collector = QueueCollector(snapshot=watch.metric_rows, objects=objects)
    svc.registry.register(collector)
    svc.shared_collectors.append(collector)
    app.state.console = watch
    try:
        yield
    finally:
        svc.shared_collectors.remove(collector)
        svc.registry.unregister(collector)
        await watch.stop()


class _QueueName(PathConvertor):
    """A queue's name in a route: the rest of the path (it may hold ``/``) and any
    character (a line break too: Starlette's ``path`` takes none)."""

    regex = "(?s:.+)"


register_url_convertor("queue_name", _QueueName())
router = APIRouter(prefix=PREFIX, include_in_schema=False, lifespan=lifespan)


def _templates() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("bucketq.console", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["urlpart"] = urlpart
    env.filters["count"] = "{:,}".format
    return env


def urlpart(name: Any) -> str:
    """``name`` as one segment of a URL path: a queue named ``q with space?x#y`` or
    ``q/slash`` is one segment too (the routes take the rest of the path as the name)."""
    return quote(str(name), safe="")


_ENV: Any = None


def render(request: Request, template: str, status: int = 200, *,
           headers: dict[str, str] | None = None, **ctx: Any) -> HTMLResponse:  # fmt: skip
    global _ENV
    if _ENV is None:
        _ENV = _templates()
    html = _ENV.get_template(template).render(prefix=PREFIX, path=request.url.path, **ctx)
    return HTMLResponse(html, status_code=status, headers={
        **(headers or {}), "Cache-Control": "no-store",
        "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                   "style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin"})  # fmt: skip


def _when(t: Any) -> str:
    if not isinstance(t, datetime):
        return "-" if t is None else str(t)
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _svc(request: Request) -> Any:
    return request.app.state.svc


def _watch(request: Request) -> QueueWatch:
    watch: QueueWatch = request.app.state.console
    return watch


#: The ``error`` of a refusal's JSON body, by status.
DENIED = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 429: "Too many requests",
          503: "Service unavailable"}  # fmt: skip


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith(PREFIX + "/api/")


async def operator(request: Request) -> access.Operator | Response:
    """The operator, or the answer to give instead (login page, 401/403/503)."""
    try:
        op = await access.check_key(_svc(request), access.presented_key(request))
    except access.Denied as d:
        headers = {"Retry-After": str(max(1, round(d.retry_after)))} if d.retry_after else None
        if _wants_json(request) or request.method != "GET":
            return JSONResponse({"error": DENIED[d.status], "message": d.message},
                                status_code=d.status, headers=headers)  # fmt: skip
        if d.status == 401 and not request.cookies.get(access.COOKIE):
            there = urlencode({"next": quote(request.url.path)})
            return RedirectResponse(f"{PREFIX}/login?{there}", status_code=303)
        return render(request, "denied.html", d.status, message=d.message, op=None,
                      headers=headers)  # fmt: skip
    _watch(request).viewed()
    return op


def signed_in(page: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """A page for a signed-in operator, called as ``page(request, op, **params)``; anyone
    else gets :func:`operator`'s answer. The route FastAPI sees has ``page``'s parameters
    but ``op``."""
    sig = inspect.signature(page, eval_str=True)

    @functools.wraps(page)
    async def route(request: Request, **params: Any) -> Response:
        op = await operator(request)
        if isinstance(op, Response):
            return op
        return await page(request, op, **params)

    route.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p for name, p in sig.parameters.items() if name != "op"]
    )
    return route


async def form(request: Request) -> dict[str, str]:
    """A urlencoded form body of at most :data:`MAX_FORM` bytes (read no further)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise BucketQError(f"The form is larger than {MAX_FORM} bytes.")
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in fields.items()} | {
        k + "[]": ",".join(v) for k, v in fields.items() if len(v) > 1
    }


async def action(request: Request) -> tuple[access.Operator, dict[str, str]] | Response:
    """The operator and form of a POST whose CSRF token is right, or the refusal."""
    if access.cross_site(request):
        return render(request, "denied.html", 403, op=None, message=CROSS_SITE)
    op = await operator(request)
    if isinstance(op, Response):
        return op
    try:
        data = await form(request)
    except BucketQError as exc:
        return JSONResponse({"error": "Payload too large", "message": str(exc)}, status_code=413)
    given = data.get(access.CSRF_FIELD) or request.headers.get(access.CSRF_HEADER)
    if not access.csrf_ok(op, given):
        return render(request, "denied.html", 403, op=op,
                      message="The form's CSRF token is missing or wrong: reload the page and try again.")  # fmt: skip
    return op, data


# -- sign in -----------------------------------------------------------------------------------


@router.get("/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC:
        return Response(status_code=404)
    body = resources.files("bucketq.console").joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "max-age=300"})


@router.get("/login")
async def login_page(request: Request, next: str = PREFIX + "/logs") -> Response:
    return render(request, "login.html", op=None, next=_safe_next(next), error=None)


def _safe_next(target: str) -> str:
    return target if target.startswith(PREFIX + "/") and "//" not in target else PREFIX + "/logs"


@router.post("/login")
async def login(request: Request) -> Response:
    if access.cross_site(request):
        return render(request, "denied.html", 403, op=None, message=CROSS_SITE)
    try:
        data = await form(request)
    except BucketQError as exc:
        return render(request, "login.html", 413, op=None, next=PREFIX, error=str(exc))
    key = (data.get("key") or "").strip()
    nxt = _safe_next(data.get("next") or "")
    try:
        await access.check_key(_svc(request), key)
    except access.Denied as d:
        retry = {"Retry-After": str(max(1, round(d.retry_after)))} if d.retry_after else None
        return render(request, "login.html", d.status, headers=retry, op=None, next=nxt,
                      error=d.message)  # fmt: skip
    resp = RedirectResponse(nxt, status_code=303)
    resp.set_cookie(access.COOKIE, key, httponly=True, samesite="strict", path=PREFIX,
                    secure=request.url.scheme == "https")  # fmt: skip
    return resp


@router.post("/logout")
async def logout(request: Request) -> Response:
    got = await action(request)
    if isinstance(got, Response):
        return got
    resp = RedirectResponse(PREFIX + "/login", status_code=303)
    resp.delete_cookie(access.COOKIE, path=PREFIX)
    return resp


@router.get("")
@router.get("/")
async def home() -> Response:
    return RedirectResponse(PREFIX + "/logs", status_code=303)


# -- logs --------------------------------------------------------------------------------------


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
@signed_in
async def logs_page(request: Request, op: access.Operator) -> Response:
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
    lines = [{"name": name, "points": _spark(vals, CHART_W, CHART_H, (0.0, top))}
             for name, vals in per.items() if name != "errors"]  # fmt: skip
    if "errors" in per:  # last: drawn over the others
        lines.append(
            {"name": "errors", "points": _spark(per["errors"], CHART_W, CHART_H, (0.0, top))}
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
@signed_in
async def trace_page(request: Request, op: access.Operator, trace_id: str) -> Response:
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
@signed_in
async def tail(request: Request, op: access.Operator) -> Response:
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
@signed_in
async def log_detail(request: Request, op: access.Operator, rid: str) -> Response:
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


# -- queues ------------------------------------------------------------------------------------


def _spark(
    vals: list[float], w: int = 120, h: int = 28, scale: tuple[float, float] | None = None
) -> str:
    """An SVG polyline's points for ``vals`` (empty with fewer than two); ``scale``: the
    (low, high) of a chart whose lines share it, else ``vals``' own (and 0)."""
    if len(vals) < 2:
        return ""
    lo, hi = scale or (min(0.0, *vals), max(0.0, *vals))
    span = (hi - lo) or 1
    step = w / (len(vals) - 1)
    return " ".join(
        f"{i * step:.1f},{h - 2 - (v - lo) / span * (h - 4):.1f}" for i, v in enumerate(vals)
    )


def rate_series(samples: list[Any]) -> list[float]:
    """The change of a queue's items per second between consecutive samples."""
    return [
        round((b.total - a.total) / (b.t - a.t), 2) if b.t > a.t else 0.0
        for a, b in zip(samples, samples[1:], strict=False)
    ]


def _queue_rows(request: Request) -> list[dict[str, Any]]:
    watch = _watch(request)
    out = []
    for r in sorted(watch.rows.values(), key=lambda r: r.name):
        rates = rate_series(list(watch.history.get(r.name, ())))
        out.append({**r.to_json(), "rate": vars(watch.rates(r.name)), "spark": _spark(rates)})
    return out


@router.get("/queues")
@signed_in
async def queues_page(request: Request, op: access.Operator) -> Response:
    watch = _watch(request)
    if watch.ok is None or not watch.rows:
        await watch.sample()  # the first view: read now rather than show an empty table
    return render(request, "queues.html", op=op, rows=_queue_rows(request), ok=watch.ok)


@router.get("/api/queues")
@signed_in
async def queues_json(request: Request, op: access.Operator) -> Response:
    return JSONResponse({"ok": _watch(request).ok, "queues": _queue_rows(request)})


@router.get("/queues/{name:queue_name}")
@signed_in
async def queue_page(request: Request, op: access.Operator, name: str) -> Response:
    svc = _svc(request)
    ins = AsyncInspector(svc.db)
    try:
        with mongo_timeout(READ_TIMEOUT):
            stream = await ins.is_stream(name)
            items = await ins.peek(name, 20)
            dead = [] if stream else await ins.dead(name, 100)
            quarantined = await _quarantined(svc.db, name)
        error = None
    except (BucketQError, PyMongoError) as exc:
        items, dead, quarantined, stream, error = [], [], [], False, one_line(exc)
    return render(request, "queue.html", op=op, name=name, stream=stream, items=items,
                  dead=dead, quarantined=quarantined, error=error,
                  done=request.query_params.get("done"))  # fmt: skip


async def _quarantined(db: Any, name: str) -> list[dict[str, Any]]:
    from ..bucket.codec import collection
    from ..bucket.damage import quarantine_name, summary

    col = collection(db, quarantine_name(name))
    return [summary(r) async for r in col.find({}).sort("at", 1).limit(100)]


ACTIONS = {
    "dead/requeue": "Requeue dead letters",
    "dead/purge": "Delete dead letters for good",
    "quarantine/requeue": "Requeue what can be recovered of quarantined buckets",
    "quarantine/remove": "Delete quarantined buckets for good",
}


@router.post("/queues/{name:queue_name}/{kind}/{verb}")
async def queue_action(request: Request, name: str, kind: str, verb: str) -> Response:
    got = await action(request)
    if isinstance(got, Response):
        return got
    op, data = got
    what = f"{kind}/{verb}"
    if what not in ACTIONS:
        return Response(status_code=404)
    ids = [i for i in (data.get("ids[]") or data.get("ids") or "").split(",") if i]
    if data.get("confirmed") != "yes":
        here = f"{PREFIX}/queues/{urlpart(name)}"
        return render(request, "confirm.html", op=op, title=ACTIONS[what], name=name,
                      action=f"{here}/{what}", ids=ids, back=here)  # fmt: skip
    svc = _svc(request)
    try:
        with mongo_timeout(ACTION_TIMEOUT):
            done = await _act(svc.db, name, what, ids or None)
    except (BucketQError, PyMongoError) as exc:
        return render(request, "denied.html", 400, op=op, message=one_line(exc))
    log.warning("console: %s on %s by operator key %s: %s", what, printable(name), op.prefix, done)
    await _watch(request).sample()
    return RedirectResponse(f"{PREFIX}/queues/{urlpart(name)}?{urlencode({'done': done})}",
                            status_code=303)  # fmt: skip


async def _act(db: Any, name: str, what: str, ids: list[str] | None) -> str:
    ins = AsyncInspector(db)
    if what == "dead/requeue":
        rep = await ins.requeue_dead(name, ids)
        return f"requeued {rep['items']} dead letters" + _busy(rep)
    if what == "dead/purge":
        rep = await ins.purge_dead(name, ids)
        return f"deleted {rep['items']} dead letters" + _busy(rep)
    from ..queue import AsyncQueue
    from ..stream import AsyncStreamQueue

    stream = await ins.is_stream(name)
    q: Any = (AsyncStreamQueue if stream else AsyncQueue)(db, name)
    try:
        one = ids[0] if ids else None
        if what == "quarantine/requeue":
            r = await q.requeue_quarantined(one)
            return f"requeued {r['items']} items of {r['buckets']} quarantined buckets ({r['lost']} lost)"
        return f"removed {await q.remove_quarantined(one)} quarantined buckets"
    finally:
        await q.close()


def _busy(rep: dict[str, int]) -> str:
    more = ""
    if rep.get("busy"):
        more += f"; {rep['busy']} buckets skipped (a consumer of the dead-letter queue holds them)"
    if rep.get("missing"):
        more += f"; {rep['missing']} not found"
    return more


# -- ingest ------------------------------------------------------------------------------------


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
@signed_in
async def ingest_page(request: Request, op: access.Operator) -> Response:
    return render(request, "ingest.html", op=op, s=await _ingest_state(_svc(request)),
                  done=request.query_params.get("done"))  # fmt: skip


@router.get("/api/ingest")
@signed_in
async def ingest_json(request: Request, op: access.Operator) -> Response:
    return JSONResponse(await _ingest_state(_svc(request)))


@router.post("/ingest/dlq/replay")
async def dlq_replay(request: Request) -> Response:
    got = await action(request)
    if isinstance(got, Response):
        return got
    op, data = got
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
