"""The JSON API reads its body as JSON whatever Content-Type says (``curl -d`` sends a
form type): a body that is not JSON is then a 400, not a confusing 422."""

from __future__ import annotations

from typing import Any

JSON_PREFIX = "/api/v1/ingest"


class JsonBody:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(JSON_PREFIX):
            headers = scope.get("headers") or []
            if b"json" not in dict(headers).get(b"content-type", b""):
                scope["headers"] = [(k, v) for k, v in headers if k != b"content-type"]
                scope["headers"].append((b"content-type", b"application/json"))
        await self.app(scope, receive, send)
