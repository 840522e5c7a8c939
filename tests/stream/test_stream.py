"""Ordered stream mode against a real server: order, gapless acks, fencing, resume,
hole closing, and exactly-once with a sink that stores the seq (processes SIGKILLed)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bucketq.bucket.codec import encode_item
from bucketq.errors import ConfigurationError, Fenced
from bucketq.stream import AckOutOfOrder, AsyncStreamQueue, StreamQueue
from fast_settings import FAST_STREAM
from waiting import DEFAULT_TIMEOUT, eventually

#: Reads of buckets stored already: a bound for a busy machine, never waited by a pass.
WAIT = DEFAULT_TIMEOUT

WORKER = str(Path(__file__).with_name("stream_worker.py"))


def worker(mode: str, uri: str, db_name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, WORKER, mode, uri, db_name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def drain(c, items, timeout=10.0):
    """Read and ack batches until ``items`` items came (each batch may take up to
    ``timeout``), then check that nothing more is stored, without waiting for it."""
    out = []
    while sum(len(b.items) for b in out) < items:
        b = c.next_batch(timeout=timeout)
        assert b is not None, f"only {sum(len(b.items) for b in out)} of {items} items came"
        out.append(b)
        c.ack(b.seq)
    extra = c.next_batch(timeout=0)
    assert extra is None, f"more than {items} items: {extra}"
    return out


def test_buckets_come_in_order_with_gapless_seqs_and_acks_delete_them(db):
    q = StreamQueue(db, "s", **FAST_STREAM)
    q.push_many([{"i": i} for i in range(45)])
    for i in range(45, 95):
        q.push({"i": i}, headers={"k": i} if i == 50 else None)
    q.flush()
    assert q.position()["next"] == 10
    c = q.consumer()
    b1, b2, b3 = c.next_batch(WAIT), c.next_batch(WAIT), c.next_batch(WAIT)
    assert [b1.seq, b2.seq, b3.seq] == [1, 2, 3]
    seq, items = b1
    assert items == [{"i": i} for i in range(10)]
    with pytest.raises(AckOutOfOrder):
        c.ack(2)  # 1 is the next unacked
    with pytest.raises(AckOutOfOrder):
        c.ack_through(7)  # never delivered
    c.ack(1)
    c.ack_through(3)
    assert db.s.count_documents({}) == 7
    assert q.position()["acked"] == 3
    rest = drain(c, 65)
    assert [b.seq for b in rest] == list(range(4, 11))
    items = b2.items + b3.items + [x for b in rest for x in b.items]
    assert items == [{"i": i} for i in range(10, 95)]
    assert rest[2].headers[0] == {"k": 50} and rest[2].headers[1] is None
    assert db.s.count_documents({}) == 0
    assert q.size() == 0


def test_two_producers_share_one_gapless_sequence(db):
    qa, qb = StreamQueue(db, "s", **FAST_STREAM), StreamQueue(db, "s", **FAST_STREAM)
    for i in range(60):
        (qa if i % 2 else qb).push(i)
    qa.flush()
    qb.flush()
    c = qa.consumer()
    got = drain(c, 60)
    assert [b.seq for b in got] == list(range(1, len(got) + 1))
    assert sorted(x for b in got for x in b.items) == list(range(60))


async def test_async_stream_order_and_ack(adb):
    async with AsyncStreamQueue(adb, "s", **FAST_STREAM) as q:
        await q.push_many(list(range(25)), durable=True)
        c = await q.consumer()
        seen = []
        while sum(len(b.items) for b in seen) < 25:
            b = await c.next_batch(timeout=10)
            assert b is not None, f"only {len(seen)} batches came"
            seen.append(b)
            await c.ack(b.seq)
        assert await c.next_batch(timeout=0) is None
        assert [b.seq for b in seen] == [1, 2, 3]
        assert [x for b in seen for x in b.items] == list(range(25))
        assert (await q.position())["acked"] == 3


def test_a_zombie_consumer_in_another_process_is_fenced(db, mongo_uri, db_name):
    q = StreamQueue(db, "s", **FAST_STREAM)
    q.push_many(list(range(30)), durable=True)
    p = worker("zombie", mongo_uri, db_name)
    try:
        assert p.stdout.readline().strip() == "read 1"
        newer = q.consumer()  # bumps the epoch: the other process is a zombie now
        p.stdin.write("go\n")
        p.stdin.flush()
        out, _ = p.communicate(timeout=60)
    finally:
        p.kill()
    assert out.split("\n")[:2] == ["ack fenced", "next_batch fenced"]
    # Nothing the zombie did counted: the newer consumer gets every bucket from 1.
    got = drain(newer, 30)
    assert [b.seq for b in got] == [1, 2, 3]
    q.consumer()  # and it is fenced in turn by the next
    with pytest.raises(Fenced):
        newer.next_batch(timeout=0.2)


def test_resume_after_a_seq(db):
    q = StreamQueue(db, "s", **FAST_STREAM)
    q.push_many(list(range(50)), durable=True)
    c = q.consumer(after=2)
    assert db.s.count_documents({}) == 3  # 1 and 2 acknowledged on open
    got = drain(c, 30)
    assert [b.seq for b in got] == [3, 4, 5]
    assert [x for b in got for x in b.items] == list(range(20, 50))
    with pytest.raises(ConfigurationError, match="acknowledged through 5"):
        q.consumer(after=4)
    with pytest.raises(ConfigurationError, match="only 5 were ever"):
        q.consumer(after=9)


def test_a_hole_from_a_killed_producer_is_closed_after_the_grace_period(db, mongo_uri, db_name):
    p = worker("die-after-allocate", mongo_uri, db_name)
    try:
        assert p.stdout.readline().strip() == "allocated"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    q = StreamQueue(db, "s", hole_grace=1.5, **FAST_STREAM)
    q.push_many(list(range(15)), durable=True)  # seqs 2 and 3, behind the hole at 1
    c = q.consumer()
    t0 = time.monotonic()
    b = c.next_batch(timeout=30)
    waited = time.monotonic() - t0
    assert b is not None and b.seq == 2 and b.items == list(range(10))
    assert waited >= 1.4, f"the hole was closed {waited:.2f} s after the read, before its grace"
    assert c.holes_closed == 1
    c.ack(2)
    assert c.next_batch(WAIT).seq == 3


def test_a_late_bucket_is_never_skipped_and_one_too_late_is_renumbered(db):
    q = StreamQueue(db, "s", hole_grace=1.0, **FAST_STREAM)
    c = q.consumer()
    # Late, within the grace period: read in its place.
    seq = q._allocate(1)[0]
    q.push(1, durable=True)  # takes the next number
    time.sleep(0.3)
    db.s.insert_one(
        {
            "_id": seq,
            "n": 1,
            "items": encode_item(0),
            "w": None,
        }
    )
    assert [b.items for b in drain(c, 2)] == [[0], [1]]
    # Too late: the hole is closed; the producer's insert meets the tombstone and renumbers.
    real_insert = q._col.insert_one
    gate = {"first": True}

    def slow_insert(doc, *a, **k):
        if gate.pop("first", False):
            time.sleep(2.5)  # > hole_grace: the consumer closes the hole meanwhile
        return real_insert(doc, *a, **k)

    q._col.insert_one = slow_insert
    r = q.push("late")
    got = []
    while not got:
        b = c.next_batch(timeout=8)
        assert b is not None, "the renumbered bucket never arrived"
        got.append(b)
        c.ack(b.seq)
    assert r.wait(5)
    assert got[0].items == ["late"]
    assert c.holes_closed == 1 and q.stats()["renumbered"] == 1


def test_exactly_once_into_a_sink_that_stores_the_seq_while_consumers_are_killed(
    db, mongo_uri, db_name
):
    n, per = 1500, 5
    buckets = n // per
    q = StreamQueue(db, "s", bucket_max_size=per, bucket_max_wait=0.05)
    q.push_many([{"i": i} for i in range(n)], durable=True)
    assert q.position()["next"] == buckets
    rng = random.Random(7)
    progress = []  # sink size when each consumer was SIGKILLed mid-run
    while len(progress) < 4:
        p = worker("sink", mongo_uri, db_name)
        assert p.stdout.readline().strip() == "started"
        # Kill mid-run: once this consumer has stored something (a fixed delay after
        # "started" can pass before its first batch on a busy machine), then a random
        # moment later.
        before = progress[-1] if progress else 0
        eventually(
            lambda before=before: db.sink.count_documents({}) > before, timeout=60, what="progress"
        )
        time.sleep(rng.uniform(0.0, 0.2))
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        progress.append(db.sink.count_documents({}))
        if progress[-1] >= buckets:
            break
    p = worker("sink", mongo_uri, db_name)  # the last one runs until the stream is empty
    try:
        assert p.stdout.readline().strip() == "started"
        eventually(
            lambda: db.sink.count_documents({}) >= buckets, timeout=90, what="a complete sink"
        )
        # Nothing more may arrive: the sink worker found the stream empty ("idle", after
        # its last ack) and is still running (a second insert of a seq would kill it).
        for line in p.stdout:
            if line.strip() == "idle":
                break
        assert p.poll() is None, "the sink worker died"
    finally:
        p.kill()
        p.wait()
    print(f"sink size (of {buckets} buckets) at each SIGKILL: {progress}")
    assert sum(1 for x in progress if 0 < x < buckets) >= 3, f"kills were not mid-run: {progress}"
    seqs = sorted(d["_id"] for d in db.sink.find({}, {"_id": 1}))
    assert seqs == list(range(1, buckets + 1))
    items = Counter(x["i"] for d in db.sink.find() for x in d["items"])
    assert items == Counter(range(n)), "every item exactly once"
    assert q.position()["acked"] >= buckets - 1


def test_close_hole_counts_only_a_number_it_closed(db):
    """A bucket that lands (or is published) between the read that found its number
    blocked and the close is read, and ``holes_closed`` does not count it."""
    q = StreamQueue(db, "s", **FAST_STREAM)
    q.write_staged([[encode_item("a")]], {"j": "job", "t": "tok"})
    c = q.consumer()
    stale = db.s.find_one({"_id": 1})
    assert stale["stg"] == {"j": "job", "t": "tok"}
    db.s.update_one({"_id": 1}, {"$unset": {"stg": ""}})  # published meanwhile
    assert c.close_hole("staged", 1, stale) is False
    q.push("b", durable=True)  # seq 2
    assert c.close_hole("missing", 2, None) is False  # the bucket is there
    assert c.holes_closed == 0
    assert [b.items for b in drain(c, 2)] == [["a"], ["b"]]
    assert c.close_hole("missing", 3, None) is True  # nothing there: a tombstone
    assert c.holes_closed == 1 and db.s.find_one({"_id": 3})["hole"] is True


def test_staged_buckets_meeting_a_tombstone_are_renumbered(db):
    """A staged write whose number was closed as a hole meanwhile takes the next one,
    as a pushed bucket does."""
    q = StreamQueue(db, "s", **FAST_STREAM)
    q.push("first", durable=True)  # seq 1
    db.s.insert_one({"_id": 2, "hole": True, "at": None})  # closed before our insert
    q.write_staged([[encode_item(i) for i in range(3)]], {"j": "job", "t": "tok"})
    assert q.stats()["renumbered"] == 1
    staged = db.s.find_one({"stg": {"$exists": True}})
    assert staged["_id"] == 3 and staged["n"] == 3


def test_reachable_stops_at_a_hole_and_closes_it_after_its_grace(db):
    q = StreamQueue(db, "s", hole_grace=0.5, **FAST_STREAM)
    q.push_many(list(range(20)), durable=True)  # seqs 1, 2
    q._allocate(1)  # seq 3: handed out, never written
    q.push_many(list(range(20, 30)), durable=True)  # seq 4
    c = q.consumer()
    assert c.reachable(0, max_items=10) == 1
    assert c.reachable(0) == 2  # blocked at 3, within its grace
    assert eventually(lambda: c.reachable(0) == 4, what="the hole at 3 closed")
    assert c.holes_closed == 1
    assert c.reachable(4) == 4 and c.holes_closed == 1
    c.write_ack(4)
    assert q.position()["acked"] == 4 and db.s.count_documents({"hole": {"$exists": False}}) == 0
