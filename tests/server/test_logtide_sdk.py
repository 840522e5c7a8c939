"""LogTide's own Python SDK (``logtide-sdk`` from PyPI), unchanged, against a real
``bucketq serve``: what a LogTide user does with it works the same."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from logtide_sdk import (
    AggregatedStatsOptions,
    AsyncLogTideClient,
    ClientOptions,
    LogEntry,
    LogLevel,
    LogTideClient,
    LogTideHandler,
    QueryOptions,
)
from pymongo import MongoClient

from bucketq.server import _keys
from waiting import eventually, eventually_async

from .helpers import TLS, Serve


@pytest.fixture(scope="module")
def lt(mongo_uri: str, server_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """One serve for the module: quick heartbeats, two streams a project."""
    s = Serve(mongo_uri, server_db, Path(tmp_path_factory.mktemp("lt")) / "serve.log",
              BUCKETQ_STREAM_HEARTBEAT_MS="200", BUCKETQ_STREAMS_PER_PROJECT="2").start()  # fmt: skip
    yield s
    s.terminate()


@pytest.fixture
def key(mongo_client: MongoClient, server_db: str) -> str:
    return _keys.create_key(mongo_client[server_db], f"lt-{uuid.uuid4().hex[:8]}")


def _client(serve: Serve, key: str, **kw) -> LogTideClient:
    # flush_interval 0: the test flushes (no timer thread left behind)
    return LogTideClient(ClientOptions(api_url=serve.url, api_key=key, flush_interval=0, **kw))


def test_sync_client_writes_then_pages_by_offset_and_reads_a_trace(lt: Serve, key: str) -> None:
    c = _client(lt, key)
    with c.with_trace_id("request-123"):  # the SDK's own example: not hex
        c.info("api", "request started", {"path": "/checkout"})
        c.error("api", "payment failed", ValueError("card declined"))
    c.log(LogEntry(service="worker", level=LogLevel.WARN, message="slow job",
                   session_id="sess-42", span_id="op-7"))  # fmt: skip
    for i in range(3):
        c.debug("worker", f"tick {i}")
    c.flush()
    m = c.get_metrics()
    assert (m.logs_sent, m.logs_dropped, m.errors) == (6, 0, 0)

    # A pager that adds the page's size to the offset until a page is empty stops, and
    # sees every record once.
    seen, offset = [], 0
    while True:
        page = c.query(QueryOptions(limit=2, offset=offset))
        assert page.total == 6
        if not page.logs:
            break
        seen += [r["message"] for r in page.logs]
        offset += len(page.logs)
    assert sorted(seen) == sorted(["request started", "payment failed", "slow job",
                                   "tick 0", "tick 1", "tick 2"])  # fmt: skip
    assert c.query(QueryOptions(level=LogLevel.ERROR)).total == 1
    assert c.query(QueryOptions(service="worker", q="tick")).total == 3

    slow = c.query(QueryOptions(q="slow job")).logs[0]
    assert slow["session_id"] == slow["sessionId"] == "sess-42"
    assert slow["span_id"] == "op-7" and slow["metadata"]["sdk"]["name"]

    trace = c.get_by_trace_id("request-123")["logs"]  # LogTide answers {"logs": [...]}
    assert [r["message"] for r in trace] == ["request started", "payment failed"]
    assert {r["traceId"] for r in trace} == {"request-123"}
    assert trace[1]["metadata"]["exception"]["type"] == "ValueError"
    c.close()


def test_aggregated_stats_count_by_interval_service_and_error(lt: Serve, key: str) -> None:
    c = _client(lt, key)
    for i in range(4):
        c.info("api", f"ok {i}")
    c.error("api", "db timeout")
    c.error("billing", "db timeout")
    c.critical("billing", "disk full")
    c.flush()
    now = datetime.now(UTC)
    stats = c.get_aggregated_stats(AggregatedStatsOptions(
        from_time=now - timedelta(hours=1), to_time=now + timedelta(minutes=1), interval="1m"))  # fmt: skip
    assert sum(b["total"] for b in stats.timeseries) == 7
    levels: dict[str, int] = {}
    for b in stats.timeseries:
        for lv, n in b["by_level"].items():
            levels[lv] = levels.get(lv, 0) + n
    assert levels == {"info": 4, "error": 2, "critical": 1}
    assert stats.top_services[0] == {"service": "api", "count": 5}
    assert {"message": "db timeout", "count": 2} in stats.top_errors
    only = c.get_aggregated_stats(AggregatedStatsOptions(
        from_time=now - timedelta(hours=1), to_time=now + timedelta(minutes=1), service="billing"))  # fmt: skip
    assert sum(b["total"] for b in only.timeseries) == 2
    c.close()


def test_the_logging_handler_and_the_dsn(lt: Serve, key: str) -> None:
    host = lt.url.removeprefix("http://")
    c = LogTideClient(ClientOptions(dsn=f"http://{key}@{host}", flush_interval=0))
    logger = logging.getLogger(f"lt-{key[-6:]}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(LogTideHandler(client=c, service="app"))
    logger.warning("disk at %d%%", 91)
    try:
        raise KeyError("user")
    except KeyError:
        logger.exception("lookup failed")
    c.flush()
    got = {r["message"].splitlines()[0]: r for r in c.query(QueryOptions(service="app")).logs}
    assert got["disk at 91%"]["level"] == "warn"
    failed = got["lookup failed"]  # the handler's message carries the traceback after it
    assert failed["level"] == "error" and failed["metadata"]["exception"]["type"] == "KeyError"
    c.close()


def test_a_full_default_batch_of_large_records_is_stored(lt: Serve, key: str) -> None:
    c = _client(lt, key)
    for i in range(100):  # the SDK's batch size, each record near its 100 KB limit
        c.info("big", f"{i} " + "x" * 90_000)
    c.flush()
    assert c.get_metrics().logs_dropped == 0
    assert c.query(QueryOptions(service="big", limit=1)).total == 100
    c.close()


def test_the_live_stream_sends_new_records_and_heartbeats(lt: Serve, key: str) -> None:
    c = _client(lt, key)
    got: list[dict] = []
    stop = c.stream(on_log=got.append, filters={"level": "error"})
    eventually(lambda: any(e["type"] == "connected" for e in got), 10, what="connected")
    c.info("api", "not an error")
    c.error("api", "live error")
    c.flush()
    event = eventually(lambda: next((e for e in got if e["type"] == "log"), None), 15,
                       what="the error streamed")  # fmt: skip
    assert event["data"]["message"] == "live error" and event["data"]["level"] == "error"
    assert all(e["data"]["level"] == "error" for e in got if e["type"] == "log")

    # The key as `token` (this route only), heartbeats while nothing happens, a bound on a
    # project's streams (the SDK's stream above is one of two).
    with httpx.Client(verify=TLS, base_url=lt.url, timeout=15) as h:
        with h.stream("GET", "/api/v1/logs/stream", params={"token": key}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert h.get("/api/v1/logs/stream", params={"token": key}).status_code == 429
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert any(line == ": heartbeat" for line, _ in zip(lines, range(10), strict=False))
        assert h.get("/api/v1/logs", params={"token": key}).status_code == 400  # not a key here
    stop()
    assert key not in lt.output()  # a key in the URL is never written to the log
    c.close()


async def test_async_client_writes_reads_and_streams(lt: Serve, key: str) -> None:
    async with AsyncLogTideClient(
        ClientOptions(api_url=lt.url, api_key=key, flush_interval=0)
    ) as c:
        got: list[dict] = []
        task = asyncio.create_task(c.stream(on_log=got.append))
        await eventually_async(lambda: got, 10, what="connected")
        await c.info("api", "async hello", trace_id="4bf92f3577b34da6a3ce929d0e0e4736")
        await c.warn("api", "async warning")
        await c.flush()
        page = await c.query(QueryOptions(limit=1, offset=1))
        assert page.total == 2 and [r["message"] for r in page.logs] == ["async hello"]
        trace = await c.get_by_trace_id("4BF92F3577B34DA6A3CE929D0E0E4736")  # any case: one id
        assert [r["message"] for r in trace["logs"]] == ["async hello"]
        now = datetime.now(UTC)
        stats = await c.get_aggregated_stats(AggregatedStatsOptions(
            from_time=now - timedelta(hours=1), to_time=now + timedelta(minutes=1)))  # fmt: skip
        assert sum(b["total"] for b in stats.timeseries) == 2
        await eventually_async(lambda: sum(e["type"] == "log" for e in got) == 2, 15,
                               what="both records streamed")  # fmt: skip
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_span_export_to_logtides_path_is_stored(
    lt: Serve, key: str, mongo_client: MongoClient, server_db: str
) -> None:
    from logtide_sdk.otel import configure_tracing

    provider = configure_tracing(api_url=lt.url, api_key=key, service="shop", set_global=False)
    with provider.get_tracer("t").start_as_current_span("checkout"):
        pass
    provider.force_flush()
    provider.shutdown()
    project = mongo_client[server_db]["api_keys"].find_one({"_id": _keys.hash_key(key)})["project"]
    spans = list(mongo_client[server_db]["spans"].find({"project_id": project}))
    assert [s["name"] for s in spans] == ["checkout"] and spans[0]["service"] == "shop"


def test_streams_end_with_their_reader(lt: Serve, key: str) -> None:
    """A closed stream gives its place back: a project opens streams again and again."""

    def open_one() -> bool:
        with httpx.Client(verify=TLS, base_url=lt.url, timeout=15, headers={"X-API-Key": key}) as h:
            with h.stream("GET", "/api/v1/logs/stream") as r:
                return r.status_code == 200 and next(r.iter_lines()).startswith("data: ")

    for _ in range(5):
        assert eventually(open_one, 10, what="a stream to open")
