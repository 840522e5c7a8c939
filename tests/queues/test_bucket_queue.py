"""Behaviour only the bucket queue has: packing, byte limits, leases, read-ahead, drain."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import bson
import pytest

from bucketq import AsyncQueue, Queue, QueueFull
from bucketq.bucket.codec import decode_items
from fast_settings import FAST
from queue_kinds import resolve
from waiting import eventually, eventually_async

WORKERS = str(Path(__file__).resolve().parent.parent / "workers.py")


async def test_buckets_pack_by_count(bucket_flavour):
    q = bucket_flavour.open(bucket_max_size=10, bucket_max_wait=30)
    for i in range(25):
        await resolve(q.push(i))
    col = bucket_flavour.sync_db[q.name]
    # Two full buckets are written at once (not after the 30 s age limit), 5 items stay open.
    await eventually_async(lambda: col.count_documents({}) == 2, what="two full buckets")
    assert sorted(d["n"] for d in col.find({}, {"n": 1})) == [10, 10]
    await resolve(q.flush())
    assert sorted(d["n"] for d in col.find({}, {"n": 1})) == [5, 10, 10]


async def test_durable_push_does_not_wait_for_the_bucket_age_limit(bucket_flavour):
    """durable=True has its bucket written at once; the pushes that come while a write
    is in flight share the next bucket (group commit), and every item is stored once."""
    q = bucket_flavour.open(bucket_max_wait=3600)
    col = bucket_flavour.sync_db[q.name]

    # An hour's age limit: without the durable seal this would wait for the test timeout.
    await resolve(q.push({"i": -1}, durable=True))
    assert col.count_documents({}) == 1
    if bucket_flavour.is_async:
        await asyncio.wait_for(
            asyncio.gather(*(q.push({"i": i}, durable=True) for i in range(200))), 60
        )
        # 200 concurrent durable pushes, one bucket per writer turn: far fewer than 200.
        assert 2 <= col.count_documents({}) <= 6
    else:
        receipts = q.push_many([{"i": i} for i in range(200)], durable=True)
        assert all(r.done() for r in receipts) and col.count_documents({}) == 2
    stored = [it["p"]["i"] for d in col.find() for it in decode_items(d["items"])]
    assert sorted(stored) == [-1, *range(200)]


async def test_buckets_respect_max_bytes(bucket_flavour):
    """1,024 items of 20 KB: every one stored, no bucket over bucket_max_bytes."""
    limit = 1024 * 1024
    q = bucket_flavour.open(bucket_max_bytes=limit, bucket_max_wait=30)
    for i in range(1024):
        await resolve(q.push({"i": i, "blob": "x" * 20_000}))
    await resolve(q.flush())
    col = bucket_flavour.sync_db[q.name]
    seen = []
    for raw in col.find_raw_batches({}):
        for doc in bson.decode_all(raw):
            assert len(bson.encode(doc)) <= limit
            seen += [it["p"]["i"] for it in decode_items(doc["items"])]
    assert sorted(seen) == list(range(1024))


async def test_max_pending_bytes_raises_or_blocks_and_loses_nothing(bucket_flavour):
    """Past max_pending_bytes a push raises QueueFull (pending_policy="raise") or waits
    until the writer made room (the default); push_many over the limit goes one by one."""
    blob = "x" * 10_000
    limits = {"bucket_max_bytes": 64 * 1024, "max_pending_bytes": 64 * 1024, "bucket_max_wait": 30}
    q = bucket_flavour.open("raising", pending_policy="raise", **limits)
    for i in range(6):
        await resolve(q.push({"i": i, "blob": blob}))
    with pytest.raises(QueueFull, match="max_pending_bytes"):
        await resolve(q.push({"i": 6, "blob": blob}))
    await resolve(q.flush())  # room again
    await resolve(q.push({"i": 6, "blob": blob}))
    await resolve(q.flush())
    assert bucket_flavour.sync_db["raising"].count_documents({}) == 2

    q = bucket_flavour.open("blocking", **limits)
    for i in range(20):  # 200 KB through a 64 KB window
        await resolve(q.push({"i": i, "blob": blob}))
    receipts = await resolve(q.push_many([{"i": i, "blob": blob} for i in range(20, 40)]))
    await resolve(q.flush())
    assert all(r.done() for r in receipts)
    col = bucket_flavour.sync_db["blocking"]
    stored = [it["p"]["i"] for d in col.find().sort("_id", 1) for it in decode_items(d["items"])]
    assert sorted(stored) == list(range(40))
    assert max(d["n"] for d in col.find({}, {"n": 1})) <= 6  # 64 KB buckets of 10 KB items


async def test_bucket_mature_is_latest_of_its_slot(bucket_flavour):
    q = bucket_flavour.open(mature_granularity=1.0, bucket_max_wait=30)
    t0 = time.time()
    for d in (5.1, 5.3, 5.9):
        await resolve(q.push(d, delay=d))
    await resolve(q.flush())
    docs = list(bucket_flavour.sync_db[q.name].find())
    assert sum(d["n"] for d in docs) == 3
    # Same slot when the delays fall in one granularity step; never earlier than any item.
    for doc in docs:
        assert (
            doc["mature"].timestamp()
            >= t0 + max(it["p"] for it in decode_items(doc["items"])) - 0.01
        )


async def test_read_ahead_and_rest_released_by_drain(bucket_flavour):
    # Buckets close by size (and at flush), not by time on a slow machine.
    a = bucket_flavour.open(bucket_max_size=5, bucket_max_wait=30, prefetch=1, lease=30)
    for i in range(10):
        await resolve(a.push({"i": i}))
    await resolve(a.flush())
    first = await resolve(a.reserve(timeout=2))
    await resolve(a.commit(first))
    await eventually_async(  # the prefetcher claims the second bucket
        lambda: a.stats()["held_buckets"] == 2, what="the read-ahead claim"
    )
    report = await resolve(a.drain(timeout=0))
    assert report["released_buckets"] == 2
    # Released at once: no lease is left for another consumer to wait out.
    leases = [d["lease"] for d in bucket_flavour.sync_db[a.name].find({}, {"lease": 1})]
    assert leases == [None, None]
    b = bucket_flavour.open(lease=30)
    got = []
    while len(got) < 9:
        m = await resolve(b.reserve(timeout=10))
        assert m is not None, f"only {len(got)} items came back"
        got.append((m.payload["i"], m.tries))
        await resolve(b.commit(m))
    # With no extra try counted.
    assert sorted(got) == [(i, 0) for i in range(1, 10)]


async def test_pause_with_release_gives_back_what_nobody_was_handed(bucket_flavour):
    """pause(release=True): read-ahead goes back at once, a started bucket once its
    handed-out item is finished; nothing of it with a try counted; what is handed out
    stays held and is committed."""
    a = bucket_flavour.open(bucket_max_size=3, bucket_max_wait=30, prefetch=2, lease=120)
    for i in range(9):  # three buckets of three
        await resolve(a.push({"i": i}))
    await resolve(a.flush())
    started = await resolve(a.reserve(timeout=2))
    await eventually_async(  # the prefetcher claims the other two
        lambda: a.stats()["held_buckets"] == 3, what="the read-ahead claims"
    )
    a.pause(release=True)
    b = bucket_flavour.open(lease=30)
    got = []
    while len(got) < 6:  # the two read-ahead buckets, long before a's lease runs out
        m = await resolve(b.reserve(timeout=10))
        assert m is not None, f"only {len(got)} read-ahead items came back"
        got.append((m.payload["i"], m.tries))
        await resolve(b.commit(m))
    # The started bucket stays held while its item is handed out...
    assert await resolve(b.reserve(timeout=0.5)) is None
    assert await resolve(a.commit(started))
    # ...and its other two items go back once it is finished.
    while len(got) < 8:
        m = await resolve(b.reserve(timeout=10))
        assert m is not None, "the started bucket's rest did not come back"
        got.append((m.payload["i"], m.tries))
        await resolve(b.commit(m))
    assert sorted([(started.payload["i"], 0), *got]) == [(i, 0) for i in range(9)]
    # a forgets the bucket once its release write returns, which b may see first
    await eventually_async(lambda: a.stats()["held_buckets"] == 0, what="a holding nothing")
    await resolve(a.close())
    await resolve(b.close())


async def _set(event: asyncio.Event) -> None:
    event.set()


async def test_other_tasks_run_while_an_async_consumer_is_served_from_memory(adb):
    # A reserve() served from memory does not wait; the consumer's own fetcher (its claim
    # ahead) and the application's tasks must still run before it runs dry.
    q = AsyncQueue(adb, "q", **FAST)
    await q.push_many([{"i": i} for i in range(300)])
    await q.flush()
    await q.commit(await q.reserve(timeout=10))  # one bucket claimed: 299 items in memory
    assert q.stats()["ready_in_memory"] == 299
    ran = asyncio.Event()
    other = asyncio.create_task(_set(ran))
    taken = 0
    while not ran.is_set() and taken < 299:
        m = await q.reserve(timeout=0)
        assert m is not None
        await q.commit(m)
        taken += 1
    assert ran.is_set() and taken < 299
    await other
    await q.close()


async def test_drain_serves_in_memory_items_to_consumers_first(bucket_flavour):
    if not bucket_flavour.is_async:
        return await _drain_serves_sync(bucket_flavour)
    q = bucket_flavour.open(bucket_max_size=100, lease=30)
    for i in range(20):
        await q.push({"i": i})
    await q.flush()
    m = await q.reserve(timeout=2)
    served = [m.payload["i"]]
    await q.commit(m)

    async def consumer():
        while True:
            m = await q.reserve(timeout=1)
            if m is None:
                return
            served.append(m.payload["i"])
            await q.commit(m)
            await asyncio.sleep(0.01)

    task = asyncio.ensure_future(consumer())
    report = await q.drain(timeout=10)
    await task
    assert sorted(served) == list(range(20))
    assert report["served"] >= 1 and report["released_items"] == 0
    assert await q.total_size() == 0


async def _drain_serves_sync(f):
    import threading

    q = f.open(bucket_max_size=100, lease=30)
    for i in range(20):
        q.push({"i": i})
    q.flush()
    m = q.reserve(timeout=2)
    served = [m.payload["i"]]
    q.commit(m)

    def consumer():  # ends with the 20th item, or when drain() gave up on the rest
        while len(served) < 20 and (m := q.reserve(timeout=10)) is not None:
            served.append(m.payload["i"])
            q.commit(m)
            time.sleep(0.01)

    t = threading.Thread(target=consumer)
    t.start()
    # drain() serves consumers at work: one that has not called reserve() within a
    # moment of the last one is none (a thread slow to start on a busy machine)
    eventually(lambda: len(served) > 1, what="the consumer thread at work")
    report = q.drain(timeout=10)
    t.join()
    assert sorted(served) == list(range(20))
    assert report["served"] >= 1 and report["released_items"] == 0
    assert q.total_size() == 0


async def test_lease_is_renewed_while_held(bucket_flavour):
    a = bucket_flavour.open(lease=1.0, state_flush_period=0.1)
    b = bucket_flavour.open(lease=1.0, state_flush_period=0.1)
    for i in range(3):
        await resolve(a.push(i))
    await resolve(a.flush())
    held = await resolve(a.reserve(timeout=2))
    # Three lease periods pass; a keeps renewing, so b never gets the bucket.
    assert await resolve(b.reserve(timeout=3)) is None
    await resolve(a.commit(held))
    assert a.stats()["lease_losses"] == 0


def _run(*args, **kw):
    return subprocess.Popen(
        [sys.executable, WORKERS, *args], stdout=subprocess.PIPE, text=True, **kw
    )


def test_killed_consumer_items_come_back_with_a_try_counted(db, mongo_uri, tmp_path):
    q = Queue(db, "q", bucket_max_size=10, bucket_max_wait=0.05)
    for i in range(10):
        q.push({"i": i})
    q.flush()
    out = tmp_path / "held.txt"
    opts = json.dumps({"lease": 2.0, "state_flush_period": 0.1, "prefetch": 0})
    p = _run("hold", mongo_uri, db.name, "q", str(out), "--reserve", "5", "--commit", "4", "--flush-commits",
             "--options", opts)  # fmt: skip
    assert p.stdout.readline().strip() == "READY"
    p.kill()  # SIGKILL: no drain, no flush, the lease stays
    p.wait()
    committed = {int(line.split("\t")[0]) for line in out.read_text().splitlines()}
    assert committed == {0, 1, 2, 3}
    c = Queue(db, "q", lease=2.0, state_flush_period=0.1, poll_interval=0.2)
    got = []
    # Each wait covers the dead consumer's 2 s lease running out, with room for a busy
    # machine; the loop ends as soon as the six are back.
    while (m := c.reserve(timeout=30)) is not None:
        got.append((m.payload["i"], m.tries))
        c.commit(m)
        if len(got) == 6:
            break
    c.close()
    assert sorted(i for i, _ in got) == [4, 5, 6, 7, 8, 9]  # flushed commits never come back
    assert all(t == 1 for _, t in got)


def test_four_consumer_processes_deliver_every_item_once(db, mongo_uri, tmp_path):
    n = 20_000
    q = Queue(db, "q")
    for i in range(n):
        q.push({"i": i})
    q.close()
    out = tmp_path / "consumed.txt"
    procs = [_run("consume", mongo_uri, db.name, "q", str(out), "--idle", "4") for _ in range(4)]
    for p in procs:
        assert p.wait(timeout=240) == 0
    counts = Counter(int(line.split("\t")[0]) for line in out.read_text().splitlines())
    assert len(counts) == n, f"{n - len(counts)} items never delivered"
    dups = {k: v for k, v in counts.items() if v > 1}
    assert not dups, f"{len(dups)} items delivered more than once"
    assert db["q"].count_documents({}) == 0
