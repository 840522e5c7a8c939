"""OTLP/HTTP into a running ``bucketq serve``: the OpenTelemetry SDK's own exporters
(protobuf and JSON), and hand-made requests for the answers OTLP specifies."""

from __future__ import annotations

import gzip
import json
import logging
import uuid

import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from pymongo import MongoClient
from stored_logs import count_logs, stored_logs

from .helpers import Serve

pytest.importorskip("opentelemetry.sdk")


def _project() -> str:
    return f"otel-{uuid.uuid4().hex[:8]}"


def _exporters(encoding: str):
    if encoding == "protobuf":
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.json.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter
    return OTLPLogExporter, OTLPSpanExporter


@pytest.mark.filterwarnings("ignore:.*LoggingHandler.*:DeprecationWarning")
@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_an_opentelemetry_sdk_exports_logs_and_traces(
    serve: Serve, keys, mongo_client: MongoClient, encoding: str
) -> None:
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    project = _project()
    headers = {"x-api-key": keys(project)}
    log_exp, span_exp = _exporters(encoding)
    resource = Resource.create(
        {"service.name": f"checkout-{encoding}", "deployment.environment": "test"}
    )
    logs = LoggerProvider(resource=resource)
    logs.add_log_record_processor(
        BatchLogRecordProcessor(log_exp(endpoint=f"{serve.url}/v1/logs", headers=headers))
    )
    traces = TracerProvider(resource=resource)
    traces.add_span_processor(
        BatchSpanProcessor(span_exp(endpoint=f"{serve.url}/v1/traces", headers=headers))
    )
    logger = logging.getLogger(f"test.otlp.{encoding}")
    logger.propagate = False
    handler = LoggingHandler(level=logging.DEBUG, logger_provider=logs)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        tracer = traces.get_tracer("test")
        with tracer.start_as_current_span("charge", attributes={"amount": 42}) as span:
            logger.warning("card declined", extra={"order.id": "o-17"})
            with tracer.start_as_current_span("db"):
                logger.debug("select 1")
        for i in range(20):
            logger.info("line %d", i)
        assert logs.force_flush(10_000) and traces.force_flush(10_000)
    finally:
        logger.removeHandler(handler)
        logs.shutdown()
        traces.shutdown()

    db = mongo_client[serve.database]
    stored = stored_logs(db, {"project_id": project})
    assert len(stored) == 22  # every record the SDK exported, nothing more
    warn = next(d for d in stored if d["message"] == "card declined")
    assert warn["service"] == f"checkout-{encoding}"
    assert warn["level"] == "warn"
    assert warn["metadata"]["order.id"] == "o-17"
    assert warn["metadata"]["resource"]["deployment.environment"] == "test"
    ctx = span.get_span_context()
    assert warn["trace_id"] == format(ctx.trace_id, "032x")
    assert warn["span_id"] == format(ctx.span_id, "016x")
    assert {d["level"] for d in stored} == {"warn", "debug", "info"}

    spans = {d["name"]: d for d in db["spans"].find({"project_id": project})}
    assert set(spans) == {"charge", "db"}
    assert (
        spans["db"]["parent_span_id"] == spans["charge"]["span_id"] == format(ctx.span_id, "016x")
    )
    assert spans["charge"]["attributes"]["amount"] == 42
    assert spans["charge"]["kind"] == "internal" and spans["charge"]["duration_ms"] >= 0

    # And they read back through the query API.
    with serve.client(headers["x-api-key"]) as c:
        page = c.get(
            "/api/v1/logs", params={"service": f"checkout-{encoding}", "level": "warn"}
        ).json()
    assert [r["message"] for r in page["logs"]] == ["card declined"]


def _logs_request(trace_ids: list[bytes]) -> logs_service_pb2.ExportLogsServiceRequest:
    req = logs_service_pb2.ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    kv = rl.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "raw"
    sl = rl.scope_logs.add()
    for i, tid in enumerate(trace_ids):
        lr = sl.log_records.add()
        lr.time_unix_nano = 1_714_557_600_000_000_000 + i
        lr.severity_number = 17
        lr.body.string_value = f"raw-{i}"
        lr.trace_id = tid
    return req


def test_otlp_answers(serve: Serve, keys, mongo_client: MongoClient) -> None:
    project = _project()
    db = mongo_client[serve.database]
    pb = {"Content-Type": "application/x-protobuf"}
    with serve.client(keys(project)) as c:
        # Success: 200, an empty response in the request's encoding.
        r = c.post(
            "/v1/logs", content=_logs_request([b"\x01" * 16]).SerializeToString(), headers=pb
        )
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
        resp = logs_service_pb2.ExportLogsServiceResponse.FromString(r.content)
        assert not resp.HasField("partial_success")
        # gzip, as the exporters' compression option sends it.
        body = gzip.compress(_logs_request([b""]).SerializeToString())
        r = c.post("/v1/logs", content=body, headers={**pb, "Content-Encoding": "gzip"})
        assert r.status_code == 200, r.content
        # Partial success: one record with an impossible trace id is rejected, told why.
        r = c.post(
            "/v1/logs",
            content=_logs_request([b"\x02" * 16, b"\x03" * 5]).SerializeToString(),
            headers=pb,
        )
        resp = logs_service_pb2.ExportLogsServiceResponse.FromString(r.content)
        assert r.status_code == 200 and resp.partial_success.rejected_log_records == 1
        assert "trace_id" in resp.partial_success.error_message
        # A record storage could not hold (a NUL in an attribute key) is rejected alone.
        req = _logs_request([b"", b""])
        kv = req.resource_logs[0].scope_logs[0].log_records[1].attributes.add()
        kv.key, kv.value.int_value = "bad\x00key", 1
        r = c.post("/v1/logs", content=req.SerializeToString(), headers=pb)
        resp = logs_service_pb2.ExportLogsServiceResponse.FromString(r.content)
        assert r.status_code == 200 and resp.partial_success.rejected_log_records == 1
        # The same in OTLP JSON: hex ids, camelCase, integer enums, int64 as strings.
        doc = {"resourceLogs": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json"}}]},
               "scopeLogs": [{"logRecords": [
                   {"timeUnixNano": "1714557600000000000", "severityNumber": 9, "body": {"stringValue": "ok"},
                    "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "unknownField": 1},
                   {"severityText": "ERROR", "body": {"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "7"}}]}},
                    "traceId": "abcd"}]}]}]}  # fmt: skip
        r = c.post("/v1/logs", json=doc)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.json() == {
            "partialSuccess": {
                "rejectedLogRecords": "1",
                "errorMessage": r.json()["partialSuccess"]["errorMessage"],
            }
        }
        # Errors: google.rpc.Status in the request's encoding, not retryable (4xx).
        r = c.post("/v1/logs", content=b"\xff\xff\xff garbage", headers=pb)
        assert r.status_code == 400
        st = status_pb2.Status.FromString(r.content)
        assert st.code == 3 and "protobuf" in st.message
        r = c.post("/v1/traces", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["code"] == 3
        r = c.post(
            "/v1/logs",
            json={"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "zz"}]}]}]},
        )
        assert r.status_code == 400 and "traceId" in r.json()["message"]
        r = c.post("/v1/logs", content=b"x", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        r = c.post(
            "/v1/traces", content=b"\x1f\x8b garbage", headers={**pb, "Content-Encoding": "gzip"}
        )
        assert r.status_code == 400
        big = gzip.compress(b"\x00" * (6 * 1024 * 1024))  # a gzip bomb is cut at the limit
        r = c.post("/v1/logs", content=big, headers={**pb, "Content-Encoding": "gzip"})
        assert r.status_code == 413 and status_pb2.Status.FromString(r.content).code == 8
        # A trace request.
        tr = trace_service_pb2.ExportTraceServiceRequest()
        sp = tr.resource_spans.add().scope_spans.add().spans.add()
        sp.trace_id, sp.span_id, sp.name, sp.kind = b"\x04" * 16, b"\x05" * 8, "op", 2
        sp.start_time_unix_nano, sp.end_time_unix_nano = (
            1_714_557_600_000_000_000,
            1_714_557_600_500_000_000,
        )
        r = c.post("/v1/traces", content=tr.SerializeToString(), headers=pb)
        assert r.status_code == 200
        # A span that ends before it starts is rejected alone (a negative duration was
        # stored); one with no start starts at its end (its duration was the time since 1970).
        tr2 = trace_service_pb2.ExportTraceServiceRequest()
        spans = tr2.resource_spans.add().scope_spans.add()
        for i, (t0, t1) in enumerate(((2_000, 1_000), (0, 1_714_557_600_500_000_000))):
            bad = spans.spans.add()
            bad.trace_id, bad.span_id, bad.name = b"\x06" * 16, bytes([7, i]) * 4, f"odd{i}"
            bad.start_time_unix_nano, bad.end_time_unix_nano = t0, t1
        r = c.post("/v1/traces", content=tr2.SerializeToString(), headers=pb)
        assert r.status_code == 200
        answer = trace_service_pb2.ExportTraceServiceResponse.FromString(r.content)
        assert answer.partial_success.rejected_spans == 1
        assert "before its start" in answer.partial_success.error_message
    with serve.client() as c:
        r = c.post("/v1/logs", content=_logs_request([b""]).SerializeToString(), headers=pb)
        assert r.status_code == 401 and status_pb2.Status.FromString(r.content).code == 16
    assert len(stored_logs(db, {"project_id": project})) == 5
    assert (
        count_logs(
            db,
            {
                "project_id": project,
                "service": "json",
                "level": "error",
                "message": json.dumps({"a": 7}),
            },
        )
        == 0
    )  # rejected: bad trace id
    span = db["spans"].find_one({"project_id": project, "name": "op"})
    assert span["kind"] == "server" and span["duration_ms"] == 500 and span["service"] == "unknown"
    assert db["spans"].count_documents({"project_id": project, "name": "odd0"}) == 0
    no_start = db["spans"].find_one({"project_id": project, "name": "odd1"})
    assert no_start is not None and no_start["duration_ms"] == 0
    assert no_start["start_time"] == no_start["end_time"]


def _metric(text: str, name: str) -> float:
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{"))


def test_records_that_came_through_otlp_get_no_dispatch_delay(
    mongo_uri: str, mongo_client: MongoClient, tmp_path
) -> None:
    """With a dispatch delay for logs, the LogTide-shaped route's records are delayed and
    OTLP's are not (the route marks their origin): the buffer's metrics say which."""
    from bucketq.server import _keys

    from .helpers import log_batch

    database = f"bqs_otlp_{uuid.uuid4().hex[:8]}"
    db = mongo_client[database]
    key = _keys.create_key(db, "otlp-delay")
    env = {"RESERVOIR_BUFFER_ENABLED": "true", "RESERVOIR_BUFFER_TRANSPORT": "memory",
           "RESERVOIR_BUFFER_DISPATCH_DELAY_BY_KIND": "log=1000,span=1000",
           "RESERVOIR_BUFFER_MAX_BATCH_AGE_MS": "100"}  # fmt: skip
    serve = Serve(mongo_uri, database, tmp_path / "serve.log", **env).start()
    pb = {"Content-Type": "application/x-protobuf"}
    with serve.stops_cleanly():
        with serve.client(key) as c:
            assert c.post("/api/v1/ingest", json=log_batch(3, prefix="api")).status_code == 200
            r = c.post("/v1/logs", content=_logs_request([b"\x01" * 16] * 2).SerializeToString(),
                       headers=pb)  # fmt: skip
            assert r.status_code == 200
            text = c.get("/metrics").text
        assert _metric(text, "reservoir_buffer_enqueued_total") == 5
        assert _metric(text, "reservoir_buffer_delayed_total") == 3
    assert len(stored_logs(db)) == 5  # the delayed ones too, by the drain at the latest
    mongo_client.drop_database(database)
