"""The queues pages: every queue's and stream's counts and rate, a queue's items, dead
letters and quarantined buckets, and the actions on what was set aside."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pymongo import timeout as mongo_timeout
from pymongo.errors import PyMongoError
from starlette.convertors import PathConvertor, register_url_convertor

from .._validate import one_line, printable
from ..admin import AsyncInspector
from ..errors import BucketQError
from ._page import (
    ACTION_TIMEOUT,
    PREFIX,
    READ_TIMEOUT,
    Posted,
    SignedIn,
    _sparkline,
    _svc,
    _watch,
    pages,
    render,
    urlpart,
)

log = logging.getLogger("bucketq.console")


class _QueueName(PathConvertor):
    """A queue's name in a route: the rest of the path (it may hold ``/``) and any
    character (a line break too: Starlette's ``path`` takes none)."""

    regex = "(?s:.+)"


register_url_convertor("queue_name", _QueueName())
router = pages()


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
        out.append({**r.to_json(), "rate": vars(watch.rates(r.name)), "spark": _sparkline(rates)})
    return out


@router.get("/queues")
async def queues_page(request: Request, op: SignedIn) -> Response:
    watch = _watch(request)
    if watch.ok is None or not watch.rows:
        await watch.sample()  # the first view: read now rather than show an empty table
    return render(request, "queues.html", op=op, rows=_queue_rows(request), ok=watch.ok)


@router.get("/api/queues")
async def queues_json(request: Request, op: SignedIn) -> Response:
    return JSONResponse({"ok": _watch(request).ok, "queues": _queue_rows(request)})


@router.get("/queues/{name:queue_name}")
async def queue_page(request: Request, op: SignedIn, name: str) -> Response:
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
    "quarantine/purge": "Delete quarantined buckets for good",
}


@router.post("/queues/{name:queue_name}/{kind}/{verb}")
async def queue_action(
    request: Request, name: str, kind: str, verb: str, posted: Posted
) -> Response:
    op, data = posted
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
