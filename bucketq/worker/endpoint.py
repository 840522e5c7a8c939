"""``/metrics`` and ``/health`` of a worker (``bucketq worker --metrics-port``): a small
HTTP server in daemon threads, for Prometheus and for an orchestrator's health checks.

It answers GET only, reads nothing but a request's first line and headers (the standard
library's limits: 64 KiB a line, 100 headers), gives each connection ``READ_TIMEOUT``
seconds, and serves at most ``MAX_CONNECTIONS`` at once: one more is answered 503 with
Retry-After at once. What it serves comes from two functions the command passes in, so
this module needs no metrics library.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("bucketq.worker")

MAX_CONNECTIONS = 8
READ_TIMEOUT = 5.0
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, routes: dict[str, Any]) -> None:
        self.routes = routes
        self._room = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._room.acquire(blocking=False):
            try:
                request.sendall(_BUSY)
            except OSError:
                pass  # the client left: nothing to tell it
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._room.release()


class _Handler(BaseHTTPRequestHandler):
    timeout = READ_TIMEOUT
    server_version = "bucketq-worker"
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                body, ctype = self.server.routes["metrics"]()
                code = 200
            elif path == "/health":
                report = self.server.routes["health"]()
                body = json.dumps(report, default=str).encode()
                ctype, code = "application/json", 200 if report.get("ok") else 503
            else:
                body, ctype, code = b"not found: try /metrics or /health\n", "text/plain", 404
        except Exception:  # a scrape must not take the worker down: answer 500
            log.exception("serving %s failed", path)
            body, ctype, code = b"internal error\n", "text/plain", 500
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics endpoint: " + format, *args)


class Endpoint:
    """Serves ``metrics()`` (bytes and their content type) at ``/metrics`` and
    ``health()`` (a dict with ``ok``; 503 when not ok) at ``/health`` on ``host:port``
    (port 0: a free one, then in :attr:`port`)."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: Callable[[], tuple[bytes, str]],
        health: Callable[[], dict[str, Any]],
    ) -> None:
        self._server = _Server((host, port), _Handler, {"metrics": metrics, "health": health})
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="bucketq-worker-metrics", daemon=True
        )

    def start(self) -> Endpoint:
        self._thread.start()
        log.info("metrics at http://%s:%d/metrics, health at /health", self.host, self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
