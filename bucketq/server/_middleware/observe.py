"""HTTP metrics: a request count and a latency histogram by route, method and status.

A request whose client went away before its body was read whole (the app raised
Starlette's ``ClientDisconnect``) is counted with the status :data:`CLIENT_CLOSED` and
logged at debug level: nothing is answered, and nothing failed in the service."""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.requests import ClientDisconnect

from ..._validate import printable
from ._base import Middleware

log = logging.getLogger("bucketq.server")

#: The ``method`` label's values; any other method a client sends is counted as ``other``
#: (label values come from a fixed set: invented methods must not grow ``/metrics``).
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: The ``status`` label of a request whose client closed the connection before its body
#: was read whole (nginx's code for a client that closed the request; never sent).
CLIENT_CLOSED = 499


class HttpMetrics:
    """HTTP request counts and a latency histogram by route, method and status, in
    ``registry``; observing never raises."""

    def __init__(self, registry: Any) -> None:
        import prometheus_client as prom

        labels = ("route", "method", "status")
        self.requests = prom.Counter(
            "bucketq_http_requests", "HTTP requests answered.", labels, registry=registry
        )
        self.latency = prom.Histogram(
            "bucketq_http_request_duration_seconds",
            "Time to answer an HTTP request, in seconds.",
            labels,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        method = method if method in KNOWN_METHODS else "other"
        try:
            self.requests.labels(route, method, str(status)).inc()
            self.latency.labels(route, method, str(status)).observe(seconds)
        except Exception:
            log.debug("recording HTTP metrics failed", exc_info=True)


class Observe(Middleware):
    """Counts each request once it is answered (500 when nothing answered it,
    :data:`CLIENT_CLOSED` when its client went away), timed from when it reached the app."""

    def __init__(self, app: Any, *, metrics: HttpMetrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        status = 500

        async def tracking_send(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            status = CLIENT_CLOSED
            log.debug("request %s %s: the client went away before its body was read whole",
                      scope.get("method"), printable(scope.get("path")))  # fmt: skip
        finally:
            route = getattr(scope.get("route"), "path", None) or "<unmatched>"
            self.metrics.observe(route, scope.get("method", ""), status, time.perf_counter() - t0)
