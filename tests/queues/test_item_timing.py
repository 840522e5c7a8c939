"""Per-item timing decisions against a real server: reject_timeout_grace runs per item
(not per bucket), and a commit of a bucket's last item deletes the bucket at once (the
flush it wakes), not a state_flush_period later; and the bucket insert's retries, which
the bucket queue and the stream share."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pymongo.errors import AutoReconnect

from bucketq import AsyncStreamQueue, Queue, StreamQueue
from queue_kinds import resolve
from waiting import eventually_async


async def test_a_stalled_item_is_rolled_back_on_its_own_clock(bucket_flavour):
    """A is handed out and never finished; B, of the same bucket, is handed out
    halfway through A's limit. A comes back once lease + grace passed since *it* was
    handed out; B, still within its own limit, is not rolled back with it."""
    q = bucket_flavour.open(
        bucket_max_size=10, state_flush_period=0.1, lease=1.0, reject_timeout_grace=3.0
    )
    await resolve(q.push_many(["a", "b", "c"]))
    await resolve(q.flush())
    a = await resolve(q.reserve(timeout=30))
    assert a.payload == "a"
    await asyncio.sleep(2.0)  # pacing, not an assertion: B is handed out 2 s after A
    b = await resolve(q.reserve(timeout=30))
    c = await resolve(q.reserve(timeout=30))
    assert (b.payload, c.payload) == ("b", "c")
    assert await resolve(q.commit(c))  # activity on the bucket: A's clock runs on
    again = await resolve(q.reserve(timeout=30))
    assert (again.payload, again.tries) == ("a", 1)
    assert await resolve(q.commit(b))  # B was not rolled back with it
    assert not await resolve(q.commit(a))  # A's first delivery ended with its rollback
    assert await resolve(q.commit(again))


async def test_committing_the_last_item_deletes_the_bucket_at_once(bucket_flavour):
    # A flush period far longer than the wait below: only a flush woken by the last
    # commit can delete the bucket in time.
    q = bucket_flavour.open(bucket_max_size=3, state_flush_period=60.0, lease=300.0)
    await resolve(q.push_many([1, 2, 3]))
    await resolve(q.flush())
    col = bucket_flavour.sync_db[q.name]
    msgs = [await resolve(q.reserve(timeout=30)) for _ in range(3)]
    for m in msgs[:2]:
        assert await resolve(q.commit(m))
    assert col.count_documents({}) == 1
    assert await resolve(q.commit(msgs[2]))
    await eventually_async(
        lambda: col.count_documents({}) == 0 and q.stats()["held_buckets"] == 0,
        timeout=20,
        what="the bucket deleted and forgotten",
    )


def test_stream_close_reports_and_its_insert_retries_count_and_log(db, monkeypatch, caplog):
    s = StreamQueue(db, "s", bucket_max_size=5, bucket_max_wait=0.05)
    real = s._col.insert_one
    calls = []

    def flaky(doc, *a, **k):
        calls.append(doc["_id"])
        if len(calls) == 1:
            raise AutoReconnect("connection reset (injected)")
        return real(doc, *a, **k)

    monkeypatch.setattr(s._col, "insert_one", flaky)
    with caplog.at_level(logging.DEBUG, logger="bucketq"):
        assert s.push("x", durable=True).wait(30)
    assert s.stats()["insert_retries"] == 1
    assert any("retry 1" in r.getMessage() for r in caplog.records)
    # an unanswered insert is a retry at debug level; the outage itself is said once at
    # warning level, and its end once
    said = [r for r in caplog.records if "bucket inserts" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.INFO], said
    s.push_many(list(range(7)))
    report = s.close()
    assert report == {"buckets_written": 2, "push_failed": 0}
    assert s.close() == report and s.drain() == report


@pytest.mark.parametrize("kind", [Queue, StreamQueue])
def test_an_insert_whose_answer_was_lost_is_stored_once(db, monkeypatch, kind):
    """The first insert lands but its answer is lost (the connection drops after the
    write): the retry meets its own bucket (a duplicate key), which counts as stored,
    neither stored twice, nor failed, nor (a stream) renumbered."""
    q = kind(db, "lost", bucket_max_size=5, bucket_max_wait=0.05)
    real = q._col.insert_one
    calls = []

    def lands_then_drops(doc, *a, **k):
        calls.append(doc["_id"])
        res = real(doc, *a, **k)
        if len(calls) == 1:
            raise AutoReconnect("connection reset after the write (injected)")
        return res

    monkeypatch.setattr(q._col, "insert_one", lands_then_drops)
    assert q.push("x", durable=True).wait(30)
    assert calls[0] == calls[1] and len(calls) == 2
    stats = q.stats()
    assert (stats["insert_retries"], stats["push_failed"]) == (1, 0)
    assert db[q.name].count_documents({}) == 1
    if kind is StreamQueue:
        assert stats["renumbered"] == 0
        batch = q.consumer().next_batch(timeout=10)
        assert batch is not None and (batch.seq, batch.items) == (1, ["x"])
    else:
        msg = q.reserve(timeout=10)
        assert msg is not None and msg.payload == "x" and q.total_size() == 1
    q.close()


async def test_async_stream_drain_reports(adb):
    s = AsyncStreamQueue(adb, "s", bucket_max_size=5, bucket_max_wait=30)
    await s.push_many(list(range(12)))
    assert await s.drain() == {"buckets_written": 3, "push_failed": 0}
    assert await eventually_async(lambda: s.position(), what="the position") == {
        "next": 3,
        "acked": 0,
        "epoch": 0,
    }
