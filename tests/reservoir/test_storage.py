"""The MongoDB storage engine: fields, indexes, per-record errors, queries."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bucketq.reservoir import MongoReservoir

pytestmark = pytest.mark.timeout(60)


async def test_logs_are_stored_with_logtide_fields_and_bad_records_reported(adb):
    st = MongoReservoir(adb)
    res = await st.ingest([
        {"project_id": "p", "time": "2024-05-01T10:00:00Z", "service": "api", "level": "ERROR",
         "message": "boom", "metadata": {"a": 1}, "trace_id": "t1", "span_id": "s1",
         "session_id": "x", "hostname": "h", "ignored": "field"},
        {"project_id": "p", "message": 42},
        {"message": "no project"},
        {"project_id": "p", "time": 1714557600, "message": "epoch", "level": "info"},
    ])  # fmt: skip
    assert res["ingested"] == 2 and res["failed"] == 2
    assert [e["index"] for e in res["errors"]] == [1, 2]
    assert "message" in res["errors"][0]["error"] and "project_id" in res["errors"][1]["error"]
    rows = await st.query("log", project_id="p")
    assert [r["message"] for r in rows] == ["epoch", "boom"] or [r["message"] for r in rows] == [
        "boom",
        "epoch",
    ]
    boom = next(r for r in rows if r["message"] == "boom")
    assert boom["level"] == "error" and boom["metadata"] == {"a": 1} and "ignored" not in boom
    assert boom["time"].replace(tzinfo=UTC) == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert await st.query("log", project_id="p", level="error") == [boom]
    idx = await adb["logs"].index_information()
    assert idx["project_time"]["key"] == [("project_id", 1), ("time", -1)]
    assert (await st.health())["status"] == "ok"


async def test_spans_and_metrics(adb):
    st = MongoReservoir(adb)
    res = await st.ingest_spans(
        [{"project_id": "p", "trace_id": "t", "span_id": "s", "start_time": 0, "end_time": 0.25}]
    )
    assert res == {"ingested": 1, "failed": 0, "errors": []}
    (span,) = await st.query("span", trace_id="t")
    assert span["duration_ms"] == 250
    res = await st.ingest_metrics(
        [{"project_id": "p", "name": "cpu", "value": 0.5}, {"project_id": "p", "name": "x"}]
    )
    assert res["ingested"] == 1 and res["errors"][0]["index"] == 1
