"""Hostile and careless requests beyond test_hostile.py's, against a real ``bucketq serve``:
a read whose records are huge, request heads past their limits, repeated query
parameters, HEAD on the read-only routes, and numbers a double cannot hold. Each gets
the documented answer (docs/server.md, "Limits and overload")."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from urllib.parse import urlsplit

import httpx
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from pymongo import MongoClient

from bucketq.server import _keys

from .helpers import TLS, Serve, log_batch

JSON = {"Content-Type": "application/json"}
PB = {"Content-Type": "application/x-protobuf"}
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
    # 1,000 records of 1 MB messages, asked for in one page, must not be built whole in
    # memory: the page is bounded by its stored bytes.
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


def test_a_request_head_past_its_limits_is_refused_and_the_connection_closed(
    serve: Serve, keys
) -> None:
    key = keys(_project())
    many = "".join(f"X-Filler-{i}: v\r\n" for i in range(101))  # 1.7 KB, 101 fields
    big = "X-Filler: " + "v" * 40_000 + "\r\n"  # one read of the server's: h11 took it
    for extra in (many, big):
        head = f"GET /api/v1/logs HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n{extra}\r\n"
        out = _raw(serve, head.encode())
        status = out.split(b"\r\n", 1)[0]
        # 431 from the service; 400 from h11 when the head's first 16 KiB came alone.
        assert status in (b"HTTP/1.1 431 Request Header Fields Too Large",
                          b"HTTP/1.1 400 Bad Request"), out[:300]  # fmt: skip
        if b"431" in status:
            assert b'"error":"Request header fields too large"' in out
            assert b"connection: close" in out.lower()
    with serve.client(key) as c:  # others are answered as before
        assert c.get("/api/v1/logs").status_code == 200


def test_a_query_parameter_given_twice_is_a_400_not_a_silent_choice(serve: Serve, keys) -> None:
    with serve.client(keys(_project())) as c:
        assert c.post("/api/v1/ingest", json=log_batch(2)).status_code == 200
        for query in (
            "limit=1&limit=2",
            "q=m&q=m",
            "from=2024-01-01T00:00:00Z&from=2024-01-02T00:00:00Z",
        ):
            r = c.get(f"/api/v1/logs?{query}")
            assert r.status_code == 400, (query, r.text[:300])
            body = r.json()
            assert body["error"] == "Bad request" and body["request_id"]
            assert "more than once" in body["message"] and query.split("=")[0] in body["message"]
        assert len(c.get("/api/v1/logs?level=info&limit=1").json()["logs"]) == 1
        # A list parameter (LogTide's level and service) is given as often as it has
        # values, on the routes that take it as a list only.
        assert c.get("/api/v1/logs?level=info&level=error").status_code == 200
        for query in ("level=info&level=error", "service=a&service=b"):
            r = c.get(f"/api/v1/logs/stream?{query}")
            assert r.status_code == 400 and "more than once" in r.json()["message"], r.text
        r = c.get("/health?level=a&level=b")
        assert r.status_code == 400 and "more than once" in r.json()["message"]
        many = "&".join(f"service=s{i}" for i in range(9))
        assert c.get(f"/api/v1/logs?{many}").status_code == 422


def test_head_is_answered_on_every_get_route_like_get_without_a_body(serve: Serve, keys) -> None:
    with serve.client(keys(_project())) as c:
        for path in ("/health", "/ready", "/metrics", "/api/v1/logs", "/openapi.json"):
            got = c.get(path)
            head = c.head(path)
            assert head.status_code == got.status_code == 200, (path, head.status_code)
            assert head.content == b""
            assert head.headers["content-type"] == got.headers["content-type"]
        # a route that only takes POST still says so; others keep the error shape
        assert c.head("/api/v1/ingest").status_code == 405
        assert c.head("/nowhere").status_code == 404
        for method, status in (("OPTIONS", 405), ("BREW", 405)):
            r = c.request(method, "/api/v1/logs")
            assert r.status_code == status and r.json()["request_id"], (method, r.status_code)
        metrics = c.get("/metrics").text
    # counted under the route it matched, as HEAD
    assert 'bucketq_http_requests_total{method="HEAD",route="/health",status="200"}' in metrics


def test_a_metric_value_a_double_cannot_hold_is_refused(
    serve: Serve, keys, mongo_client: MongoClient, server_db: str
) -> None:
    project = _project()
    with serve.client(keys(project)) as c:
        for number in ("1e400", "-1e400", "9" * 400):
            raw = (
                '{"metrics":[{"time":"2024-05-01T10:00:00Z","service":"s","name":"n",'
                f'"value":{number}}}]}}'
            )
            r = c.post("/api/v1/ingest/metrics", content=raw, headers=JSON)
            assert r.status_code == 422, (number[:10], r.text[:300])
            assert r.json()["details"][0]["field"] == "metrics[0].value"
    assert mongo_client[server_db]["metrics"].count_documents({"project_id": project}) == 0


def test_a_header_read_once_given_twice_is_a_400_not_a_silent_choice(serve: Serve, keys) -> None:
    # the first X-API-Key was used and the second ignored; a second Content-Encoding
    # (identity, then gzip) made a gzip body read as plain JSON
    key = keys(_project())
    body = json.dumps(log_batch(1)).encode()
    cases = {
        "x-api-key": [("X-API-Key", key), ("X-API-Key", "bq_" + "0" * 64)],
        "content-encoding": [("X-API-Key", key), ("Content-Encoding", "identity"),
                             ("Content-Encoding", "gzip")],
        "idempotency-key": [("X-API-Key", key), ("Idempotency-Key", "a"),
                            ("Idempotency-Key", "b")],
    }  # fmt: skip
    with httpx.Client(verify=TLS, base_url=serve.url, timeout=30) as c:
        for name, headers in cases.items():
            r = c.post("/api/v1/ingest", content=body, headers=[*headers, *JSON.items()])
            assert r.status_code == 400, (name, r.text[:300])
            assert name in r.json()["message"] and r.json()["request_id"]
            r = c.post("/v1/logs", content=b"{}", headers=[*headers, *JSON.items()])
            assert r.status_code == 400, (name, r.text[:300])  # OTLP: a google.rpc.Status
            assert name in r.json()["message"]
        assert (
            c.post("/api/v1/ingest", content=body, headers={"X-API-Key": key, **JSON}).status_code
            == 200
        )


def test_otlp_records_get_the_json_apis_length_limits(
    serve: Serve, keys, mongo_client: MongoClient, server_db: str
) -> None:
    # a 100,000-character span name, a 2,000-character service.name and a message over
    # the JSON API's 1,000,000 characters were stored as sent over OTLP
    project = _project()
    logs = logs_service_pb2.ExportLogsServiceRequest()
    for service, body in (("api", "ok"), ("s" * 101, "long service"), ("api", "b" * 1_000_001)):
        rl = logs.resource_logs.add()
        kv = rl.resource.attributes.add()
        kv.key, kv.value.string_value = "service.name", service
        rl.scope_logs.add().log_records.add().body.string_value = body
    spans = trace_service_pb2.ExportTraceServiceRequest()
    for name in ("ok", "n" * 1001):
        sp = spans.resource_spans.add().scope_spans.add().spans.add()
        sp.trace_id, sp.span_id, sp.name = b"\x01" * 16, b"\x02" * 8, name
    with serve.client(keys(project)) as c:
        r = c.post("/v1/logs", content=logs.SerializeToString(), headers=PB)
        assert r.status_code == 200, r.content[:300]
        answer = logs_service_pb2.ExportLogsServiceResponse.FromString(r.content)
        assert answer.partial_success.rejected_log_records == 2
        assert "longer than" in answer.partial_success.error_message
        assert [x["message"] for x in c.get("/api/v1/logs").json()["logs"]] == ["ok"]
        r = c.post("/v1/traces", content=spans.SerializeToString(), headers=PB)
        assert r.status_code == 200, r.content[:300]
        answer = trace_service_pb2.ExportTraceServiceResponse.FromString(r.content)
        assert answer.partial_success.rejected_spans == 1
    stored = mongo_client[server_db]["spans"].find({"project_id": project})
    assert [s["name"] for s in stored] == ["ok"]


def test_the_consoles_times_at_the_edges_of_the_calendar_are_read_not_failed(
    serve: Serve, keys, mongo_client: MongoClient, server_db: str
) -> None:
    # 0001-01-01T00:00:00+14:00 is before year 1 in UTC: the page said "Reading the logs
    # failed (OverflowError); try again" and the tail answered 503, as if storage failed
    project = _project()
    with serve.client(keys(project)) as c:
        assert c.post("/api/v1/ingest", json=log_batch(1, prefix="edge")).status_code == 200
    operator = _keys.create_key(mongo_client[server_db], "", operator=True)
    with httpx.Client(verify=TLS, base_url=serve.url, timeout=30) as c:
        r = c.post("/console/login", data={"key": operator, "next": "/console/"},
                   headers={"Sec-Fetch-Site": "same-origin"})  # fmt: skip
        assert r.status_code == 303, r.text[:300]
        early, late = "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"
        page = c.get("/console/logs", params={"project": project, "from": early, "to": late})
        assert page.status_code == 200 and "edge-0" in page.text
        assert "failed" not in page.text
        tail = c.get("/console/api/tail", params={"project": project, "since": early})
        assert tail.status_code == 200, tail.text[:300]
        assert [x["message"] for x in tail.json()["logs"]] == ["edge-0"]
        tail = c.get("/console/api/tail", params={"project": project, "since": late})
        assert tail.status_code == 200 and tail.json()["logs"] == [], tail.text[:300]


def test_a_forged_cursor_past_the_calendar_is_a_400_not_a_storage_failure(
    serve: Serve, keys
) -> None:
    # a cursor's time 0001-01-01T00:00+14:00 decoded, then failed to encode in the query:
    # answered 503 "Storage did not answer the read" with Retry-After, an invitation to
    # retry a request that can never work
    with serve.client(keys(_project())) as c:
        for t in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
            raw = json.dumps({"t": t, "i": "x", "o": False}).encode()
            r = c.get("/api/v1/logs", params={"cursor": base64.urlsafe_b64encode(raw).decode()})
            assert r.status_code == 400, (t, r.text[:300])
            assert r.json()["error"] == "Bad cursor"
