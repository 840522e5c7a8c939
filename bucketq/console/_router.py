"""The console's routes under ``/console``: logs, queues and streams, ingest.

Pages are rendered on the server from ``templates/`` (Jinja2); ``static/`` holds the
stylesheet and the little JavaScript (the live tail, the charts' refresh, confirmations
are server pages). Every route checks the operator (``_access``); every action is a POST
with the CSRF token and asks for confirmation on a page of its own first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse, Response

from ..admin.watch import QueueWatch, parse_watch
from . import _ingest, _logs, _queues, _session
from ._page import PREFIX, pages

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


router = APIRouter(include_in_schema=False, lifespan=lifespan)
here = pages()


@here.get("/static/{name}")
async def static(name: str) -> Response:
    if name not in STATIC:
        return Response(status_code=404)
    body = resources.files("bucketq.console").joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "max-age=300"})


@here.get("")
@here.get("/")
async def home() -> Response:
    return RedirectResponse(PREFIX + "/logs", status_code=303)


for page in (here, _session.router, _logs.router, _queues.router, _ingest.router):
    router.include_router(page)
