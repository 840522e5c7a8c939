"""Hostile and careless requests against a real ``bucketq serve``: every limit holds while
the body is decoded, the service keeps answering others meanwhile, nothing is stored
that cannot be read back, compressed bodies are checked, idempotency keys are honest,
and every route follows one error discipline."""

from __future__ import annotations

import gzip
import json
import threading
import uuid
import zlib
from collections.abc import Callable
from datetime import UTC, datetime

import bson
import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from pymongo import MongoClient
from stored_logs import stored_logs

from waiting import eventually

from .helpers import Serve, log_batch

MiB = 1024 * 1024
PB = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


def _project() -> str:
    return f"hostile-{uuid.uuid4().hex[:8]}"


def _stored(mongo: MongoClient, db: str, project: str, coll: str = "logs") -> int:
    if coll == "logs":
        return len(stored_logs(mongo[db], {"project_id": project}))
    return mongo[db][coll].count_documents({"project_id": project})


def _len_field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field."""
    n, out = len(payload), bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    return bytes([(number << 3) | 2]) + bytes(out) + payload


def _logs_request(scope_logs: bytes) -> bytes:
    """ExportLogsServiceRequest { resource_logs { scope_logs: <scope_logs> } }."""
    return _len_field(1, _len_field(2, scope_logs))


def _deep(levels: int) -> dict:
    node: dict = {"leaf": 1}
    for _ in range(levels - 1):
        node = {"n": node}
    return node


def _record(**extra) -> dict:
    return {**log_batch(1)["logs"][0], **extra}


# -- item 1: bounded work per request ---------------------------------------------------------

#: name -> (path, body, headers): each is refused (413/422) without the work it asks for.
HOSTILE: dict[str, tuple[str, bytes, dict[str, str]]] = {
    "json 5 MiB of zeros": ("/api/v1/ingest", b'{"logs":[' + b"0," * (5 * MiB // 2 - 8) + b"0]}", JSON),
    "json 1.7M empty records": ("/api/v1/ingest", b'{"logs":[' + b"{}," * (5 * MiB // 3 - 8) + b"{}]}", JSON),
    "json one record, 2.6M values": (
        "/api/v1/ingest",
        json.dumps({"logs": [_record(metadata={"a": [0] * (5 * MiB // 2 - 100)})]}, separators=(",", ":")).encode(),
        JSON,
    ),
    "protobuf 2.6M empty records": ("/v1/logs", _logs_request(b"\x12\x00" * (5 * MiB // 2 - 16)), PB),
    "protobuf 2.6M empty records, gzip": (
        "/v1/logs",
        gzip.compress(_logs_request(b"\x12\x00" * (5 * MiB // 2 - 16))),
        {**PB, "Content-Encoding": "gzip"},
    ),
    "protobuf one record, 2.6M attributes": (
        "/v1/logs",
        _logs_request(_len_field(2, b"\x32\x00" * (5 * MiB // 2 - 32))),
        PB,
    ),
    "otlp json 100,000 empty records": (
        "/v1/logs",
        json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{}] * 100_000}]}]}).encode(),
        JSON,
    ),
}  # fmt: skip


def test_hostile_bodies_are_refused_while_health_keeps_answering(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    """Two clients keep hostile requests in flight; a third polls /health. Each hostile
    request is refused (413) with the service's error body, /health answers while they
    are in flight, and nothing is stored."""
    project = _project()
    key = keys(project)
    lock = threading.Lock()
    state = {"in_flight": 0, "health_during": 0, "sent": 0}
    answers: list[tuple[str, int, bytes]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def hostile(offset: int) -> None:
        names = list(HOSTILE)
        with serve.client(key) as c:
            i = offset
            while not stop.is_set():
                name = names[i % len(names)]
                path, body, headers = HOSTILE[name]
                with lock:
                    state["in_flight"] += 1
                try:
                    r = c.post(path, content=body, headers=headers)
                    answers.append((name, r.status_code, r.content))
                finally:
                    with lock:
                        state["in_flight"] -= 1
                        state["sent"] += 1
                i += 1

    def health() -> None:
        with serve.client() as c:
            while not stop.is_set():
                r = c.get("/health")
                with lock:
                    if r.status_code == 200 and state["in_flight"] > 0:
                        state["health_during"] += 1

    def reporting(fn: Callable[..., None], *args: object) -> Callable[[], None]:
        def run() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(exc)

        return run

    threads = [threading.Thread(target=reporting(hostile, k)) for k in (0, 3)]
    threads.append(threading.Thread(target=reporting(health)))
    for t in threads:
        t.start()
    try:
        eventually(
            lambda: errors or (state["sent"] >= 2 * len(HOSTILE) and state["health_during"] >= 20),
            timeout=120,
            what="every hostile case answered twice while /health answered",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(90)
    assert not errors, errors
    assert {name for name, _, _ in answers} == set(HOSTILE)
    for name, status, content in answers:
        assert status == 413, (name, status, content[:300])
        path, _, headers = HOSTILE[name]
        if path.startswith("/v1/") and headers["Content-Type"] == PB["Content-Type"]:
            assert status_pb2.Status.FromString(content).code == 8  # RESOURCE_EXHAUSTED
        elif path.startswith("/v1/"):
            assert json.loads(content)["code"] == 8
        else:
            assert json.loads(content)["error"] in ("Payload too large", "Too many records")
    assert _stored(mongo_client, serve.database, project) == 0


def test_record_and_value_counts_are_refused_at_the_first_past_the_limit(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    project = _project()
    with serve.client(keys(project)) as c:
        # 1,001 OTLP records, protobuf and JSON: 413 before any is mapped.
        record = logs_service_pb2.ExportLogsServiceRequest()
        lr = record.resource_logs.add().scope_logs.add().log_records.add()
        lr.body.string_value = "x"
        one = record.resource_logs[0].scope_logs[0].log_records[0].SerializeToString()
        r = c.post("/v1/logs", content=_logs_request(_len_field(2, one) * 1001), headers=PB)
        assert (
            r.status_code == 413
            and "BUCKETQ_MAX_RECORDS" in status_pb2.Status.FromString(r.content).message
        )
        body = {
            "resourceLogs": [
                {"scopeLogs": [{"logRecords": [{"body": {"stringValue": "x"}}] * 1001}]}
            ]
        }
        r = c.post("/v1/logs", json=body)
        assert r.status_code == 413 and "BUCKETQ_MAX_RECORDS" in r.json()["message"]
        # At the limit, both are stored.
        body["resourceLogs"][0]["scopeLogs"][0]["logRecords"] = [
            {"body": {"stringValue": "x"}}
        ] * 1000
        assert c.post("/v1/logs", json=body).status_code == 200
        # A malformed frame is a 400, not a crash or a 200.
        r = c.post("/v1/logs", content=b"\x0a\xff\xff\xff\xff\x0f", headers=PB)
        assert r.status_code == 400
    assert _stored(mongo_client, serve.database, project) == 1000  # fmt: skip


# -- item 2: storage amplification --------------------------------------------------------------


def test_shared_attributes_cannot_amplify_what_a_small_body_stores(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    """OTLP copies resource attributes into every record: 200 records under a 100 KB
    attribute (a few hundred bytes gzipped) would store 20 MB; refused. An ordinary
    batch (512 records, 1 KB of resource attributes) is stored."""
    project = _project()

    def request(records: int, attr_bytes: int) -> bytes:
        req = logs_service_pb2.ExportLogsServiceRequest()
        rl = req.resource_logs.add()
        kv = rl.resource.attributes.add()
        kv.key, kv.value.string_value = "blob", "a" * attr_bytes
        sl = rl.scope_logs.add()
        for i in range(records):
            sl.log_records.add().body.string_value = f"m{i}"
        return gzip.compress(req.SerializeToString())

    with serve.client(keys(project)) as c:
        bomb = request(200, 100_000)
        assert len(bomb) < 2000
        r = c.post("/v1/logs", content=bomb, headers={**PB, "Content-Encoding": "gzip"})
        assert r.status_code == 413, r.content
        assert "resource and scope attributes" in status_pb2.Status.FromString(r.content).message
        assert _stored(mongo_client, serve.database, project) == 0
        r = c.post(
            "/v1/logs", content=request(512, 1000), headers={**PB, "Content-Encoding": "gzip"}
        )
        assert r.status_code == 200, r.content
    assert _stored(mongo_client, serve.database, project) == 512


# -- item 3: nothing stored that cannot be read back -----------------------------------------


def test_deep_nesting_is_refused_naming_the_field_and_reads_never_fail(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    project = _project()
    with serve.client(keys(project)) as c:
        for levels in (33, 257):
            r = c.post(
                "/api/v1/ingest", json={"logs": [_record(), _record(metadata=_deep(levels))]}
            )
            assert r.status_code == 422, r.text
            err = r.json()
            assert err["details"][0] == {"index": 1, "field": "logs[1].metadata",
                                         "message": "nested more than 32 levels deep (BUCKETQ_MAX_DEPTH)"}  # fmt: skip
            assert "logs[1].metadata" in err["message"]
        span = {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331",
                "service": "api", "name": "GET /", "start_time": "2024-05-01T10:00:00Z",
                "attributes": _deep(40)}  # fmt: skip
        r = c.post("/api/v1/ingest/spans", json={"spans": [span]})
        assert r.status_code == 422 and r.json()["details"][0]["field"] == "spans[0].attributes"
        # Too deep for any decoder: a 400 with the reason.
        deep = b'{"logs": [' + b"[" * 5000 + b"]" * 5000 + b"]}"
        r = c.post("/api/v1/ingest", content=deep, headers=JSON)
        assert r.status_code == 400 and r.json()["error"] == "Malformed JSON"
        assert "nested" in r.json()["message"]
        # At the limit: stored and read back.
        assert (
            c.post("/api/v1/ingest", json={"logs": [_record(metadata=_deep(32))]}).status_code
            == 200
        )
        # OTLP: the record whose attribute nests too deep is rejected, the other stored.
        req = logs_service_pb2.ExportLogsServiceRequest()
        sl = req.resource_logs.add().scope_logs.add()
        sl.log_records.add().body.string_value = "fine"
        bad = sl.log_records.add()
        bad.body.string_value = "deep"
        v = bad.attributes.add()
        v.key = "nest"
        value = v.value
        for _ in range(40):  # arrays: protobuf's own limit (100 messages) allows 40
            value = value.array_value.values.add()
        value.string_value = "leaf"
        r = c.post("/v1/logs", content=req.SerializeToString(), headers=PB)
        assert r.status_code == 200
        answer = logs_service_pb2.ExportLogsServiceResponse.FromString(r.content)
        assert answer.partial_success.rejected_log_records == 1
        assert "'nest'" in answer.partial_success.error_message
        assert "BUCKETQ_MAX_DEPTH" in answer.partial_success.error_message
    assert _stored(mongo_client, serve.database, project) == 2

    # Whatever another writer of the database stored, a read answers 200.
    other = _project()
    buckets = mongo_client[serve.database]["log_buckets"]
    odd = [
        {"metadata": _deep(90)},  # MongoDB stores at most 100 levels
        {"metadata": [1, 2]},
        {"metadata": {"nan": float("nan"), "inf": float("inf"), "bytes": b"\x00\x01"}},
        {"message": 12, "level": None},
        {"service": ["not", "text"]},
        {"time": "not a time"},
    ]
    now = datetime.now(UTC)
    records = [{"_id": f"odd.{i}", "time": now, "service": "x", "level": "info", "message": "m", **d}
               for i, d in enumerate(odd)]  # fmt: skip
    buckets.insert_one({"_id": f"{len(other)}.{other}.0.odd", "p": other, "t0": now, "t1": now,
                        "n": len(odd), "c": [["x", "info", len(odd)]],
                        "b": b"".join(bson.encode(r) for r in records)})  # fmt: skip
    # ... with the slot markers that make it findable (docs/server.md, "The log store")
    second = int(now.timestamp())
    buckets.insert_many(
        [{"_id": f"{len(other)}.{other}.~{lv}.{second // 64**lv}"} for lv in range(7)]
    )
    with serve.client(keys(other)) as c:
        seen = []
        cursor = None
        for _ in range(10):
            r = c.get("/api/v1/logs", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
            assert r.status_code == 200, r.text
            seen += r.json()["logs"]
            cursor = r.json()["next_cursor"]
            if not cursor:
                break
    assert len(seen) >= len(odd) - 1  # a record without a time may end the pages
    shown = json.dumps(seen)
    assert "not shown" in shown and '"value": [1, 2]' in shown and '"nan"' in shown


# -- item 9: compressed bodies checked --------------------------------------------------------


def test_compressed_bodies_are_checked_and_decoded_whole(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    project = _project()
    req = logs_service_pb2.ExportLogsServiceRequest()
    sl = req.resource_logs.add().scope_logs.add()
    for i in range(10):
        sl.log_records.add().body.string_value = f"g{i}"
    raw = req.SerializeToString()
    gz = gzip.compress(raw)
    with serve.client(keys(project)) as c:

        def otlp(content: bytes, encoding: str) -> httpx.Response:
            return c.post("/v1/logs", content=content, headers={**PB, "Content-Encoding": encoding})

        for broken in (gz[: len(gz) // 2], gz[:-4], b"\x1f\x8b\x08\x00garbage", gz + b"trailing"):
            r = otlp(broken, "gzip")
            assert r.status_code == 400, (broken[:20], r.status_code)
            assert status_pb2.Status.FromString(r.content).code == 3
        assert otlp(raw, "br").status_code == 415
        # Two gzip members (what concatenating gzip files makes): decoded whole.
        half = len(raw) // 2
        r = otlp(gzip.compress(raw[:half]) + gzip.compress(raw[half:]), "gzip")
        assert r.status_code == 200 and not logs_service_pb2.ExportLogsServiceResponse.FromString(
            r.content
        ).HasField("partial_success")
        assert otlp(zlib.compress(raw), "deflate").status_code == 200
        # The JSON API: gzip read, an unknown encoding refused, a corrupt stream a 400.
        body = json.dumps(log_batch(3)).encode()
        r = c.post(
            "/api/v1/ingest",
            content=gzip.compress(body),
            headers={**JSON, "Content-Encoding": "gzip"},
        )
        assert r.status_code == 200 and r.json()["received"] == 3
        for encoding, status in (("br", 415), ("gzip, br", 415), ("compress", 415)):
            r = c.post(
                "/api/v1/ingest", content=body, headers={**JSON, "Content-Encoding": encoding}
            )
            assert r.status_code == status and r.json()["error"] == "Unsupported media type"
        r = c.post(
            "/api/v1/ingest",
            content=gzip.compress(body)[:-6],
            headers={**JSON, "Content-Encoding": "gzip"},
        )
        assert r.status_code == 400 and "truncated" in r.json()["message"]
    assert _stored(mongo_client, serve.database, project) == 10 + 10 + 3  # fmt: skip


# -- item 10: idempotency keys honest -------------------------------------------------------


def test_a_reused_idempotency_key_with_another_body_is_refused(
    serve: Serve, keys, mongo_client: MongoClient
) -> None:
    project = _project()
    first, second = log_batch(2, prefix="first"), log_batch(2, prefix="second")
    with serve.client(keys(project)) as c:
        key = {"Idempotency-Key": "order-7"}
        assert c.post("/api/v1/ingest", json=first, headers=key).status_code == 200
        assert c.post("/api/v1/ingest", json=first, headers=key).status_code == 200  # a retry
        r = c.post("/api/v1/ingest", json=second, headers=key)
        assert r.status_code == 422 and r.json()["error"] == "Idempotency key reused", r.text
        assert "same body" in r.json()["message"]
        # Keys are scoped per route: the same key on spans and on OTLP is another request.
        span = {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331",
                "service": "api", "name": "GET /", "start_time": "2024-05-01T10:00:00Z"}  # fmt: skip
        assert (
            c.post("/api/v1/ingest/spans", json={"spans": [span]}, headers=key).status_code == 200
        )
        otlp = {
            "resourceLogs": [
                {"scopeLogs": [{"logRecords": [{"body": {"stringValue": "otlp"}}] * 2}]}
            ]
        }
        assert c.post("/v1/logs", json=otlp, headers=key).status_code == 200
        otlp["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["body"]["stringValue"] = "changed"
        r = c.post("/v1/logs", json=otlp, headers=key)
        assert r.status_code == 422 and "same body" in r.json()["message"]
    messages = sorted(
        d["message"] for d in stored_logs(mongo_client[serve.database], {"project_id": project})
    )
    assert messages == ["first-0", "first-1", "otlp", "otlp"]  # fmt: skip


# -- item 11: one error discipline -------------------------------------------------------------

ROUTES: list[tuple[str, dict[str, str]]] = [
    ("/api/v1/ingest", JSON),
    ("/api/v1/ingest/spans", JSON),
    ("/api/v1/ingest/metrics", JSON),
    ("/v1/logs", PB),
    ("/v1/traces", JSON),
]


@pytest.mark.parametrize("body", [b"{not json", b"\x1f\x8bgarbage", b"x" * 100])
def test_authentication_comes_before_the_body_on_every_route(serve: Serve, body: bytes) -> None:
    with serve.client() as c:
        for path, headers in ROUTES:
            for key in ({}, {"X-API-Key": "lp_" + "0" * 64}):
                r = c.post(path, content=body, headers={**headers, **key})
                assert r.status_code == 401, (path, key, r.status_code, r.content[:200])


def test_malformed_json_is_a_400_with_its_reason(serve: Serve, keys) -> None:
    good = json.dumps(_record())
    cases: dict[bytes, str] = {
        ('{"logs": [' + good.replace('"info"', "NaN") + "]}").encode(): "NaN",
        ('{"logs": [' + good[:-1] + ', "metadata": {"x": Infinity}}]}').encode(): "Infinity",
        ('{"logs": [' + good[:-1] + ', "metadata": {"x": -Infinity}}]}').encode(): "Infinity",
        b'{"logs": [{"message": "caf\xe9"}]}': "UTF-8",
        b'{"logs": [' + b"{" * 3000: "",
        b'{"logs": []} trailing': "extra data",
    }
    with serve.client(keys(_project())) as c:
        for raw, reason in cases.items():
            for path in ("/api/v1/ingest", "/v1/logs"):
                r = c.post(path, content=raw, headers=JSON)
                assert r.status_code == 400, (path, raw[:60], r.text)
                body = r.json()
                message = body["message"]
                if path == "/api/v1/ingest":
                    assert body["error"] == "Malformed JSON" and body["request_id"]
                assert "not valid JSON" in message and reason in message, (path, message)


def test_time_must_be_iso_text_and_a_read_error_does_not_mention_storing(
    serve: Serve, keys
) -> None:
    with serve.client(keys(_project())) as c:
        for value in ("1", "1714557600", " 12.5 ", 1714557600):
            r = c.post("/api/v1/ingest", json={"logs": [_record(time=value)]})
            assert r.status_code == 422 and r.json()["details"][0]["field"] == "logs[0].time", value
            assert "stored" in r.json()["message"]
        r = c.get("/api/v1/logs", params={"limit": 0})
        assert r.status_code == 422 and "stored" not in r.json()["message"]
