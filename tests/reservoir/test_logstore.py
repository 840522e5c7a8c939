"""The log store: records packed into buckets, each stored once however its writes are
regrouped, every read bounded by its page (checked with ``explain`` on every query a read
sends), summaries that answer counts and aggregations, retention by whole buckets, and
the conversion of a store written by the previous release."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient, monitoring
from stored_logs import astored_logs, stored_logs

from bucketq.reservoir import LogFilter, LogStore, MongoReservoir, PageBudget, new_record_ids

pytestmark = pytest.mark.timeout(120)

T0 = datetime(2026, 5, 1, 12, tzinfo=UTC)


def recs(
    n: int, project: str = "p", *, start: int = 0, step: float = 0.5, **extra: Any
) -> list[dict]:
    """``n`` records one ``step`` of seconds apart from ``T0``, ids of this process."""
    ids = new_record_ids(n)
    return [
        {"_id": ids[i], "project_id": project, "time": T0 + timedelta(seconds=(start + i) * step),
         "service": "api" if i % 4 else "web", "level": "error" if i % 10 == 0 else "info",
         "message": f"m{start + i}", **extra}
        for i in range(n)
    ]  # fmt: skip


async def test_records_are_packed_and_read_back_newest_first(adb):
    st = MongoReservoir(adb)
    res = await st.ingest(recs(300))
    assert res == {"ingested": 300, "failed": 0, "errors": []}
    buckets = await adb["log_buckets"].count_documents({"p": "p"})
    assert buckets <= 30  # 300 records a half second apart: 10 s spans of ~20 records
    page = await st.logstore.page("p", limit=7)
    assert [r["message"] for r in page.records] == [f"m{i}" for i in range(299, 292, -1)]
    # Paging backwards with the cursor visits every record once, in order.
    seen, before = [], None
    while True:
        page = await st.logstore.page("p", LogFilter(before=before), limit=64)
        seen += [r["message"] for r in page.records]
        if page.next_before is None:
            break
        before = page.next_before
    assert seen == [f"m{i}" for i in range(299, -1, -1)]
    errs = await st.logstore.page("p", LogFilter(level="error", service="web"), limit=100)
    assert [r["message"] for r in errs.records] == [f"m{i}" for i in range(280, -1, -20)]
    found = await st.logstore.page("p", LogFilter(q="M15"), limit=100)
    assert {r["message"] for r in found.records} == {"m15", *(f"m{i}" for i in range(150, 160))}


async def test_a_record_is_stored_once_however_its_writes_are_regrouped(adb):
    st = MongoReservoir(adb)
    batch = recs(40)
    assert (await st.ingest(batch[:25]))["ingested"] == 25
    # Written again in halves, mixed with new records, out of order, one twice: a
    # retry, a redelivery and a replay of records that were stored already.
    more = recs(10, start=40)
    again = [*batch[30:], *more, *batch[10:30][::-1], batch[3], batch[3]]
    res = await st.ingest(again)
    assert res == {"ingested": len(again), "failed": 0, "errors": []}
    # Another process (its own store object, nothing remembered) writes them again.
    other = MongoReservoir(adb)
    assert (await other.ingest(batch + more))["ingested"] == 50
    stored = Counter(r["_id"] for r in await astored_logs(adb))
    assert len(stored) == 50 and set(stored.values()) == {1}


async def test_concurrent_writers_of_one_group_store_each_record_once(adb):
    batch = recs(200, step=0.01)
    stores = [LogStore(adb) for _ in range(3)]
    await asyncio.gather(*(s.create_indexes() for s in stores[:1]))

    async def write(s: LogStore, part: list[dict]) -> list:
        return await s.write([dict(r) for r in part], list(range(len(part))))

    parts = [batch[0:120], batch[60:200], batch[::3]]
    results = await asyncio.gather(*(write(s, p) for s, p in zip(stores, parts, strict=True)))
    assert results == [[], [], []]
    stored = Counter(r["_id"] for r in await astored_logs(adb))
    assert len(stored) == 200 and set(stored.values()) == {1}


def test_a_forked_process_mints_ids_of_its_own():
    parent = new_record_ids(1)[0]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, new_record_ids(1)[0].encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 200).decode()
    assert child.split(".")[0][:13] != parent.split(".")[0][:13]


class Finds(monitoring.CommandListener):
    """Every find a client sends (database, collection, filter, projection)."""

    def __init__(self) -> None:
        self.finds: list[tuple[str, dict[str, Any]]] = []

    def started(self, event: Any) -> None:
        if event.command_name == "find":
            self.finds.append((event.database_name, dict(event.command)))

    def succeeded(self, event: Any) -> None: ...
    def failed(self, event: Any) -> None: ...


async def examined(client: AsyncMongoClient, finds: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """What each find read on the server (``explain``'s ``totalDocsExamined``), and
    that each carried its deadline (``maxTimeMS``)."""
    out = []
    for db, cmd in finds:
        assert "maxTimeMS" in cmd, cmd
        body = {k: v for k, v in cmd.items() if k in ("find", "filter", "projection")}
        plan = await client[db].command("explain", body, verbosity="executionStats")
        out.append(int(plan["executionStats"]["totalDocsExamined"]))
    return out


async def fill(store: LogStore, project: str, buckets: int, per: int = 10) -> None:
    """``buckets`` buckets of ``per`` records, a second apart, inserted straight (the read
    benchmark builds its projects so)."""
    from bucketq.reservoir import build_bucket

    docs = []
    t = T0
    for b in range(buckets):
        packed = []
        for i in range(per):
            packed.append({"_id": f"g{b}.{i}", "time": t + timedelta(milliseconds=100 * i), "service": "api",
                 "level": "error" if i == 0 and b % 50 == 0 else "info", "message": f"{project}-{b}-{i}",
                 "trace_id": f"trace-{b // 5}"})  # fmt: skip
        docs.append(build_bucket(project, f"g{b}", packed))
        t += timedelta(seconds=1)
    for i in range(0, len(docs), 500):
        await store.insert_buckets(docs[i : i + 500])


async def test_every_read_examines_what_its_page_needs_whatever_the_project_s_size(
    mongo_uri, db_name, mongo_client
):
    finds = Finds()
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri, event_listeners=[finds], tz_aware=True)
    try:
        store = LogStore(client[db_name])
        await store.create_indexes()
        await fill(store, "small", 40)
        await fill(store, "big", 800)
        costs: dict[str, dict[str, int]] = {}
        for project in ("small", "big"):
            reads = {
                "newest page": lambda p=project: store.page(p, limit=50),
                "a filtered page": lambda p=project: store.page(p, LogFilter(service="api", q="-1"), limit=20),
                "an error page": lambda p=project: store.page(p, LogFilter(level="error"), limit=1),
                "the page before a time": lambda p=project: store.page(
                    p, LogFilter(before=(T0 + timedelta(seconds=30), "")), limit=50),
                "a trace": lambda p=project: store.trace(p, "trace-3"),
                "a record": lambda p=project: store.record(p, "g7.3"),
            }  # fmt: skip
            costs[project] = {}
            for what, read in reads.items():
                finds.finds.clear()
                got = await read()
                assert got, (project, what)
                costs[project][what] = sum(await examined(client, list(finds.finds)))
        for what, big in costs["big"].items():
            # Flat: a project 20 times larger costs no more than a few windows more (the
            # error page reads back to its newest match: 50 buckets here, 40 there).
            assert big <= max(3 * costs["small"][what], 400), (what, costs)
        assert costs["big"]["a record"] <= 2 and costs["big"]["a trace"] == 5
    finally:
        await client.close()
        mongo_client.drop_database(db_name)


async def test_a_rare_filter_answers_within_its_budget_and_goes_on(adb):
    store = LogStore(adb)
    await store.create_indexes()
    await fill(store, "p", 200)
    page = await store.page("p", LogFilter(q="p-3-"), limit=5, budget=PageBudget(buckets=40))
    assert not page.complete and page.next_before is not None and page.buckets_read <= 80
    seen = [r["message"] for r in page.records]
    before = page.next_before
    for _ in range(50):
        if before is None:
            break
        page = await store.page("p", LogFilter(q="p-3-", before=before), limit=5,
                                budget=PageBudget(buckets=40))  # fmt: skip
        seen += [r["message"] for r in page.records]
        before = page.next_before
    assert before is None and sorted(seen) == sorted(f"p-3-{i}" for i in range(10))


async def test_counts_and_aggregations_come_from_summaries(adb):
    store = LogStore(adb)
    await store.create_indexes()
    await fill(store, "p", 120)  # 3 error records: in buckets 0, 50 and 100
    c = await store.count("p")
    assert (c.count, c.exact) == (1200, True)
    c = await store.count("p", LogFilter(level="error"))
    assert (c.count, c.exact) == (3, True)
    # A time range cuts buckets: those at its edges are unpacked and counted exactly.
    c = await store.count("p", LogFilter(since=T0 + timedelta(seconds=10, milliseconds=500),
                                         until=T0 + timedelta(seconds=20)))  # fmt: skip
    assert c.count == 95
    capped = await store.count("p", budget=PageBudget(buckets=30))
    assert not capped.exact and 0 < capped.count < 1200
    agg = await store.aggregate(
        "p", since=T0, until=T0 + timedelta(hours=1), interval=timedelta(minutes=1)
    )
    assert agg.complete and agg.total == 1200
    assert [sum(c.values()) for _, c in agg.series] == [600, 600]
    assert agg.series[0][1]["error"] == 2 and agg.services == [("api", 1200)]
    assert agg.errors == [("p-0-0", 1), ("p-50-0", 1), ("p-100-0", 1)] or len(agg.errors) == 3


async def test_retention_deletes_whole_buckets(adb):
    now = datetime.now(UTC)
    store = LogStore(adb, retention_days=lambda p: 1.0 if p == "short" else 30.0)
    await store.create_indexes()
    old = [dict(r, time=now - timedelta(days=2)) for r in recs(20, "short")]
    old_long = [dict(r, time=now - timedelta(days=2)) for r in recs(20, "long")]
    new = [dict(r, time=now - timedelta(minutes=1)) for r in recs(20, "short", start=100)]
    docs = old + old_long + new
    assert await store.write(docs, list(range(len(docs)))) == []
    # Records stamped two days ago but written now are kept a day from their writing.
    assert await store.expire(now=now + timedelta(hours=12)) == 0
    assert await store.expire(now=now + timedelta(days=1, hours=1)) >= 2
    left = Counter(r["project_id"] for r in await astored_logs(adb))
    assert left == {"long": 20}
    # A shortened setting applies to what is stored already, for the projects named.
    store._retention = lambda p: 1.0
    assert await store.expire(now=now + timedelta(days=1, hours=1), projects=["long"]) >= 1
    assert await astored_logs(adb) == []


async def test_a_store_of_the_previous_release_is_converted_once_and_read(adb):
    legacy = adb["logs"]
    old = [{"_id": f"{'ab' * 12}{i:08x}", "project_id": "p", "time": T0 + timedelta(seconds=i),
            "service": "api", "level": "info", "message": f"old-{i}"} for i in range(250)]  # fmt: skip
    await legacy.insert_many(old)
    st = MongoReservoir(adb)
    assert await st.logstore.legacy_left() == 250
    # A run stopped after storing a batch, before deleting it from the old collection:
    first = [dict(d) for d in old[:100]]
    assert await st.logstore.write(first, list(range(100))) == []
    seen: list[tuple[int, int]] = []
    n = await st.logstore.convert_legacy(
        batch=100, progress=lambda done, left: seen.append((done, left))
    )
    assert n == 250 and seen[-1] == (250, 0) and await legacy.count_documents({}) == 0
    stored = Counter(r["_id"] for r in await astored_logs(adb))
    assert len(stored) == 250 and set(stored.values()) == {1}
    page = await st.logstore.page("p", limit=2)
    assert [r["message"] for r in page.records] == ["old-249", "old-248"]
    assert (await st.logstore.record("p", old[7]["_id"]))["message"] == "old-7"


def test_the_convert_command_says_how_far_it_got(mongo_uri, db, db_name):
    import subprocess
    import sys

    db["logs"].insert_many([{"_id": f"old-{i}", "project_id": "p", "time": T0 + timedelta(seconds=i),
                             "service": "api", "level": "info", "message": f"old-{i}"} for i in range(30)])  # fmt: skip
    cmd = [sys.executable, "-m", "bucketq", "logs", "convert", "--batch", "20",
           "--mongodb-uri", mongo_uri, "--database", db_name]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "30 log records in the layout of an earlier release" in out.stdout
    assert (
        "converted 20 in all; 10 left" in out.stdout and "converted 30 in all; 0 left" in out.stdout
    )
    assert db["logs"].count_documents({}) == 0
    assert sorted(r["_id"] for r in stored_logs(db)) == sorted(f"old-{i}" for i in range(30))
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "0 log records" in again.stdout


def test_a_filtered_read_decodes_only_what_may_match():
    from bucketq.reservoir import _logbuckets as lb

    records = [{"_id": f"g.{i}", "time": T0 + timedelta(seconds=i), "service": ["a", "b"][i % 2],
                "level": ["info", "error"][i % 3 == 0], "message": f"m{i}" + (" NeedLe" if i % 7 == 0 else "")}
               for i in range(42)]  # fmt: skip
    doc = lb.build_bucket("p", "g", records)

    def read(**f: Any) -> tuple[set[int], int]:
        flt = LogFilter(**f)
        recs, decoded = lb.unpack_matching(doc, flt)
        return {int(r["_id"][2:]) for r in recs if flt.keeps(r)}, decoded

    want = {i for i in range(42) if i % 2 == 1 and i % 3 == 0}
    assert read(service="b", level="error") == (want, len(want))
    got, decoded = read(q="needle")
    assert got == set(range(0, 42, 7)) and decoded == 6
    assert read(q="needle", service="a")[0] == {0, 14, 28}
    # A character that folds to ASCII (the Kelvin sign to k): the bucket is decoded whole.
    doc = lb.build_bucket("p", "g", [dict(records[0], message="KELVIN \u212a"), records[1]])
    assert read(q="n k")[0] == {0} and read(q="n k")[1] == 2
    folding = [c for c in range(0x80, 0x110000)
               if not 0xD800 <= c <= 0xDFFF and any(x.isascii() for x in chr(c).casefold())]  # fmt: skip
    assert tuple(folding) == lb.FOLDING_TO_ASCII  # this Python's Unicode


async def test_a_late_bucket_keeps_its_slot_findable_as_long_as_it_lives(adb):
    now = datetime.now(UTC)
    old = now - timedelta(days=3)
    first = LogStore(adb, retention_days=1.0)
    await first.create_indexes()
    batch = [dict(r, time=old) for r in recs(5)]
    assert await first.write(batch, list(range(5))) == []
    # Its slot markers as if written long ago: they would expire within the hour.
    await adb["log_buckets"].update_many(
        {"p": {"$exists": False}}, {"$set": {"x": now + timedelta(hours=1)}}
    )
    late = LogStore(adb, retention_days=1.0)  # another process, later, into the same slots
    batch = [dict(r, time=old) for r in recs(5, start=5)]
    assert await late.write(batch, list(range(5))) == []
    await late.expire(now=now + timedelta(hours=2))
    page = await late.page("p", limit=20)
    assert sorted(r["message"] for r in page.records) == sorted(f"m{i}" for i in range(10))
