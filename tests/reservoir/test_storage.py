"""The MongoDB storage engine: fields, indexes, per-record errors, queries."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from stored_logs import astored_logs

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
    idx = await adb["log_buckets"].index_information()
    assert idx["project_t1"]["key"] == [("p", 1), ("t1", 1)]
    assert idx["trace"]["key"] == [("tr", 1), ("p", 1)]
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


@pytest.mark.parametrize(
    "bad,words",
    [
        ({"time": float("nan")}, ["time", "finite"]),
        ({"time": float("inf")}, ["time", "finite"]),
        ({"time": 1e20}, ["time", "out of range"]),
        ({"metadata": {"a\x00b": 1}}, ["BSON", "NULL"]),
        ({"metadata": {"n": 2**70}}, ["BSON", "8-byte"]),
        ({"metadata": {1: "int key"}}, ["BSON", "string keys"]),
        ({"message": "\udc80"}, ["BSON", "surrogates"]),
        ({"_id": 12}, ["_id", "string"]),
    ],
)
async def test_one_bad_record_fails_alone_and_its_neighbours_are_stored(adb, bad, words):
    st = MongoReservoir(adb)
    recs = [{"project_id": "p", "message": f"m{i}"} for i in range(5)]
    recs[2] = {**recs[2], **bad}
    res = await st.ingest(recs)
    assert res["ingested"] == 4 and res["failed"] == 1
    (err,) = res["errors"]
    assert err["index"] == 2 and all(w in err["error"] for w in words), err
    stored = sorted(d["message"] for d in await astored_logs(adb))
    assert stored == ["m0", "m1", "m3", "m4"]


async def test_a_record_is_stored_under_its_id_once_however_often_it_is_written(adb):
    st = MongoReservoir(adb)
    assert st.idempotent is True
    recs = [{"project_id": "p", "message": f"m{i}", "_id": f"id-{i}"} for i in range(4)]
    assert (await st.ingest(recs[:2]))["ingested"] == 2
    # A rewrite (retry, redelivery) of stored records: stored, not failed, not copied.
    res = await st.ingest(recs + [recs[3]])
    assert res == {"ingested": 5, "failed": 0, "errors": []}
    docs = await astored_logs(adb)
    assert sorted(d["_id"] for d in docs) == ["id-0", "id-1", "id-2", "id-3"]
    # Records without an id get one each (distinct, strings), so nothing is merged.
    res = await st.ingest([{"project_id": "p", "message": "same"}] * 3)
    assert res["ingested"] == 3
    same = await astored_logs(adb, {"message": "same"})
    assert len(same) == 3 and all(isinstance(d["_id"], str) for d in same)
    # Other write errors stay failures of their record (a document over 16 MiB).
    res = await st.ingest(
        [{"project_id": "p", "message": "x" * (17 * 1024 * 1024), "_id": "big"}, recs[0]]
    )
    assert res["ingested"] == 1 and [e["index"] for e in res["errors"]] == [0]
