"""The worker's /metrics and /health endpoint against clients that misbehave: a cap on
connections answered 503 at once, methods other than GET refused, a slow client cut off."""

from __future__ import annotations

import socket

from bucketq.worker import endpoint
from bucketq.worker.endpoint import Endpoint

from .procs import get


def _served() -> Endpoint:
    return Endpoint("127.0.0.1", 0, lambda: (b"m 1\n", "text/plain"),
                    lambda: {"ok": False, "status": "every handler (1) is stuck"}).start()  # fmt: skip


def _ask(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_connections_past_the_cap_are_answered_503_at_once():
    ep = _served()
    idle = [
        socket.create_connection(("127.0.0.1", ep.port)) for _ in range(endpoint.MAX_CONNECTIONS)
    ]
    try:
        # The eight hold every place (they send nothing); the ninth is not queued behind them.
        answer = _ask(ep.port, b"GET /metrics HTTP/1.0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 503") and b"Retry-After: 1" in answer
    finally:
        for s in idle:
            s.close()
        ep.stop()


def test_get_only_and_health_says_503_when_not_ok():
    ep = _served()
    try:
        base = f"http://127.0.0.1:{ep.port}"
        assert get(base + "/metrics") == (200, b"m 1\n")
        code, body = get(base + "/health")
        assert code == 503 and b"every handler (1) is stuck" in body
        assert _ask(ep.port, b"POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n").startswith(
            b"HTTP/1.0 501"
        )
    finally:
        ep.stop()
