"""A damaged bucket in a stream: the ordered consumer never skips it silently. It
delivers what comes before, then raises DamagedBucket naming the seq (again on every
call, without dying), and goes on once ``quarantine(seq)`` set the bucket aside."""

from __future__ import annotations

import pytest

from bucketq import DamagedBucket
from bucketq.errors import ConfigurationError
from bucketq.stream import AsyncStreamQueue, StreamQueue
from fast_settings import FAST_STREAM
from waiting import DEFAULT_TIMEOUT

#: Reads of buckets stored already: a bound for a busy machine, never waited by a pass.
WAIT = DEFAULT_TIMEOUT


def test_a_damaged_stream_bucket_stops_in_order_until_quarantined(db):
    q = StreamQueue(db, "s", **FAST_STREAM)
    q.push_many([{"i": i} for i in range(30)])
    q.flush()
    good = db.s.find_one({"_id": 2})
    db.s.update_one({"_id": 2}, {"$set": {"n": 11}})  # ten items, says eleven
    c = q.consumer()
    first = c.next_batch(WAIT)
    assert first.seq == 1
    c.ack(1)
    for _ in range(2):  # the same answer each time: the consumer does not die
        with pytest.raises(DamagedBucket) as err:
            c.next_batch(WAIT)
        assert err.value.seq == 2 and "quarantine(2)" in str(err.value)
    with pytest.raises(ConfigurationError):
        c.quarantine(3)  # seq 3 is sound: only a damaged bucket goes
    assert c.quarantine(2) is True
    third = c.next_batch(WAIT)
    assert third.seq == 3 and third.items == [{"i": i} for i in range(20, 30)]
    c.ack(3)
    assert q.stats()["quarantined"] == 1

    [entry] = q.quarantined()
    assert entry["id"] == "2" and "n=11" in entry["reason"]
    assert (entry["recoverable"], entry["lost"]) == (10, 1)
    assert db["s.quarantine"].find_one({"_id": 2})["bucket"]["items"] == good["items"]
    report = q.requeue_quarantined()
    assert report == {"buckets": 1, "items": 10, "lost": 1, "kept": 1}
    again = c.next_batch(WAIT)
    assert again.seq == 4 and again.items == [{"i": i} for i in range(10, 20)]
    c.ack(4)
    assert q.remove_quarantined(2) == 1 and q.quarantined() == []
    q.close()


async def test_async_stream_consumer_meets_an_undecodable_bucket(adb, db):
    async with AsyncStreamQueue(adb, "s", **FAST_STREAM) as q:
        await q.push_many(list(range(20)))
        await q.flush()
        db.s.update_one({"_id": 1}, {"$set": {"items": b"\x07\x00\x00\x00\x00"}})
        c = await q.consumer()
        with pytest.raises(DamagedBucket) as err:
            await c.next_batch(WAIT)
        assert err.value.seq == 1
        assert await c.quarantine(1)
        b = await c.next_batch(WAIT)
        assert (b.seq, b.items) == (2, list(range(10, 20)))
        await c.ack(2)
        [entry] = await q.quarantined()
        assert (entry["recoverable"], entry["lost"]) == (0, 10)
        assert (await q.requeue_quarantined())["items"] == 0
        assert await q.remove_quarantined() == 1
