"""Two consumers race for the same buckets, in each claim form: many small buckets in
one claim range (one partition, so both search the same head) and in two partitions,
some left with the run-out lease of a holder that died. No bucket is claimed twice
under a live lease (each is claimed once, by one of them) and every item is delivered
once."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from bson import ObjectId
from pymongo import MongoClient

from bucketq import Queue
from fast_settings import FAST

ITEMS = 600
PER_BUCKET = 3
# A lease no run here outlives (a busy machine included): a second claim of a bucket can
# only come from two consumers taking it under one live lease, not from a lapse.
OPTIONS = {**FAST, "lease": 60.0, "prefetch": 2}


def _race(queues: list[Queue], want: int, deadline: float = 120.0) -> list[list[int]]:
    got: list[list[int]] = [[] for _ in queues]
    total = [0]
    lock = threading.Lock()
    end = time.monotonic() + deadline

    def serve(i: int) -> None:
        q = queues[i]
        while time.monotonic() < end:
            with lock:
                if total[0] >= want:
                    return
            msgs = q.reserve_many(20, timeout=0.2)
            for m in msgs:
                q.commit(m)
                got[i].append(m.payload)
            with lock:
                total[0] += len(msgs)

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(len(queues))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("claim", ["find_and_modify", "find_then_update"])
def test_two_consumers_never_claim_a_bucket_twice(mongo_uri, db, claim, partitions):
    # Buckets are sealed by size only: a pause of the pushing thread on a busy machine
    # must not seal one early (as FAST's short bucket_max_wait would).
    producer = Queue(
        db,
        "q",
        bucket_max_size=PER_BUCKET,
        partitions=partitions,
        **{**FAST, "bucket_max_wait": 30.0},
    )
    for i in range(ITEMS):
        producer.push(i, key=i // PER_BUCKET)
    producer.close()
    buckets = db.q.count_documents({})
    assert buckets == ITEMS // PER_BUCKET
    # A holder that died: every third bucket carries its lease, run out a minute ago.
    dead = [d["_id"] for d in db.q.find({}, {"_id": 1})][::3]
    gone = datetime.now(UTC) - timedelta(seconds=60)
    db.q.update_many(
        {"_id": {"$in": dead}},
        {"$set": {"lease": {"tok": ObjectId(), "owner": "dead:1", "until": gone}},
         "$inc": {"leases": 1}},
    )  # fmt: skip

    clients = [MongoClient(mongo_uri) for _ in range(2)]
    consumers = [
        Queue(c[db.name], "q", partitions=partitions, claim=claim, **OPTIONS) for c in clients
    ]
    try:
        got = _race(consumers, ITEMS)
        for q in consumers:
            q.flush()
        stats = [q.stats() for q in consumers]
    finally:
        for q in consumers:
            q.close()
        for c in clients:
            c.close()

    delivered = sorted(got[0] + got[1])
    assert delivered == list(range(ITEMS)), "an item was lost or delivered twice"
    assert all(got), "one consumer claimed nothing: no race was run"
    # Each bucket claimed once (the dead holder's ones taken over once), by one of them.
    assert sum(s["claims"] for s in stats) == buckets
    assert sum(s["takeovers"] for s in stats) == len(dead)
    assert db.q.count_documents({}) == 0
