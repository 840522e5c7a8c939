"""Hostile and careless requests beyond issue #24's list, against a real ``bucketq serve``:
a read whose records are huge. Each gets
the documented answer (docs/server.md, "Limits and overload")."""

from __future__ import annotations

import socket
import uuid
from urllib.parse import urlsplit

from .helpers import Serve, log_batch

JSON = {"Content-Type": "application/json"}
MiB = 1024 * 1024


def _project() -> str:
    return f"hostile-more-{uuid.uuid4().hex[:8]}"


def _raw(serve: Serve, head: bytes) -> bytes:
    """Send ``head`` on a connection of its own; everything the server answers until
    it closes the connection (the test fails on a timeout if it never does)."""
    u = urlsplit(serve.url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(head)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_a_page_of_huge_records_holds_at_most_4_mib_and_the_rest_follow(serve: Serve, keys) -> None:
    # 1,000 records of 1 MB messages, asked for in one page, were built whole in memory
    # (a page of 200 such records raised the process's peak memory by 570 MB).
    big = "x" * 999_990
    with serve.client(keys(_project())) as c:
        for batch in range(2):
            body = log_batch(3, service="big")
            for i, rec in enumerate(body["logs"]):
                rec["message"] = f"{batch}{i}{big}"
            assert c.post("/api/v1/ingest", json=body).status_code == 200
        first = c.get("/api/v1/logs", params={"limit": 100})
        assert first.status_code == 200, first.text[:300]
        page = first.json()
        assert len(first.content) <= 4 * MiB + 64 * 1024
        assert 1 <= len(page["logs"]) < 6 and page["next_cursor"]
        seen = [r["message"][:2] for r in page["logs"]]
        cursor = page["next_cursor"]
        while cursor:
            r = c.get("/api/v1/logs", params={"limit": 100, "cursor": cursor})
            assert r.status_code == 200 and len(r.content) <= 4 * MiB + 64 * 1024
            seen += [x["message"][:2] for x in r.json()["logs"]]
            cursor = r.json()["next_cursor"]
    assert sorted(seen) == ["00", "01", "02", "10", "11", "12"]
