"""One item's bad data fails only that item: its neighbours in the same write are
stored and delivered, dead-lettering and state flushes go on for every other bucket,
and a receipt says exactly what happened (stored, stored with the write concern
unconfirmed, or not stored)."""

from __future__ import annotations

import time

import pytest

from bucketq import ConfigurationError, PushFailed
from bucketq.bucket.codec import encode_item
from bucketq.bucket.options import BUCKET_OVERHEAD, HARD_MAX_BYTES
from bucketq.errors import WriteConcernNotConfirmed
from queue_kinds import resolve


async def drain_payloads(q, expect: int, timeout: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        m = await resolve(q.reserve(timeout=1))
        if m is not None:
            got.append(m.payload)
            assert await resolve(q.commit(m))
    return got


async def test_a_bad_delay_fails_its_own_push_only(queue_kind):
    q = queue_kind.open()
    good = [await resolve(q.push(i, delay=0.01)) for i in range(50)]
    with pytest.raises(ConfigurationError, match="delay"):
        await resolve(q.push("bad", delay=1e12))
    more = [await resolve(q.push(i, delay=0.01)) for i in range(50, 60)]
    await resolve(q.flush())
    for r in good + more:
        assert await resolve(r.wait(10)) is True
    assert sorted(await drain_payloads(q, 60)) == list(range(60))


async def test_a_bucket_that_cannot_be_built_fails_only_its_own_receipts(bucket_kind):
    """Data that escaped the push-time checks (here: an item packed straight into the
    packer with a mature time no BSON datetime can hold) fails its own bucket's receipts;
    the other buckets of the same insert are stored and delivered."""
    q = bucket_kind.open(bucket_max_wait=5.0)
    good = [await resolve(q.push(i)) for i in range(20)]
    delayed = [await resolve(q.push(i, delay=0.01)) for i in range(20, 30)]
    bad = q._producer.add(encode_item("bad"), 1e12, time.time())  # the year 33715
    await resolve(q.flush())
    for r in good + delayed:
        assert await resolve(r.wait(10)) is True
    with pytest.raises(PushFailed, match="NOT stored") as info:
        await resolve(bad.wait(10))
    assert not isinstance(info.value, WriteConcernNotConfirmed)
    assert sorted(await drain_payloads(q, 30)) == list(range(30))
    assert q.stats()["push_failed"] == 1


async def test_close_reports_the_items_it_could_not_store(bucket_kind):
    """close() says how many buffered items were NOT stored, as StreamQueue.close() does."""
    q = bucket_kind.open(bucket_max_wait=5.0)
    await resolve(q.push(1))
    bad = q._producer.add(encode_item("bad"), 1e12, time.time())  # a bucket BSON cannot hold
    report = await resolve(q.close())
    assert report["push_failed"] == 1 and report["buckets_written"] == 1
    with pytest.raises(PushFailed):
        await resolve(bad.wait(10))
    assert await resolve(q.close()) == report  # idempotent: the same report


async def test_an_undeliverable_dead_letter_stays_and_other_flushes_land(bucket_kind):
    """max_tries=1: every rollback dead-letters. One item is too large to carry the
    dead-letter headers: it cannot be moved. It does not block the others: the other
    rolled-back items reach the dead-letter queue, commits of every bucket are written,
    and the big item stays stored in the queue (never lost)."""
    q = bucket_kind.open(max_tries=1, bucket_max_bytes=HARD_MAX_BYTES, bucket_max_size=4)
    # It fits a bucket of the queue, but not with the dead-letter headers added.
    big = "x" * (HARD_MAX_BYTES - BUCKET_OVERHEAD - 40)
    assert len(encode_item(big)) <= HARD_MAX_BYTES - BUCKET_OVERHEAD
    receipts = [await resolve(q.push(big))]
    receipts += [await resolve(q.push(f"dead{i}")) for i in range(3)]
    receipts += [await resolve(q.push(f"keep{i}")) for i in range(8)]
    await resolve(q.flush())
    for r in receipts:
        assert await resolve(r.wait(10))
    seen = set()
    deadline = time.monotonic() + 30
    while len(seen) < 12 and time.monotonic() < deadline:
        m = await resolve(q.reserve(timeout=1))
        if m is None:
            continue
        name = "big" if m.payload == big else m.payload
        seen.add(name)
        if name.startswith("keep"):
            assert await resolve(q.commit(m)) is True
        else:
            assert await resolve(q.rollback(m)) is True
    assert len(seen) == 12, sorted(seen)
    dlq = bucket_kind.open("q.dlq")
    deadline = time.monotonic() + 20
    while await resolve(dlq.total_size()) < 3 and time.monotonic() < deadline:
        await resolve(q.flush())
    got = {}
    while len(got) < 3 and (m := await resolve(dlq.reserve(timeout=10))) is not None:
        got[m.payload] = m.headers
        await resolve(dlq.commit(m))
    assert set(got) == {"dead0", "dead1", "dead2"}
    assert await resolve(dlq.reserve(timeout=0)) is None
    assert got["dead0"]["x-source-queue"] == "q"
    await resolve(q.flush())
    # The committed and dead-lettered items are gone; the big one is still stored here.
    assert await resolve(q.total_size()) == 1
    assert q.stats()["dead_letter_failed"] >= 1
    assert q.stats()["committed"] == 8


def test_dead_letter_headers_of_old_data_keep_what_they_can():
    from bucketq.queue._core.redelivery import dead_letter_headers

    h = dead_letter_headers("q", [1, 2], 3, "why", time.time())
    assert h["x-original-headers"] == "[1, 2]" and h["x-tries"] == 3
    assert dead_letter_headers("q", {"a": 1}, 1, "why", time.time())["a"] == 1


async def test_a_receipt_says_whether_an_unconfirmed_write_was_stored(queue_kind, db):
    """{"w": 2} on a server with one data-bearing node: the insert lands, the write
    concern cannot be confirmed. The receipt must not say 'not stored'."""
    q = queue_kind.open("wc", write_concern={"w": 2, "wtimeout": 2000})
    err = None
    try:
        r = await resolve(q.push("x"))
        await resolve(q.flush())
        await resolve(r.wait(30))
    except PushFailed as exc:
        err = exc
    stored = db["wc"].count_documents({})
    if stored:
        assert isinstance(err, WriteConcernNotConfirmed), err
        assert "IS stored" in str(err) and "Do not push it again" in str(err)
    else:  # a server that refuses the write outright: then it is reported as not stored
        assert isinstance(err, PushFailed) and not isinstance(err, WriteConcernNotConfirmed)
    if queue_kind.kind.startswith("bucket"):
        assert q.stats()["write_concern_unconfirmed"] == (1 if stored else 0)
