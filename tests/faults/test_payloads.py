"""Scenario 6: big, oversized and unencodable items."""

from __future__ import annotations

import bson
import pytest

from bucketq import Queue
from bucketq.bucket.codec import decode_items
from bucketq.errors import BucketQError, PayloadTooLarge
from fast_settings import FAST_FAULTS

LIMIT = 1024 * 1024


def test_big_items_fill_buckets_within_max_bytes_and_bad_items_harm_nothing(db):
    q = Queue(db, "q", **{**FAST_FAULTS, "bucket_max_bytes": LIMIT, "bucket_max_wait": 30.0})
    receipts = []
    for i in range(1024):
        receipts.append(q.push({"i": i, "blob": "x" * 20_000}))
        if i == 100:
            with pytest.raises(PayloadTooLarge, match="bucket_max_bytes"):
                q.push({"i": -1, "blob": "x" * LIMIT})
        if i == 200:
            with pytest.raises(BucketQError) as err:
                q.push({"i": -2, "bad": object()})
            assert "encod" in str(err.value).lower()
    q.flush()
    assert all(r.wait(0) for r in receipts)
    sizes, seen = [], []
    for raw in db["q"].find_raw_batches({}):
        for doc in bson.decode_all(raw):
            sizes.append(len(bson.encode(doc)))
            seen += [it["p"]["i"] for it in decode_items(doc["items"])]
    print(f"\n1024 x 20 KB: {len(sizes)} buckets, largest {max(sizes)} bytes (limit {LIMIT})")
    assert max(sizes) <= LIMIT
    assert sorted(seen) == list(range(1024))
    got = 0
    while got < 1024 and (m := q.reserve(timeout=10)) is not None:
        assert m.payload["i"] >= 0
        q.commit(m)
        got += 1
    assert q.reserve(timeout=0) is None and q.size() == 0, "more than 1024 items"
    q.close()
    assert got == 1024
    assert db["q"].count_documents({}) == 0
