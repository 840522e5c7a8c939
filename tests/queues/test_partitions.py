"""Partitioned queues (``partitions=K``) on the embedded server: every claim searches one
partition by equality (watched with pymongo's command monitoring), consumers go round
the partitions so an empty one starves nobody, a producer's items keep their order in
its partition, ``key=`` places items, and what works on a queue works on a partitioned
one: sizes, stats, drain, remove(), the dead-letter queue, quarantine; buckets from
before the queue was partitioned (or had more partitions) are still delivered."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from pymongo import MongoClient, monitoring

from bucketq import AsyncElementQueue, AsyncQueue, Queue
from bucketq.bucket import MEMBERS, partition_of
from bucketq.bucket.codec import decode_items
from bucketq.errors import ConfigurationError
from bucketq.stream import AsyncStreamQueue, StreamQueue
from fast_settings import FAST


class Claims(monitoring.CommandListener):
    """The filter of every claim the client sent that searches for a bucket: a
    findAndModify, or the candidate find of the find_then_update form (its conditional
    updates name one ``_id``); and apart, the probes: reads that find where a claimable
    bucket is (in partition order, sorted by ``part`` first; with find_then_update the
    map read, an aggregation counting them per partition). A queue object's numbering
    (a findAndModify of ``MEMBERS``) is not a claim."""

    def __init__(self) -> None:
        self.filters: list[dict] = []
        self.probes: list[dict] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        cmd = event.command
        pipeline = cmd.get("pipeline") or [{}]
        if event.command_name == "aggregate" and "$group" in pipeline[-1]:
            self.probes.append(dict(pipeline[0]["$match"]))  # core.map_pipeline
        elif event.command_name == "findAndModify" and cmd["findAndModify"] != MEMBERS:
            self.filters.append(dict(cmd["query"]))
        elif event.command_name == "find" and "lease.until" in cmd["filter"]:
            if next(iter(cmd.get("sort") or {}), None) == "part":
                self.probes.append(dict(cmd["filter"]))  # core.probe_requests
            else:
                self.filters.append(dict(cmd["filter"]))  # core.candidate_request

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def consume(q, want: int, deadline: float = 60.0) -> list:
    got = []
    end = time.monotonic() + deadline
    while len(got) < want and time.monotonic() < end:
        for m in q.reserve_many(100, timeout=0.5):
            q.commit(m)
            got.append(m)
    return got


@pytest.mark.parametrize("claim", ["find_and_modify", "find_then_update"])
def test_every_claim_filters_on_one_partition_and_all_are_delivered(mongo_uri, db, db_name, claim):
    claims = Claims()
    client = MongoClient(mongo_uri, event_listeners=[claims])
    producers = [Queue(db, "q", partitions=4, bucket_max_size=10, **FAST) for _ in range(3)]
    # Items in partitions 1 and 3 only: consumers starting on an empty one move on.
    for n, p in enumerate(producers):
        p.push_many([{"p": n, "i": i} for i in range(50)], key=1 if n < 2 else 3)
        p.flush()
    consumers = [Queue(client[db_name], "q", partitions=4, claim=claim, **FAST) for _ in range(3)]
    try:
        got: list = []
        end = time.monotonic() + 60
        while len(got) < 150 and time.monotonic() < end:
            for c in consumers:
                for m in c.reserve_many(20, timeout=0.1):
                    c.commit(m)
                    got.append(m.payload)
        assert sorted((g["p"], g["i"]) for g in got) == [
            (n, i) for n in range(3) for i in range(50)
        ]
        for c in consumers:
            c.flush()
        assert Queue(db, "q", partitions=4).total_size() == 0
    finally:
        for q in producers + consumers:
            q.close()
        client.close()
    assert claims.filters, "the consumers claimed nothing"
    for flt in claims.filters:
        assert "part" in flt and (flt["part"] is None or isinstance(flt["part"], int)), flt
    assert {1, 3} <= {f["part"] for f in claims.filters}


@pytest.mark.parametrize("claim", ["find_and_modify", "find_then_update"])
def test_an_idle_consumer_reads_instead_of_claiming_every_partition(mongo_uri, db_name, claim):
    claims = Claims()
    client = MongoClient(mongo_uri, event_listeners=[claims])
    q = Queue(client[db_name], "q", partitions=64, claim=claim, **FAST)
    try:
        assert q.reserve(timeout=1.0) is None  # idle: several polls
        # one claim, in its own partition (where its own pushes go), not a round of
        # 64 claims per poll
        assert [f["part"] for f in claims.filters] == [q.partition or None]
        polls = len(claims.probes)
        assert 0 < polls <= 2 * 10  # one or two reads per poll (polls 0.1 s apart at least)
        seen = len(claims.filters)
        q.push("x", key=37)
        q.flush()
        msg = q.reserve(timeout=30)
        assert msg is not None and msg.payload == "x"
        q.commit(msg)
        # found by a read, then claimed in its partition (not after 37 empty claims;
        # the fetcher goes on claiming ahead meanwhile)
        assert [f["part"] for f in claims.filters[seen : seen + 1]] == [37]
    finally:
        q.close()
        client.close()


@pytest.mark.parametrize("claim", ["find_and_modify", "find_then_update"])
def test_a_consumer_finds_partition_0_from_any_other(mongo_uri, db, db_name, claim):
    # Partition 0 is stored without the field: a read that named partitions by
    # distinct("part") would not see it, and the consumer would wait beside its items.
    producer = Queue(db, "q", partitions=8, **FAST)
    consumer = Queue(db, "q", partitions=8, claim=claim, **FAST)
    try:
        producer.push_many([f"zero-{i}" for i in range(30)], key=0)
        producer.flush()
        got = consume(consumer, 30, deadline=30.0)
        assert sorted(m.payload for m in got) == sorted(f"zero-{i}" for i in range(30))
        assert (producer.partition, consumer.partition) == (0, 1)  # members 0 and 1
    finally:
        producer.close()
        consumer.close()


@pytest.mark.parametrize("claim", ["find_and_modify", "find_then_update"])
def test_an_unpartitioned_queue_claims_without_a_partition_term(mongo_uri, db, db_name, claim):
    claims = Claims()
    client = MongoClient(mongo_uri, event_listeners=[claims])
    q = Queue(client[db_name], "q", claim=claim, **FAST)
    try:
        q.push_many(list(range(5)))
        q.flush()
        assert len(consume(q, 5)) == 5
    finally:
        q.close()
        client.close()
    assert claims.filters and all("part" not in f for f in claims.filters)
    assert all("part" not in d for d in db.q.find())  # today's layout
    assert MEMBERS not in db.list_collection_names()  # nothing to number


def placed(db) -> dict:
    """The partition of each item of queue ``q`` (payload -> part) as stored."""
    return {item["p"]: d.get("part", 0) for d in db.q.find() for item in decode_items(d["items"])}


@pytest.mark.parametrize("claim", ["find_and_modify", "find_then_update"])
def test_queue_objects_opened_together_push_to_and_claim_in_distinct_partitions(
    mongo_uri, db, db_name, claim
):
    # Hashed ids would leave a partition in three without a producer at 4 of 4 (and
    # its consumer claiming in another's); numbered members take one each.
    claims = Claims()
    client = MongoClient(mongo_uri, event_listeners=[claims])
    qs = [Queue(client[db_name], "q", partitions=4, claim=claim, **FAST) for _ in range(4)]
    try:
        for k, q in enumerate(qs):
            q.push_many([f"{k}-{i}" for i in range(3)])
            q.flush()
        where = placed(db)
        assert sorted(q.partition for q in qs) == [0, 1, 2, 3]
        for k, q in enumerate(qs):
            assert {where[f"{k}-{i}"] for i in range(3)} == {q.partition}
        assert db[MEMBERS].find_one({"_id": "q"})["n"] == 4
        msg = qs[2].reserve(timeout=30)
        assert msg is not None and msg.payload.startswith("2-")  # its own partition first
        qs[2].commit(msg)
        assert claims.filters[0]["part"] == (qs[2].partition or None)
    finally:
        for q in qs:
            q.close()
        client.close()


async def test_an_async_queue_object_is_numbered_too(adb, db):
    qs = [AsyncQueue(adb, "q", partitions=2, **FAST) for _ in range(2)]
    try:
        for k, q in enumerate(qs):
            await q.push_many([f"{k}"])
            await q.flush()
        assert sorted(q.partition for q in qs) == [0, 1]
        assert placed(db) == {"0": qs[0].partition, "1": qs[1].partition}
    finally:
        for q in qs:
            await q.close()


def test_a_member_number_that_cannot_be_read_leaves_the_hash(db, caplog):
    # Damaged numbering (not a number): $inc fails on the server. The queue object
    # keeps its hashed partition, says so, and stores and delivers every item.
    db[MEMBERS].insert_one({"_id": "q", "n": "many"})
    q = Queue(db, "q", partitions=4, **FAST)
    try:
        with caplog.at_level(logging.WARNING, logger="bucketq.queue"):
            q.push_many(list(range(10)))
            q.flush()
        assert any("numbering this queue object failed" in r.getMessage() for r in caplog.records)
        assert q.partition == partition_of(q.producer_id, 4)
        assert set(placed(db).values()) == {q.partition}
        assert sorted(m.payload for m in consume(q, 10)) == list(range(10))
    finally:
        q.close()


def test_keys_and_producers_place_items_and_keep_their_order(db):
    q = Queue(db, "q", partitions=4, bucket_max_size=4, **FAST)
    try:
        q.push("zero", key=0)
        q.push("two", key=2)
        q.push("six", key=6)  # 6 % 4
        q.push("tenant", key="tenant-a")
        q.push_many(["b1", "b2"], key=b"tenant-a")
        for i in range(20):  # the producer's own partition, several buckets
            q.push(i)
        q.flush()
        where = {}
        for d in db.q.find():
            for item in decode_items(d["items"]):
                where[item["p"]] = d.get("part", 0)
        assert where["zero"] == 0 and where["two"] == 2 and where["six"] == 2
        assert where["tenant"] == where["b1"] == where["b2"] == partition_of("tenant-a", 4)
        assert {where[i] for i in range(20)} == {q.partition}
        got = [m.payload for m in consume(q, 26)]
        assert len(got) == 26
        mine = [p for p in got if isinstance(p, int)]
        assert mine == list(range(20))  # one producer's items in order
    finally:
        q.close()


def test_sizes_stats_remove_drain_and_the_dead_letter_queue(db):
    q = Queue(db, "q", partitions=3, max_tries=1, bucket_max_size=5, **FAST)
    try:
        receipts = [q.push(i, key=i) for i in range(12)]
        q.push("later", key=1, delay=3600)
        q.flush()
        assert {d.get("part", 0) for d in db.q.find()} == {0, 1, 2}
        assert q.total_size() == 13 and q.size() == 12 and q.sched_size() == 1
        assert q.next_t() is not None
        assert q.remove(receipts[4].id) is True  # partition 1
        assert q.size() == 11
        msgs = consume_no_commit(q, 11)
        assert q.resv_size() == 11 and q.size() == 0
        assert q.stats()["claims"] >= 3
        for m in msgs[:10]:
            q.commit(m)
        assert q.rollback(msgs[10]) is True  # max_tries=1: to the dead-letter queue
        q.flush()
        report = q.drain()
        assert set(report) == {
            "buckets_written",
            "push_failed",
            "served",
            "released_buckets",
            "released_items",
        }  # the README's drain report
    finally:
        q.close()
    assert Queue(db, "q", partitions=3).total_size() == 1  # the delayed one
    dlq = Queue(db, "q.dlq", partitions=3, **FAST)
    try:
        dead = consume(dlq, 1)
        assert [m.payload for m in dead] == [msgs[10].payload]
        assert dead[0].headers["x-reason"]
    finally:
        dlq.close()


def consume_no_commit(q, want: int) -> list:
    got: list = []
    end = time.monotonic() + 60
    while len(got) < want and time.monotonic() < end:
        got += q.reserve_many(want - len(got), timeout=0.5)
    assert len(got) == want
    return got


def test_a_damaged_bucket_of_a_partition_is_quarantined_and_requeued(db):
    q = Queue(db, "q", partitions=4, **FAST)
    try:
        q.push_many(["a", "b"], key=2)
        q.push_many(["c"], key=3)
        q.flush()
        bad = db.q.find_one({"part": 2})
        db.q.update_one({"_id": bad["_id"]}, {"$set": {"n": 5, "live": 5}})
        assert [m.payload for m in consume(q, 1)] == ["c"]
        end = time.monotonic() + 30
        while not q.quarantined() and time.monotonic() < end:
            q.reserve(timeout=0.2)
        assert [r["id"] for r in q.quarantined()] == [str(bad["_id"])]
        report = q.requeue_quarantined()
        assert report["items"] == 2, report
        # Back in the re-queueing producer's partition, and delivered.
        assert sorted(m.payload for m in consume(q, 2)) == ["a", "b"]
    finally:
        q.close()


def test_buckets_from_before_partitioning_or_from_more_partitions_are_delivered(db):
    old = Queue(db, "q", **FAST)  # unpartitioned: no part field
    old.push_many(["old-1", "old-2"])
    old.close()
    wide = Queue(db, "q", partitions=8, **FAST)
    wide.push_many(["p5"], key=5)
    wide.push_many(["p4"], key=4)
    wide.close()
    q = Queue(db, "q", partitions=4, **FAST)  # 5 -> 1, 4 -> 0
    try:
        assert sorted(m.payload for m in consume(q, 4)) == ["old-1", "old-2", "p4", "p5"]
    finally:
        q.close()
    assert all(d.get("part", 0) < 4 for d in db.q.find())
    back = Queue(db, "q", **FAST)  # and back to one: no partition term, all are seen
    try:
        back.push("x", key=3)
        back.flush()
        assert [m.payload for m in consume(back, 1)] == ["x"]
    finally:
        back.close()


def test_the_partition_index_is_there(db):
    q = Queue(db, "q", partitions=2, **FAST)
    try:
        q.push("x")
        q.flush()
        keys = {
            name: [tuple(k) for k in ix["key"]] for name, ix in db.q.index_information().items()
        }
        assert keys["part_mature_id"] == [("part", 1), ("mature", 1), ("_id", 1)]
        assert keys["mature_id"] == [("mature", 1), ("_id", 1)]
    finally:
        q.close()


@pytest.mark.parametrize("cls", [StreamQueue, AsyncStreamQueue])
def test_a_stream_queue_refuses_partitions(db, adb, cls):
    with pytest.raises(
        ConfigurationError, match="one partition.*Queue\\(db, name, partitions=K\\)"
    ):
        cls(db if cls is StreamQueue else adb, "s", partitions=2)


async def test_bad_partition_options_and_keys_are_refused(adb):
    with pytest.raises(ConfigurationError, match="partitions must be a whole number from 1"):
        AsyncQueue(adb, "q", partitions=0)
    with pytest.raises(ConfigurationError, match="per-element queue has no partitions"):
        AsyncElementQueue(adb, "q", partitions=2)
    q = AsyncQueue(adb, "q", partitions=2)
    try:
        for bad in (1.5, -1, ["k"], True):
            with pytest.raises(ConfigurationError, match="key must be a str, bytes"):
                await q.push("x", key=bad)
        await q.push("x", key="ok")
    finally:
        await q.close()


async def test_the_per_element_queue_takes_a_key_checks_it_and_delivers_in_one_partition(adb):
    # Every queue class takes push(key=) so code can switch classes; with one partition
    # a valid key changes nothing and a bad one is refused as everywhere.
    q = AsyncElementQueue(adb, f"ek_{uuid.uuid4().hex[:8]}", **FAST)
    try:
        with pytest.raises(ConfigurationError, match="key must be a str, bytes"):
            await q.push("x", key=1.5)
        await q.push("a", key="tenant-1")
        await q.push_many(["b", "c"], key=7)
        got = [await q.pop(timeout=10) for _ in range(3)]
        assert sorted(m.payload for m in got) == ["a", "b", "c"]
        assert await q.pop(timeout=0.2) is None  # the refused push stored nothing
    finally:
        await q.close()
