"""What every middleware of the service shares: it handles one kind of ASGI scope (HTTP
requests, unless it says otherwise) and passes every other scope through untouched."""

from __future__ import annotations

from typing import Any, ClassVar


class Middleware:
    """An ASGI middleware whose :meth:`handle` gets each scope of type :attr:`scope_type`."""

    scope_type: ClassVar[str] = "http"

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != self.scope_type:
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise NotImplementedError
