"""The service's pure parts: configuration, keys, the OTLP mapping, the logs cursor."""

from __future__ import annotations

import base64
import json
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import pytest
from bson import ObjectId
from fastapi import Depends, FastAPI, Query
from pydantic import BaseModel, Field

from bucketq._validate import printable
from bucketq.errors import ConfigurationError
from bucketq.server import _keys, _query, config_table, from_env
from bucketq.server._framing import head_problem
from bucketq.server._params import KnownQuery, accepted_query

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
        cfg.max_records == 50
        and cfg.tee_stream == "logs"
        and cfg.max_body_bytes == 12 * 1024 * 1024
    )
    for env, value in (("BUCKETQ_MAX_BODY_BYTES", "lots"), ("BUCKETQ_KEY_CACHE_MS", "5000"),
                       ("BUCKETQ_MAX_RECORDS", "0"), ("BUCKETQ_TEE_STREAM", "a$b"),
                       ("BUCKETQ_TEE_STREAM", "system.x"), ("BUCKETQ_DATABASE", "a.b"),
                       ("BUCKETQ_MONGODB_URI", "localhost")):  # fmt: skip
        with pytest.raises(ConfigurationError, match=f"^{env} must be .*; got"):
            from_env({env: value})
    assert from_env({}, database="x", mongodb_uri=None).database == "x"


def test_keys_are_hashed_and_checked() -> None:
    secret = secrets.token_bytes(32)
    key = _keys.new_key(secret)
    assert _keys.key_format(key) == _keys.CHECKED and _keys.checksum_ok(secret, key)
    assert not _keys.checksum_ok(secrets.token_bytes(32), key)  # another deployment's secret
    for i in range(len(_keys.KEY_PREFIX), len(key)):  # any one character changed
        other = key[:i] + ("0" if key[i] != "0" else "1") + key[i + 1 :]
        assert not _keys.checksum_ok(secret, other), i
    old = _keys.KEY_PREFIX + "ab" * 32  # made before keys had a checksum
    assert _keys.key_format(old) == _keys.LEGACY
    for bad in (key[:-1], key + "0", old[:-1], key.upper(), "bq_" + "g" * 64, ""):
        assert _keys.key_format(bad) is None and not _keys.looks_like_key(bad), bad
    doc = _keys.key_document(key, "shop")
    assert doc["_id"] == _keys.hash_key(key) != key and doc["prefix"] == key[:11]
    assert key not in str(doc)
    for bad in ("", "a b", "-x", "x" * 101, "é"):
        with pytest.raises(ConfigurationError, match="project"):
            _keys.key_document(key, bad)


def test_cursor_round_trip_and_damage() -> None:
    t = datetime(2024, 5, 1, 10, tzinfo=UTC)
    for rid in ("r17a4e1db3ed2.0", "abc123", ""):
        assert _query.decode_cursor(_query.encode_cursor((t, rid))) == (t, rid)
    # A cursor of the previous release (its record's id an ObjectId) still reads.
    oid = ObjectId()
    old = base64.urlsafe_b64encode(
        json.dumps({"t": t.isoformat(), "i": str(oid), "o": True}).encode()
    )
    assert _query.decode_cursor(old.decode()) == (t, str(oid))
    for bad in ("", "garbage", "eyJ0IjoxfQ"):
        with pytest.raises(_query.CursorError):
            _query.decode_cursor(bad)
    flt = _query.logs_filter(q="a.b", level="ERROR", cursor=(t, "x"))
    assert flt.keeps({"time": t, "_id": "w", "level": "error", "message": "see A.B here"})
    assert not flt.keeps(
        {"time": t, "_id": "x", "level": "error", "message": "a.b"}
    )  # not before x
    assert not flt.keeps({"time": t, "_id": "a", "level": "error", "message": "axb"})  # no regex


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


def test_bodies_are_decoded_within_their_limits() -> None:
    """The decoding limits without a server: compressed streams, value and record counts
    before decoding, nesting named by field, the protobuf wire walk."""
    import gzip
    import json
    import zlib

    pytest.importorskip("fastapi")
    from starlette.exceptions import HTTPException

    from bucketq.server import _decode as d

    def status(fn, *args, **kw) -> int:
        try:
            fn(*args, **kw)
        except HTTPException as exc:
            return exc.status_code
        return 200

    assert d.decompress(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 10) == b"abcd"
    assert d.decompress(zlib.compress(b"abc"), "deflate", 10) == b"abc"
    # Raw deflate (no zlib header), as some clients send it, is read too.
    raw = zlib.compressobj(wbits=-15)
    assert d.decompress(raw.compress(b"abc" * 10) + raw.flush(), "deflate", 100) == b"abc" * 10
    gz = gzip.compress(b"x" * 1000)
    for broken in (gz[:-4], gz[:10], b"\x1f\x8bjunk", gz + b"junk", zlib.compress(b"a") + b"z"):
        assert status(d.decompress, broken, "gzip", 5000) == 400
    assert status(d.decompress, gzip.compress(b"\0" * 10_000), "gzip", 9_999) == 413
    assert status(d.encoding_of, "br") == 415 and d.encoding_of("X-GZIP") == "gzip"

    # Commas and brackets inside strings are not values: such a body is taken.
    text = json.dumps({"logs": [{"message": ", [ {" * 1000}]})
    d.check_values(text, 100)
    assert status(d.check_values, "[" + "0," * 200 + "0]", 100) == 413
    logs = d.json_records(text.encode(), "logs", max_records=1, max_depth=2)
    assert logs == [{"message": ", [ {" * 1000}]
    assert status(d.json_records, b'{"logs": [{}, {}]}', "logs", max_records=1, max_depth=2) == 413
    deep = json.dumps({"logs": [{"a": 1}, {"m": 1, "meta": {"x": [[1]]}}]}).encode()
    try:
        d.json_records(deep, "logs", max_records=5, max_depth=2)
        raise AssertionError("not refused")
    except HTTPException as exc:
        assert exc.status_code == 422 and exc.details[0]["field"] == "logs[1].meta"  # type: ignore[attr-defined]
    for raw in (b'{"a": NaN}', b'{"a": -Infinity}', b"\xff", b'{"a": 1} x', b"[" * 5000):
        assert status(d.json_records, raw, "logs", max_records=100, max_depth=2) == 400, raw[:10]

    # The wire walk: records and fields counted, depth first, before parsing.
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

    req = logs_service_pb2.ExportLogsServiceRequest()
    sl = req.resource_logs.add().scope_logs.add()
    for _ in range(5):
        lr = sl.log_records.add()
        lr.body.string_value = "m"
        lr.attributes.add(key="a").value.array_value.values.add().int_value = 1
    raw = req.SerializeToString()
    assert d.protobuf_budget("logs", raw, max_records=5, max_fields=1000) == 5
    assert status(d.protobuf_budget, "logs", raw, max_records=4, max_fields=1000) == 413
    assert status(d.protobuf_budget, "logs", raw, max_records=5, max_fields=20) == 413
    for broken in (raw[:-3], b"\x0a\xff\xff\xff\xff\x0f", b"\x0f"):
        assert status(d.protobuf_budget, "logs", broken, max_records=5, max_fields=1000) == 400


def test_a_late_event_loop_is_put_down_to_what_ran_meanwhile() -> None:
    from bucketq.server._admission import lag_cause

    # 200 ms late: the loop's thread ran 150 ms of it (work on the loop, a collection)
    assert lag_cause(0.2, 0.15, 0.16) == "loop"
    # the process's other threads ran (the GIL), or nothing of it ran (the CPU)
    assert lag_cause(0.2, 0.01, 0.15) == "threads"
    assert lag_cause(0.2, 0.01, 0.02) == "cpu"


def test_reads_of_a_project_wait_a_moment_then_are_refused() -> None:
    import asyncio

    from bucketq.errors import Overloaded
    from bucketq.server._admission import ProjectReads

    async def run() -> None:
        gate = ProjectReads(1, 5, wait=0.5, waiting=1)
        order: list[str] = []
        release = asyncio.Event()

        async def read(name: str) -> None:
            async with gate.admit("p"):
                order.append(name)
                await release.wait()

        first = asyncio.create_task(read("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(read("second"))  # waits for the first
        await asyncio.sleep(0)
        with pytest.raises(Overloaded) as refused:  # a third: no room to wait
            async with gate.admit("p"):
                pass
        assert refused.value.status == 429 and refused.value.retry_after == 5
        async with gate.admit("other"):  # another project is not held
            order.append("other")
        release.set()
        await asyncio.gather(first, second)
        assert order == ["first", "other", "second"]
        release.clear()
        holder = asyncio.create_task(read("holder"))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded):  # waited its moment, still held
            async with gate.admit("p", budget=0.05):
                pass
        release.set()
        await holder
        assert gate._sems == {} and gate._active == {}  # nothing kept for idle projects

    asyncio.run(run())


def test_a_project_s_reads_get_their_share_of_the_time() -> None:
    import asyncio

    from bucketq.errors import Overloaded
    from bucketq.server._admission import ProjectReads

    now = [0.0]
    gate = ProjectReads(4, 5, share=0.25, burst=1.0, clock=lambda: now[0])

    async def read(seconds: float, project: str = "p") -> None:
        async with gate.admit(project):
            now[0] += seconds

    async def run() -> None:
        await read(1.5)  # alone: the store is all its own, nothing owed
        await read(0.1)
        gate.note("other")  # another project ingests
        await read(0.1)  # what it read alone is not held against it
        await read(1.5)  # 1.5 s owed (the 0.1 drained meanwhile): over the 1 s burst
        with pytest.raises(Overloaded) as refused:
            await read(0.1)
        assert refused.value.status == 429
        assert refused.value.retry_after == pytest.approx(2.0)  # 0.5 s over / 0.25
        await read(0.1, "other")  # the other project's reads are not held
        now[0] += 2.0  # drained at a quarter of a second per second
        await read(0.1)
        now[0] += 4.0  # "other" was last served 4 s ago: past the 3 s window
        await read(3.0)
        await read(0.1)  # read alone again: not owed, not held back
        gate.note("other")
        await read(1.5)
        with pytest.raises(Overloaded):  # served again: its reads owe again
            await read(0.1)

    asyncio.run(run())


def test_printable_escapes_what_would_start_a_line_or_drive_a_terminal() -> None:
    assert printable("jobs.dlq") == "jobs.dlq"
    assert printable("q\nFORGED\r\x1b[2J\u2028\t\ud800 end") == (
        "q\\nFORGED\\r\\x1b[2J\\u2028\\t\\ud800 end"
    )
    assert printable("x" * 2000, 10) == "xxxxxxxxxx...(2000 characters)"


def test_head_problem_reads_a_head_as_strictly_as_rfc_9112_asks() -> None:
    ok = b"POST /api/v1/ingest?x=1 HTTP/1.1\r\nHost: [::1]:8080\r\nX-A: b\tc\r\nContent-Length: 2\r\n\r\n{}"
    assert head_problem(ok) is None
    assert head_problem(b"GET / HTTP/1.1\r\nHost: a\x01") is None  # not whole yet: h11 waits
    refused = {
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n": "Content-Length and Transfer-Encoding",
        b"POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\ncontent-length: 1\r\n\r\n": "Content-Length and Transfer-Encoding",
        b"GET / HTTP/1.1\nHost: a\n\n": "bare LF",
        b"GET / HTTP/1.1\r\nHost: a\r\n\n": "bare LF",
        b"GET / HTTP/1.1\r\nHost: a\x00b\r\n\r\n": "control character",
        b"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n": "control character",
        b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n": "Host holds characters",
        b"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n": "more than once",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\t2\r\n\r\n": "folded",
        b"GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n": "request target",
    }  # fmt: skip
    for head, why in refused.items():
        problem = head_problem(head)
        assert problem is not None and why in problem, (head, problem)


class _Page(BaseModel):
    offset: int = 0
    size: int = Field(10, alias="pageSize")


def _org(org: str = "") -> str:
    return org


def _route_with_a_query(
    page: Annotated[_Page, Query()],
    since: Annotated[str | None, Query(alias="from")] = None,
    org: str = Depends(_org),
) -> None:
    return None


def test_the_accepted_query_parameters_are_the_routes_own() -> None:
    """The names come from the route and its dependencies as FastAPI sees them (aliases,
    a model's fields): a parameter added to a route is accepted with it."""
    app = FastAPI()
    app.get("/x", dependencies=[KnownQuery])(_route_with_a_query)
    route = next(r for r in app.routes if getattr(r, "path", "") == "/x")
    assert accepted_query(route.dependant) == {"offset", "pageSize", "from", "org"}


def test_otlp_statuses_carry_the_google_rpc_codes_code_proto_gives_them() -> None:
    from google.rpc import code_pb2

    from bucketq.server._otlp import HTTP_TO_RPC

    # google/rpc/code.proto's HTTP mapping, for every status it names.
    assert {s: HTTP_TO_RPC[s] for s in (400, 401, 403, 404, 409, 429, 499, 500, 501, 503, 504)} == {
        400: code_pb2.INVALID_ARGUMENT, 401: code_pb2.UNAUTHENTICATED, 403: code_pb2.PERMISSION_DENIED,
        404: code_pb2.NOT_FOUND, 409: code_pb2.ABORTED, 429: code_pb2.RESOURCE_EXHAUSTED,
        499: code_pb2.CANCELLED, 500: code_pb2.INTERNAL, 501: code_pb2.UNIMPLEMENTED,
        503: code_pb2.UNAVAILABLE, 504: code_pb2.DEADLINE_EXCEEDED,
    }  # fmt: skip
