"""What every console page shares: rendering a template, the signed-in operator and a
POST's checked form as FastAPI dependencies, and the route class that answers a refusal.

A dependency that refuses raises :class:`Refused` with the answer to give (the login
page, a 401/403/503 page or JSON); the console's route class returns it, so a page's
function only runs for an operator whose key (and, for an action, CSRF token) is right.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute

from ..admin.watch import QueueWatch
from ..errors import BucketQError
from . import _access as access

PREFIX = "/console"
#: Longest a console read may take before the page says storage is slow.
READ_TIMEOUT = 5.0
#: Longest an action (requeue, delete) may take; what it did by then stays done.
ACTION_TIMEOUT = 30.0
#: Largest form body an action reads.
MAX_FORM = 64 * 1024
CROSS_SITE = "A form sent from another site is refused: open the console itself and try again."


class Refused(Exception):
    """What a route answers instead of its page, raised by a dependency."""

    def __init__(self, answer: Response) -> None:
        super().__init__(answer.status_code)
        self.answer = answer


class _Route(APIRoute):
    """A console route: a :class:`Refused` raised while it runs is its answer."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Refused as refused:
                return refused.answer

        return route


def pages() -> APIRouter:
    """A router for one page's routes under :data:`PREFIX` (its own: a route's path is
    what the metrics label it by)."""
    return APIRouter(prefix=PREFIX, include_in_schema=False, route_class=_Route)


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


def _sparkline(
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


async def operator(request: Request) -> access.Operator:
    """The operator; anyone else is refused (login page, 401/403/503)."""
    try:
        op = await access.check_key(_svc(request), access.presented_key(request))
    except access.Denied as d:
        headers = {"Retry-After": str(max(1, round(d.retry_after)))} if d.retry_after else None
        if _wants_json(request) or request.method != "GET":
            raise Refused(JSONResponse({"error": DENIED[d.status], "message": d.message},
                                       status_code=d.status, headers=headers)) from None  # fmt: skip
        if d.status == 401 and not request.cookies.get(access.COOKIE):
            there = urlencode({"next": quote(request.url.path)})
            raise Refused(RedirectResponse(f"{PREFIX}/login?{there}", status_code=303)) from None
        raise Refused(render(request, "denied.html", d.status, message=d.message, op=None,
                             headers=headers)) from None  # fmt: skip
    _watch(request).viewed()
    return op


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


async def action(request: Request) -> tuple[access.Operator, dict[str, str]]:
    """The operator and form of a POST whose CSRF token is right; else refused."""
    if access.cross_site(request):
        raise Refused(render(request, "denied.html", 403, op=None, message=CROSS_SITE))
    op = await operator(request)
    try:
        data = await form(request)
    except BucketQError as exc:
        raise Refused(JSONResponse({"error": "Payload too large", "message": str(exc)},
                                   status_code=413)) from None  # fmt: skip
    given = data.get(access.CSRF_FIELD) or request.headers.get(access.CSRF_HEADER)
    if not access.csrf_ok(op, given):
        raise Refused(render(request, "denied.html", 403, op=op,
                             message="The form's CSRF token is missing or wrong: reload the page and try again."))  # fmt: skip
    return op, data


#: A page's parameter for the signed-in operator.
SignedIn = Annotated[access.Operator, Depends(operator)]
#: An action's parameter: the operator and the form of a POST whose CSRF token is right.
Posted = Annotated[tuple[access.Operator, dict[str, str]], Depends(action)]
