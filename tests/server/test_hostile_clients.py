"""What hostile and careless clients found, each fixed as a class, against a real
``bucketq serve``: a client that goes away mid-body, heads two parsers could read two
ways, two different keys in one request, the headers every answer carries, the OTLP
status codes, unknown query parameters, and a flood of invented keys beside the first
uses of real ones.

Raw sockets where the test is about bytes on the wire; a client waits up to 30 s for an
answer, so a request left hanging fails by that timeout, never by a measured time."""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from pymongo import MongoClient

from bucketq.server import _keys
from waiting import eventually

from .helpers import Serve, log_batch
from .test_admission import metric

TIMEOUT = 30.0


def _address(serve: Serve) -> tuple[str, int]:
    host, port = serve.url.removeprefix("http://").split(":")
    return host, int(port)


def _exchange(serve: Serve, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it (a server
    that keeps it open fails the test by the timeout)."""
    with socket.create_connection(_address(serve), timeout=TIMEOUT) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def _answers(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The HTTP answers in ``raw``, each (status, headers, body); bodies have a length."""
    out = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
        }
        n = int(headers.get("content-length", "0"))
        out.append((int(lines[0].split()[1]), headers, raw[:n]))
        raw = raw[n:]
    return out


def _project() -> str:
    return f"hc-{uuid.uuid4().hex[:8]}"


# -- a client that goes away --------------------------------------------------------------


def test_a_client_that_goes_away_mid_body_is_no_500_and_no_error(serve: Serve, keys) -> None:
    key = keys(_project())
    before = len(serve.output())
    with serve.client() as c:
        counted = c.get("/metrics").text
    routes = ("/api/v1/ingest", "/v1/logs", "/console/login")  # the last needs no key
    for route in routes:
        with socket.create_connection(_address(serve), timeout=TIMEOUT) as s:
            s.sendall(f"POST {route} HTTP/1.1\r\nHost: t\r\nX-API-Key: {key}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                      '{"logs": ['.encode())  # fmt: skip

    def all_counted() -> str | None:
        with serve.client() as c:
            text = c.get("/metrics").text
        done = all(
            metric(text, "bucketq_http_requests_total", route=r, status="499")
            == metric(counted, "bucketq_http_requests_total", route=r, status="499") + 1
            for r in routes
        )
        return text if done else None

    text = eventually(all_counted, what="three client disconnects counted as 499")
    assert metric(text, "bucketq_http_requests_total", status="500") == metric(
        counted, "bucketq_http_requests_total", status="500"
    )
    logged = serve.output()[before:]
    assert "Traceback" not in logged and " ERROR " not in logged, logged


# -- framing -------------------------------------------------------------------------------


def test_ambiguous_heads_are_refused_and_their_connection_closed(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    """RFC 9112: both Content-Length and Transfer-Encoding (a body a proxy and the service
    would end at different places), bare LF line ends, control characters in Host or
    another field, Host twice: 400 naming the problem, the connection closed (whatever was
    sent behind it is never read as a request), nothing stored."""
    project = _project()
    key = keys(project)
    body = json.dumps(log_batch(1, prefix="smuggled")).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    behind = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
    heads = [
        ("Content-Length", f"POST /api/v1/ingest HTTP/1.1\r\nHost: t\r\nX-API-Key: {key}\r\n"
         "Content-Type: application/json\r\nContent-Length: 4\r\n"
         "Transfer-Encoding: chunked\r\n\r\n".encode() + chunked + behind),
        ("bare LF", b"GET /health HTTP/1.1\nHost: t\n\n" + behind),
        ("bare LF", b"GET /health HTTP/1.1\r\nHost: t\nX-A: b\r\n\r\n" + behind),
        ("Host holds a control", b"GET /health HTTP/1.1\r\nHost: a\x01b\r\n\r\n" + behind),
        ("Host holds characters", b"GET /health HTTP/1.1\r\nHost: a b\r\n\r\n" + behind),
        ("X-Api-Key holds a control", b"GET /health HTTP/1.1\r\nHost: t\r\nX-Api-Key: a\x1bb\r\n\r\n"),
        ("Host is given more than once", b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
        ("folded", b"GET /health HTTP/1.1\r\nHost: t\r\nX-A: b\r\n c\r\n\r\n"),
        ("request target", b"GET /health\x01 HTTP/1.1\r\nHost: t\r\n\r\n"),
    ]  # fmt: skip
    for said, data in heads:
        answers = _answers(_exchange(serve, data))
        assert len(answers) == 1, (said, answers)
        status, headers, text = answers[0]
        assert status == 400 and said in text.decode(), (said, text)
        assert headers["connection"] == "close" and headers["x-content-type-options"] == "nosniff"
    # A good request, then an ambiguous one on the same connection: the first is answered,
    # the second refused, the connection closed.
    good_then_bad = behind + b"GET /health HTTP/1.1\r\nHost: a\x7fb\r\n\r\n" + behind
    statuses = [a[0] for a in _answers(_exchange(serve, good_then_bad))]
    assert statuses == [200, 400]
    assert mongo_client[serve.database]["logs"].count_documents({"project_id": project}) == 0
    with serve.client(key) as c:  # the same request, framed one way, is stored
        r = c.post("/api/v1/ingest", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text


# -- keys and headers ----------------------------------------------------------------------


def test_two_different_keys_in_one_request_are_refused(serve: Serve, keys, mongo_client) -> None:
    one, other = keys(_project()), keys(_project())
    operator = _keys.create_key(mongo_client[serve.database], "", operator=True)
    with serve.client() as c:
        for path, method, key in (("/api/v1/ingest", "POST", one), ("/api/v1/logs", "GET", one),
                                  ("/v1/logs", "POST", one), ("/console/api/queues", "GET", operator)):  # fmt: skip
            r = c.request(method, path, json=log_batch(1) if method == "POST" else None,
                          headers={"X-API-Key": key, "Authorization": f"Bearer {other}"})  # fmt: skip
            assert r.status_code == 400, (path, r.text)
            assert "two different keys" in r.text, (path, r.text)
            # The same key in both is that key.
            r = c.request(method, path, json=log_batch(1) if method == "POST" else None,
                          headers={"X-API-Key": key, "Authorization": f"Bearer {key}"})  # fmt: skip
            assert r.status_code == 200, (path, r.text)


def test_every_answer_says_nosniff_and_answers_with_data_are_not_stored(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    key = keys(_project())
    operator = _keys.create_key(mongo_client[serve.database], "", operator=True)
    with serve.client() as c:
        answers = {
            "read": c.get("/api/v1/logs", headers={"X-API-Key": key}),
            "ingest": c.post("/api/v1/ingest", json=log_batch(1), headers={"X-API-Key": key}),
            "401": c.get("/api/v1/logs"),
            "404": c.get("/nowhere"),
            "422": c.get("/api/v1/logs?limit=0", headers={"X-API-Key": key}),
            "health": c.get("/health"),
            "tail": c.get("/console/api/tail?project=x", headers={"X-API-Key": operator}),
            "queues": c.get("/console/api/queues", headers={"X-API-Key": operator}),
            "ingest state": c.get("/console/api/ingest", headers={"X-API-Key": operator}),
            "console page": c.get("/console/logs", headers={"X-API-Key": operator}),
        }
        for what, r in answers.items():
            assert r.headers.get("x-content-type-options") == "nosniff", what
            assert r.headers.get("cache-control") == "no-store", (what, r.headers)
        # The console's stylesheet says how long it may be kept, and keeps saying it.
        r = c.get("/console/static/console.css")
        assert r.headers["cache-control"] == "max-age=300"
        assert r.headers["x-content-type-options"] == "nosniff"


def test_otlp_error_answers_carry_the_google_rpc_code_of_their_status(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    operator = _keys.create_key(mongo_client[serve.database], "", operator=True)
    body = logs_service_pb2.ExportLogsServiceRequest().SerializeToString()
    pb = {"Content-Type": "application/x-protobuf"}
    with serve.client() as c:
        r = c.post("/v1/logs", content=body, headers={**pb, "X-API-Key": operator})
        assert r.status_code == 403
        assert status_pb2.Status.FromString(r.content).code == code_pb2.PERMISSION_DENIED
        r = c.post("/v1/logs", content=body, headers=pb)
        assert r.status_code == 401
        assert status_pb2.Status.FromString(r.content).code == code_pb2.UNAUTHENTICATED
        r = c.post("/v1/logs", json={}, headers={"X-API-Key": operator})
        assert r.status_code == 403 and r.json()["code"] == code_pb2.PERMISSION_DENIED


def test_a_query_parameter_the_route_does_not_take_is_refused(serve: Serve, keys) -> None:
    key = keys(_project())
    with serve.client(key) as c:
        r = c.post("/api/v1/ingest", json=log_batch(3, prefix="qp"))
        assert r.status_code == 200
        for method in ("GET", "HEAD"):
            r = c.request(method, "/api/v1/logs", params={"trace_id": "ab" * 16, "limit": 2})
            assert r.status_code == 400, r.text
        r = c.get("/api/v1/logs", params={"trace_id": "ab" * 16})
        message = r.json()["message"]
        assert "'trace_id'" in message
        assert "cursor, from, level, limit, offset, q, service, to" in message
        # Every parameter the route takes still works, under its own name (from, not from_).
        r = c.get("/api/v1/logs", params={"from": "2024-01-01T00:00:00Z", "to": "2030-01-01T00:00:00Z",
                                          "level": "info", "service": "api", "q": "qp", "limit": 2})  # fmt: skip
        assert r.status_code == 200 and len(r.json()["logs"]) == 2
        assert c.get("/api/v1/logs", params={"from_": "2024-01-01T00:00:00Z"}).status_code == 400


# -- a flood of invented keys ---------------------------------------------------------------


@pytest.fixture(scope="module")
def flooded(
    mongo_uri: str, mongo_client: MongoClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Serve, str]]:
    db = f"bqf_{secrets.token_hex(5)}"
    s = Serve(mongo_uri, db, Path(tmp_path_factory.mktemp("flood")) / "serve.log",
              BUCKETQ_KEY_LOOKUPS_PER_S="5").start()  # fmt: skip
    try:
        yield s, db
    finally:
        s.terminate()
        mongo_client.drop_database(db)


def _legacy_key(db, project: str) -> str:
    """A key of the form made before keys had a checksum, stored as they were."""
    key = _keys.KEY_PREFIX + secrets.token_hex(32)
    db[_keys.KEYS_COLLECTION].insert_one(_keys.key_document(key, project))
    return key


def test_invented_keys_cost_no_lookup_and_never_hold_back_a_real_keys_first_use(
    flooded: tuple[Serve, str], mongo_client: MongoClient
) -> None:
    """Invented keys of both forms sent as fast as the client can while twelve new keys
    are used for the first time: every first use is stored; a key with a wrong checksum
    is a 401 without a lookup; the old form's lookups are held to
    BUCKETQ_KEY_LOOKUPS_PER_S, and its refusals (API and console) say so, not that the
    key store is unavailable."""
    serve, database = flooded
    db = mongo_client[database]
    fresh = [_keys.create_key(db, f"fresh-{i}") for i in range(12)]
    with serve.client() as c:
        before = c.get("/metrics").text
    stop = threading.Event()
    seen: dict[tuple[str, int], str] = {}
    sent = {"checked": 0, "legacy": 0}
    lock = threading.Lock()

    def flood() -> None:
        with serve.client() as c:
            while not stop.is_set():
                for form in sent:
                    key = _keys.KEY_PREFIX + secrets.token_hex(32)
                    if form == "checked":  # the right form, the checksum of no deployment
                        key += secrets.token_hex(4)
                    r = c.post("/api/v1/ingest", json=log_batch(1), headers={"X-API-Key": key})
                    with lock:
                        seen.setdefault((form, r.status_code), r.text)
                        sent[form] += 1

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    try:
        eventually(lambda: ("legacy", 429) in seen, what="the old form's lookups to be held back")
        with serve.client() as c:
            for i, key in enumerate(fresh):
                r = c.post("/api/v1/ingest", json=log_batch(1, prefix=f"first-{i}"),
                           headers={"X-API-Key": key})  # fmt: skip
                assert r.status_code == 200, (i, r.text)

        # The console meets the limit too (a key of the old form not seen before), and says
        # which limit, not that the key store is unavailable.
        def console_429() -> httpx.Response | None:
            with serve.client(_keys.KEY_PREFIX + secrets.token_hex(32)) as c:
                r = c.get("/console/api/queues")
            assert r.status_code in (401, 429), r.text
            return r if r.status_code == 429 else None

        r = eventually(console_429, what="the console to hold back an old-form key's lookup")
        assert "without a checksum" in r.json()["message"] and int(r.headers["Retry-After"]) >= 1
        assert "unavailable" not in r.text
    finally:
        stop.set()
        for t in threads:
            t.join()
    elapsed = time.monotonic() - t0
    with serve.client() as c:
        after = c.get("/metrics").text
    assert set(seen) <= {("checked", 401), ("legacy", 401), ("legacy", 429)}, seen
    assert "Unknown API key" in seen[("checked", 401)]
    assert "without a checksum" in seen[("legacy", 429)]
    assert "bucketq keys create" in seen[("legacy", 429)]

    def count(text: str, result: str) -> float:
        return metric(text, "bucketq_key_lookups_total", result=result)

    # Every invented key of the new form was refused on its checksum, without a lookup.
    assert count(after, "bad_checksum") - count(before, "bad_checksum") == sent["checked"]
    # Lookups that reached the store: the fresh keys', and of the old form's invented keys
    # no more than the limit lets through (5, and 5 a second).
    lookups = sum(count(after, r) - count(before, r) for r in ("found", "unknown", "failed"))
    assert lookups <= len(fresh) + 5 + 5 * elapsed, (lookups, sent, elapsed)
    assert sent["legacy"] > 5 + 5 * elapsed, (sent, elapsed)  # the flood passed the limit
    # The flood over, a key of the old form is looked up and works.
    legacy = _legacy_key(db, "old")

    def legacy_accepted() -> bool:
        with serve.client(legacy) as c:
            return c.post("/api/v1/ingest", json=log_batch(1)).status_code == 200

    eventually(legacy_accepted, what="an old-form key to work once the flood is over")
