"""The decision behind reclaiming a bucket this process still holds (pure, no server)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from bson import ObjectId

from bucketq.bucket.codec import encode_item
from bucketq.queue._core.held import HeldBucket, fenced_filter


def _held(n: int = 4) -> tuple[HeldBucket, dict]:
    doc = {"_id": ObjectId(), "n": n, "live": n, "mature": datetime.now(UTC),
           "items": b"".join(encode_item({"i": i}, None) for i in range(n)), "lease": None}  # fmt: skip
    tok = ObjectId()
    b = HeldBucket(doc, tok, time.time(), 2.0)
    b.ready_messages(time.time(), None)
    b.commit(0)
    b.dirty = False
    return b, {**doc, "lease": {"tok": tok, "owner": "x", "until": datetime.now(UTC)}}


def test_reclaim_keeps_state_when_nobody_held_the_bucket_in_between():
    b, before = _held()
    new = ObjectId()
    assert b.reclaim(before, new, time.time(), 2.0)
    assert b.token == new and b.dirty and b.is_done(0) and b.live == 3
    assert fenced_filter(b)["lease.tok"] == new


def test_reclaim_refuses_when_another_consumer_held_it():
    b, before = _held()
    before["lease"]["tok"] = ObjectId()
    old = b.token
    assert not b.reclaim(before, ObjectId(), time.time(), 2.0)
    assert b.token == old


def test_reclaim_refuses_a_lost_or_released_bucket():
    for attr in ("lost", "released"):
        b, before = _held()
        setattr(b, attr, True)
        assert not b.reclaim(before, ObjectId(), time.time(), 2.0)
