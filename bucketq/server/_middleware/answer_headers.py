"""What every answer of the service carries unless the route said otherwise:
``X-Content-Type-Options: nosniff`` (a browser never takes a JSON error, or a record's
text, for HTML or script), and ``Cache-Control: no-store`` (answers carry a project's
records, a key's verdict, the console's data: no proxy or browser cache may keep them,
whatever the header that carried the key). A route that may be cached says so itself
(the console's stylesheet and script)."""

from __future__ import annotations

from typing import Any

from ._base import Middleware

NOSNIFF = (b"x-content-type-options", b"nosniff")
NO_STORE = (b"cache-control", b"no-store")


class AnswerHeaders(Middleware):
    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or ())
                names = {k.lower() for k, _ in headers}
                if NOSNIFF[0] not in names:
                    headers.append(NOSNIFF)
                if NO_STORE[0] not in names:
                    headers.append(NO_STORE)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
