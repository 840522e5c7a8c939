"""What the request head may be, on every route: at most :data:`MAX_HEAD_BYTES` and
:data:`MAX_HEADERS` fields (h11's own 16 KiB limit holds only for a head that arrives in
pieces: one read of up to 256 KiB was taken whole), each header the service reads one
value of (:data:`SINGLE`: the key, the encoding, ...) once, each query parameter once (a second
``level=`` silently replacing the first gave a careless client a wrong, empty page; the
log reads' list parameters are left to their routes: ``_params``), and
``HEAD`` answered on every ``GET`` route as its ``GET`` without the body (RFC 9110: load
balancers and monitors probe with it)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request

from .._http_errors import ApiError, error_response
from .._params import REPEATABLE, REPEATABLE_UNDER
from ._base import Middleware

#: Bytes of the request target and header fields together.
MAX_HEAD_BYTES = 16 * 1024
#: Header fields in one request.
MAX_HEADERS = 100
_CLOSE = {"Connection": "close"}
#: Headers the service reads one value of: a second one (another key, another encoding)
#: would be silently ignored, so it is refused.
SINGLE = frozenset({b"x-api-key", b"authorization", b"content-encoding", b"content-type",
                    b"idempotency-key"})  # fmt: skip


def head_error(scope: dict[str, Any]) -> ApiError | None:
    """The refusal of a request head past a limit, else None."""
    headers = scope.get("headers") or ()
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    once: set[bytes] = set()
    for k, v in headers:
        size += len(k) + len(v) + 4
        if k in SINGLE:
            if k in once:
                return ApiError(400, "Bad request",
                                f"The header {k.decode()} is given more than once; give it "
                                "once.")  # fmt: skip
            once.add(k)
    if len(headers) > MAX_HEADERS or size > MAX_HEAD_BYTES:
        return ApiError(431, "Request header fields too large",
                        f"The request head holds {len(headers)} header fields and {size} bytes; "
                        f"at most {MAX_HEADERS} fields and {MAX_HEAD_BYTES} bytes.",
                        headers=_CLOSE)  # fmt: skip
    query = scope.get("query_string") or b""
    if b"&" in query or b";" in query:
        seen: set[str] = set()
        path = scope.get("path") or ""
        # A list parameter (level=a&level=b) of a log read: its route decides (KnownQuery).
        lists = (
            REPEATABLE
            if path == REPEATABLE_UNDER or path.startswith(REPEATABLE_UNDER + "/")
            else ()
        )
        for name, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if name in seen and name not in lists:
                return ApiError(400, "Bad request",
                                f"The query parameter {name[:100]!r} is given more than once; "
                                "give each parameter once.")  # fmt: skip
            seen.add(name)
    return None


class RequestHead(Middleware):
    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        error = head_error(scope)
        if error is not None:
            await error_response(Request(scope), error)(scope, receive, send)
            return
        if scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return
        # A copy: the server's own scope keeps HEAD, so it sends the head without the body.
        inner = {**scope, "method": "GET"}
        try:
            await self.app(inner, receive, send)
        finally:
            if "route" in inner:  # for the metrics' route label (Observe, outside)
                scope["route"] = inner["route"]
