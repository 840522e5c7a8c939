"""Every request gets an id: the client's ``X-Request-ID`` when it is a sane token, else
a new one; it is in ``scope["state"]["request_id"]``, in every answer's ``X-Request-ID``
and in the log lines about the request."""

from __future__ import annotations

import re
import uuid
from typing import Any

from ._base import Middleware

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def request_id_of(scope: dict[str, Any]) -> str:
    return str(scope.get("state", {}).get("request_id", ""))


class RequestId(Middleware):
    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        header = (b"x-request-id", rid.encode())

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                if not any(k.lower() == b"x-request-id" for k, _ in headers):
                    message["headers"] = [*headers, header]
            await send(message)

        await self.app(scope, receive, send_with_id)
