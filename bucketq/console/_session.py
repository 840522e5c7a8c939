"""Signing in and out of the console: the login page and form, the logout action."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from ..errors import BucketQError
from . import _access as access
from ._page import CROSS_SITE, PREFIX, Posted, _svc, form, pages, render

router = pages()


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
async def logout(posted: Posted) -> Response:
    resp = RedirectResponse(PREFIX + "/login", status_code=303)
    resp.delete_cookie(access.COOKIE, path=PREFIX)
    return resp
