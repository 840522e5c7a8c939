"""The body limit: a request whose ``Content-Length`` or received bytes pass
``max_body`` fails with 413 when the route reads its body, before it is buffered."""

from __future__ import annotations

from typing import Any

from .._http_errors import BodyTooLarge
from ._base import Middleware


class BodyLimit(Middleware):
    def __init__(self, app: Any, *, max_body: int) -> None:
        super().__init__(app)
        self.max_body = max_body

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        limit = self.max_body
        try:
            declared = int(dict(scope.get("headers") or []).get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        seen = 0

        async def limited_receive() -> Any:
            nonlocal seen
            if declared > limit:
                raise BodyTooLarge(limit)
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)
