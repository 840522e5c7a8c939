"""What every middleware of the service shares: it handles HTTP requests and passes every
other scope (lifespan, websocket) through untouched."""

from __future__ import annotations

from typing import Any


class HttpMiddleware:
    """An ASGI middleware whose :meth:`http` handles each HTTP request."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise NotImplementedError
