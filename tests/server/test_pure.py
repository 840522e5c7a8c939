"""The service's pure parts: configuration, keys, the OTLP mapping, the logs cursor."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bson import ObjectId

from bucketq.errors import ConfigurationError
from bucketq.server import _keys, _query, config_table, from_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "server.md"


def test_docs_configuration_table_is_the_rendered_one() -> None:
    m = re.search(
        r"<!-- config-table:start -->\n(.*?)<!-- config-table:end -->", DOC.read_text(), re.S
    )
    assert m, "docs/server.md lost its config-table markers"
    assert m.group(1) == config_table(), (
        "regenerate: python -c 'from bucketq.server import config_table; print(config_table())'"
    )


def test_config_from_env_names_the_bad_variable() -> None:
    cfg = from_env({"BUCKETQ_MAX_RECORDS": "50", "BUCKETQ_TEE_STREAM": "logs"})
    assert (
        cfg.max_records == 50 and cfg.tee_stream == "logs" and cfg.max_body_bytes == 5 * 1024 * 1024
    )
    for env, value in (("BUCKETQ_MAX_BODY_BYTES", "lots"), ("BUCKETQ_KEY_CACHE_MS", "5000"),
                       ("BUCKETQ_MAX_RECORDS", "0"), ("BUCKETQ_TEE_STREAM", "a$b"),
                       ("BUCKETQ_TEE_STREAM", "system.x"), ("BUCKETQ_DATABASE", "a.b"),
                       ("BUCKETQ_MONGODB_URI", "localhost")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=f"^{env} must be .*; got"):
            from_env({env: value})
    assert from_env({}, database="x", mongodb_uri=None).database == "x"


def test_keys_are_hashed_and_checked() -> None:
    key = _keys.new_key()
    assert _keys.looks_like_key(key) and not _keys.looks_like_key(key[:-1])
    doc = _keys.key_document(key, "shop")
    assert doc["_id"] == _keys.hash_key(key) != key and doc["prefix"] == key[:11]
    assert key not in str(doc)
    for bad in ("", "a b", "-x", "x" * 101, "é"):
        with pytest.raises(ConfigurationError, match="project"):
            _keys.key_document(key, bad)


def test_cursor_round_trip_and_damage() -> None:
    t = datetime(2024, 5, 1, 10, tzinfo=UTC)
    for oid in (ObjectId(), "abc123"):
        assert _query.decode_cursor(_query.encode_cursor({"time": t, "_id": oid})) == (t, oid)
    for bad in ("", "garbage", "eyJ0IjoxfQ"):
        with pytest.raises(_query.CursorError):
            _query.decode_cursor(bad)
    flt = _query.logs_filter("p", q="a.b", cursor=(t, "x"))
    assert flt["$and"][0] == {"project_id": "p", "message": {"$regex": r"a\.b", "$options": "i"}}


def test_otlp_severity_and_bodies() -> None:
    pytest.importorskip("opentelemetry.proto")
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

    from bucketq.server import _otlp

    assert [_otlp._level(n, "") for n in (1, 5, 9, 13, 17, 21, 30)] == [
        "trace", "debug", "info", "warn", "error", "fatal", "fatal"]  # fmt: skip
    assert _otlp._level(0, "WARNING") == "warning" and _otlp._level(0, "loud") == "info"
    req = logs_service_pb2.ExportLogsServiceRequest()
    lr = req.resource_logs.add().scope_logs.add().log_records.add()
    lr.body.array_value.values.add().int_value = 3
    now = datetime(2024, 1, 1, tzinfo=UTC)
    records, rejected, _ = _otlp.log_records(req, "p", now)
    assert rejected == 0 and records[0]["message"] == "[3]" and records[0]["time"] == now
    assert records[0]["service"] == "unknown"
    with pytest.raises(_otlp.OtlpError):
        _otlp.from_json("logs", [1])
    assert _otlp.media_type("application/json; charset=utf-8") == _otlp.JSON
    assert _otlp.media_type("text/plain") is None


async def test_an_exception_in_the_app_is_a_500_carrying_the_logged_request_id(caplog) -> None:
    pytest.importorskip("fastapi")
    import json

    import prometheus_client

    from bucketq.server._middleware import HttpMetrics, LastResort, Observe, RequestId

    async def broken(scope, receive, send):
        raise RuntimeError("boom")

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    metrics = HttpMetrics(prometheus_client.CollectorRegistry())
    app = RequestId(Observe(LastResort(broken), metrics=metrics))
    scope = {"type": "http", "method": "GET", "path": "/x", "headers": []}
    with caplog.at_level("ERROR", logger="bucketq.server"):
        await app(scope, receive, send)
    assert sent[0]["status"] == 500
    rid = dict(sent[0]["headers"])[b"x-request-id"].decode()
    assert json.loads(sent[1]["body"])["request_id"] == rid
    assert any(rid in r.getMessage() and r.exc_info for r in caplog.records)
