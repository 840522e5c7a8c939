"""An exception no handler answered becomes a JSON 500 carrying the request id, logged
with its traceback under that id (instead of Starlette's plain-text 500). A client that
went away before its body was read whole is no failure of the service: nobody is left
to answer, and :class:`~.observe.Observe` counts it as such (:data:`CLIENT_CLOSED`)."""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import ClientDisconnect

from ..._validate import printable
from ._base import Middleware
from .request_id import request_id_of

log = logging.getLogger("bucketq.server")


class LastResort(Middleware):
    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = False

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            raise  # Observe's: a client that went away, not a failure
        except Exception:
            rid = request_id_of(scope)
            log.exception(
                "request %s %s %s failed", rid, scope.get("method"), printable(scope.get("path"))
            )
            if not started:
                body = (
                    b'{"error":"Internal error","message":"The service failed on this request; '
                    b'it was logged with this request_id.","request_id":"' + rid.encode() + b'"}'
                )
                await send({"type": "http.response.start", "status": 500,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
