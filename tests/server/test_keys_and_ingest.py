"""API keys and the JSON ingest API of a running ``bucketq serve``."""

from __future__ import annotations

import hashlib
import json
import uuid

from pymongo import MongoClient
from stored_logs import stored_logs

from waiting import eventually

from .helpers import Serve, bucketq_cli, create_key_command, log_batch


def _project() -> str:
    return f"p-{uuid.uuid4().hex[:8]}"


def _stored(mongo_client: MongoClient, db: str, project: str) -> int:
    return len(stored_logs(mongo_client[db], {"project_id": project}))


def test_key_lifecycle_from_the_command_line(serve: Serve, mongo_client: MongoClient) -> None:
    project = _project()
    key = create_key_command(serve, project)
    assert key.startswith("bq_") and len(key) == 75  # 64 random hex characters, 8 of checksum
    stored = mongo_client[serve.database]["api_keys"].find_one({"project": project})
    assert stored["_id"] == hashlib.sha256(key.encode()).hexdigest()
    assert key not in json.dumps(stored, default=str)  # never in clear

    with serve.client(key) as c:
        r = c.post("/api/v1/ingest", json=log_batch(3))
        assert r.status_code == 200, r.text
        assert r.json()["received"] == 3
    with serve.client() as c:  # the same key as a bearer token
        r = c.get("/api/v1/logs", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200 and len(r.json()["logs"]) == 3

    listed = bucketq_cli(serve.env, "keys", "list", "--project", project)
    assert listed.returncode == 0, listed.stderr
    assert key[:11] in listed.stdout and key not in listed.stdout

    revoked = bucketq_cli(serve.env, "keys", "revoke", key[:11])
    assert revoked.returncode == 0, revoked.stderr
    with serve.client(key) as c:
        # The service caches a key's state for key_cache_ms, so the key may work a little
        # longer: wait with a read, as an ingest accepted meanwhile would be stored.
        eventually(lambda: c.get("/api/v1/logs").status_code == 401,
                   timeout=5, what="the revoked key to be refused")  # fmt: skip
        r = c.post("/api/v1/ingest", json=log_batch(1))
        assert r.status_code == 401 and "revoked" in r.json()["message"]
    assert _stored(mongo_client, serve.database, project) == 3

    unknown = bucketq_cli(serve.env, "keys", "revoke", "bq_00000000")
    assert unknown.returncode == 1 and "No key" in unknown.stderr


def test_missing_or_unknown_key_is_401(serve: Serve) -> None:
    with serve.client() as c:
        for headers in ({}, {"X-API-Key": "nope"}, {"X-API-Key": "bq_" + "0" * 64},
                        {"Authorization": "Bearer bq_" + "1" * 64}, {"Authorization": "Basic eDp5"}):  # fmt: skip
            r = c.post("/api/v1/ingest", json=log_batch(1), headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"] == "Unauthorized"
            assert c.get("/api/v1/logs", headers=headers).status_code == 401


def test_a_key_reads_and_writes_only_its_project(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    a, b = _project(), _project()
    ka, kb = keys(a), keys(b)
    with serve.client(ka) as c:
        # A project named in the body is ignored: the key decides.
        r = c.post("/api/v1/ingest", json={"logs": [{**log_batch(1)["logs"][0], "project_id": b}]})
        assert r.status_code == 200, r.text
        r = c.post("/api/v1/ingest", json=log_batch(2), params={"project_id": b})
        assert r.status_code == 200
    assert _stored(mongo_client, serve.database, a) == 3
    assert _stored(mongo_client, serve.database, b) == 0
    with serve.client(kb) as c:
        assert c.get("/api/v1/logs").json()["logs"] == []
        assert c.post("/api/v1/ingest", json=log_batch(1)).status_code == 200
    with serve.client(ka) as c:
        assert len(c.get("/api/v1/logs", params={"limit": 1000}).json()["logs"]) == 3


def test_validation_names_the_field_and_index_and_stores_nothing(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    project = _project()
    good = log_batch(1)["logs"][0]
    cases = [
        ("level", "loud", 422),
        ("time", "yesterday", 422),
        ("time", "0001-01-01T00:10:00+01:00", 422),  # before year 1 in UTC
        ("time", 1714557600, 422),  # the schema says ISO 8601 text
        ("service", "", 422),
        ("service", "x" * 101, 422),
        ("message", "", 422),
        ("message", 12, 422),
        ("metadata", [1, 2], 422),
        ("span_id", "x" * 129, 422),
        ("trace_id", "a\x01b", 422),
        ("metadata", {"a\x00b": 1}, 422),  # BSON cannot store it: caught before queueing
        ("metadata", {"big": 2**70}, 422),
    ]
    with serve.client(keys(project)) as c:
        for field, value, code in cases:
            body = {"logs": [good, good, {**good, field: value}]}
            r = c.post("/api/v1/ingest", json=body)
            assert r.status_code == code, (field, r.text)
            err = r.json()
            assert err["error"] == "Validation error"
            assert err["details"][0]["index"] == 2, err
            assert err["details"][0]["field"] == f"logs[2].{field}", err
            assert f"logs[2].{field}" in err["message"]
        missing = {k: v for k, v in good.items() if k != "message"}
        r = c.post("/api/v1/ingest", json={"logs": [missing]})
        assert r.status_code == 422 and r.json()["details"][0]["field"] == "logs[0].message"
        for body in ({"logs": []}, {"records": [good]}, [good], "text"):
            assert c.post("/api/v1/ingest", json=body).status_code == 422, body
        # Upper-case levels are accepted and stored lower case.
        assert (
            c.post("/api/v1/ingest", json={"logs": [{**good, "level": "WARN"}]}).status_code == 200
        )
    assert {
        r["level"] for r in stored_logs(mongo_client[serve.database], {"project_id": project})
    } == {"warn"}


def test_malformed_bodies_are_400_with_a_request_id(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    project = _project()
    with serve.client(keys(project)) as c:
        for raw in (b'{"logs": [', b"\xff\xfe\x00", b"nan", b'{"logs": [{"time": NaN}]'):
            r = c.post("/api/v1/ingest", content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code in (400, 422), (raw, r.text)
            assert r.json()["request_id"] == r.headers["x-request-id"]
        lone = b'{"logs": [{"time": "2024-05-01T10:00:00Z", "service": "a", "level": "info", "message": "\\ud800"}]}'
        r = c.post("/api/v1/ingest", content=lone, headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and r.json()["details"][0]["field"] == "logs[0].message", r.text
        r = c.post("/api/v1/ingest", content=b'{"logs": [', headers={"X-Request-ID": "abc-123"})
        assert r.status_code == 400 and r.json()["error"] == "Malformed JSON"
        assert r.headers["x-request-id"] == "abc-123"
        # curl -d sends a form content type: still read as JSON.
        r = c.post("/api/v1/ingest", content=json.dumps(log_batch(1)),
                   headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        assert r.status_code == 200, r.text
    assert _stored(mongo_client, serve.database, project) == 1


def test_size_limits_are_413(serve: Serve, keys, mongo_client: MongoClient) -> None:
    project = _project()
    with serve.client(keys(project)) as c:
        big = log_batch(1, prefix="x" * (13 * 1024 * 1024))
        r = c.post("/api/v1/ingest", json=big)
        assert r.status_code == 413 and "BUCKETQ_MAX_BODY_BYTES" in r.json()["message"]

        def chunks():  # no Content-Length: the limit holds while streaming
            yield b'{"logs": [{"time": "2024-05-01T10:00:00Z", "service": "a", "level": "info", "message": "'
            for _ in range(13):
                yield b"y" * (1024 * 1024)
            yield b'"}]}'

        r = c.post("/api/v1/ingest", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        r = c.post("/api/v1/ingest", json=log_batch(1001))
        assert r.status_code == 413 and "BUCKETQ_MAX_RECORDS" in r.json()["message"]
        assert c.post("/api/v1/ingest", json=log_batch(1000)).status_code == 200
    assert _stored(mongo_client, serve.database, project) == 1000


def test_spans_and_metrics(serve: Serve, keys, mongo_client: MongoClient) -> None:
    project = _project()
    db = mongo_client[serve.database]
    span = {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331",
            "service": "api", "name": "GET /", "kind": "SERVER",
            "start_time": "2024-05-01T10:00:00Z", "end_time": "2024-05-01T10:00:00.250Z",
            "status": {"code": "ok"}, "attributes": {"http.status_code": 200}}  # fmt: skip
    metric = {"time": "2024-05-01T10:00:00Z", "service": "api", "name": "rps", "value": 12.5,
              "labels": {"route": "/"}}  # fmt: skip
    with serve.client(keys(project)) as c:
        r = c.post("/api/v1/ingest/spans", json={"spans": [span, span]})
        assert r.status_code == 200 and r.json()["received"] == 2, r.text
        r = c.post("/api/v1/ingest/metrics", json={"metrics": [metric]})
        assert r.status_code == 200, r.text
        r = c.post("/api/v1/ingest/spans", json={"spans": [span, {**span, "trace_id": "zz"}]})
        assert r.status_code == 422 and r.json()["details"][0]["field"] == "spans[1].trace_id"
        for value in ("high", "3", True):
            r = c.post("/api/v1/ingest/metrics", json={"metrics": [{**metric, "value": value}]})
            assert r.status_code == 422 and r.json()["details"][0]["field"] == "metrics[0].value"
    spans = list(db["spans"].find({"project_id": project}))
    assert len(spans) == 2 and spans[0]["kind"] == "server" and spans[0]["duration_ms"] == 250
    assert db["metrics"].count_documents({"project_id": project, "value": 12.5}) == 1


def test_health_and_metrics(serve: Serve) -> None:
    with serve.client() as c:
        assert c.get("/health").json()["status"] == "ok"
        assert c.get("/ready").status_code == 200
        text = c.get("/metrics").text
    assert 'bucketq_http_requests_total{method="GET",route="/health",status="200"}' in text
    assert "bucketq_http_request_duration_seconds_bucket" in text


def test_idempotency_key_stores_a_retried_request_once(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    project = _project()
    body = log_batch(5, prefix="idem")
    with serve.client(keys(project)) as c:
        for _ in range(3):  # a client retrying after a lost answer
            r = c.post("/api/v1/ingest", json=body, headers={"Idempotency-Key": "req-1"})
            assert r.status_code == 200 and r.json()["received"] == 5
        assert (
            c.post("/api/v1/ingest", json=body, headers={"Idempotency-Key": "req-2"}).status_code
            == 200
        )
        assert c.post("/api/v1/ingest", json=body).status_code == 200  # no key: stored again
        assert len(c.get("/api/v1/logs", params={"limit": 100}).json()["logs"]) == 15
    assert _stored(mongo_client, serve.database, project) == 15
    # The same key from another project is another request.
    with serve.client(keys(project + "-b")) as c:
        assert (
            c.post("/api/v1/ingest", json=body, headers={"Idempotency-Key": "req-1"}).status_code
            == 200
        )
    assert _stored(mongo_client, serve.database, project + "-b") == 5
