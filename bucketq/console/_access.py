"""Who may use the console: an operator key (``bucketq keys create --operator``, or
``BUCKETQ_OPERATOR_KEY``), checked on every page and action.

The login form puts the key in an HttpOnly, SameSite=Strict cookie scoped to
``/console``; a script may send it in ``X-API-Key`` or ``Authorization: Bearer`` instead.
Each request looks the key up again (through the service's key cache: a revoked key
stops working within ``BUCKETQ_KEY_CACHE_MS``). A project's key gets 403.

Actions are POSTs that carry a CSRF token: an HMAC of a fixed label under the key's
SHA-256, so every worker process computes the same token without shared state, and a
page from another origin, which cannot read the HttpOnly cookie, cannot compute it.
Every POST, the login included (which has no token yet: a forged login would sign the
victim in as the attacker), is also refused when the browser says it comes from another
site (:func:`cross_site`).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request

from ..errors import Overloaded
from ..server._auth import KeyConflict, one_key

COOKIE = "bq_console"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
_LABEL = b"bucketq console csrf v1"


@dataclass(frozen=True, slots=True)
class Operator:
    """The operator of a request: which key (its shown prefix) and its CSRF token."""

    prefix: str
    csrf: str


class Denied(Exception):
    """The request may not use the console: ``status`` 400 (two different keys), 401 (no
    or bad key), 403 (not an operator's), 429 (too many lookups of keys not seen before:
    retry after ``retry_after`` seconds) or 503 (the key store does not answer)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


def csrf_token(key: str) -> str:
    return hmac.new(hashlib.sha256(key.encode()).digest(), _LABEL, hashlib.sha256).hexdigest()


def presented_key(request: Request) -> str | None:
    """The key of ``X-API-Key`` or ``Authorization: Bearer`` (the API's rule: two
    different ones are refused, :class:`Denied` 400), else the sign-in cookie's."""
    auth = request.headers.get("authorization", "")
    bearer = auth[7:] if auth[:7].lower() == "bearer " else None
    try:
        key = one_key(request.headers.get("x-api-key"), bearer)
    except KeyConflict as exc:
        raise Denied(400, str(exc)) from None
    if not key:
        key = (request.cookies.get(COOKIE) or "").strip()
    return key or None


async def check_key(svc: Any, key: str | None) -> Operator:
    """The operator behind ``key``; raises :class:`Denied`."""
    if not key:
        raise Denied(401, "Sign in with an operator key (bucketq keys create --operator).")
    configured = svc.config.operator_key
    if configured and hmac.compare_digest(key.encode(), configured.encode()):
        return Operator("BUCKETQ_OPERATOR_KEY", csrf_token(key))
    try:
        info = await svc.keys.lookup(key)
    except Overloaded as exc:  # shed: no lookup was made, the store is fine
        raise Denied(429, f"{exc}; try again after {max(1, round(exc.retry_after))} s.",
                     exc.retry_after) from exc  # fmt: skip
    except Exception as exc:  # the key store is down: say so, as the API does
        raise Denied(503, "The key store is unavailable; try again shortly.", 2) from exc
    if info is None:
        raise Denied(401, "Unknown key.")
    if info.revoked:
        raise Denied(401, f"Key {info.prefix}... was revoked.")
    if not info.operator:
        raise Denied(
            403,
            f"Key {info.prefix}... belongs to project {info.project!r}: the console needs an "
            "operator key (bucketq keys create --operator).",
        )
    return Operator(info.prefix, csrf_token(key))


def cross_site(request: Request) -> bool:
    """Whether a browser sent ``request`` from a page of another site. ``Sec-Fetch-Site``
    decides where the browser sends it (every current one); else an ``Origin`` whose host
    is not the request's ``Host``. Scripts send neither and are not refused."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc != request.headers.get("host", "")


def csrf_ok(op: Operator, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(op.csrf.encode(), str(given).encode())
