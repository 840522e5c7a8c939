#!/usr/bin/env python3
"""Client CPU of bucketq's hot paths per item, without a server, next to the BSON floor.

    python bench/hot_paths.py [--n 51200] [--reps 9]

Where ``bucketq bench`` says how far the whole lifecycle is from the floor, this says
which part of the client the time goes to, and is quiet enough (no server, no threads,
the best of several repetitions) to compare two versions of the code:

- push / push_many: encoding plus packing into open buckets (the writer is not run);
- fetch: decoding claimed buckets and making their messages (``HeldBucket``);
- reserve+commit / reserve_many+commit_many: handing messages out and marking them done.

The floor is ``bson.encode`` + ``bson.decode`` of each payload (docs/performance.md).
"""

from __future__ import annotations

import argparse
import gc
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

import bson
from bson import ObjectId
from pymongo import MongoClient

from bucketq import Queue
from bucketq.benchmark import payload
from bucketq.bucket.codec import decode_items, encode_item
from bucketq.queue import _core as core

BUCKET = 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50 * BUCKET, help="items per measurement")
    ap.add_argument("--reps", type=int, default=9, help="repetitions; the best counts")
    args = ap.parse_args()
    n = args.n - args.n % BUCKET or BUCKET
    logging.disable(logging.CRITICAL)
    items = [payload(i) for i in range(n)]
    blob = b"".join(encode_item(p) for p in items[:BUCKET])
    docs = [
        {"_id": ObjectId(), "n": BUCKET, "mature": datetime.now(UTC), "items": blob, "lease": None}
        for _ in range(n // BUCKET)
    ]
    gc.collect()
    gc.freeze()  # the payloads are the harness's memory, not the queue's
    client: MongoClient = MongoClient("mongodb://127.0.0.1:1", connect=False)  # never contacted
    opened: list[Queue] = []

    def queue() -> Queue:
        q = Queue(client["bench"], "hot", max_pending_bytes=1 << 40)
        # Stand-ins for the background workers, so nothing here talks to a server.
        q._producer._writer = q._consumer.fetcher = object()  # type: ignore[assignment]
        opened.append(q)
        return q

    def fetched() -> Queue:
        q = queue()
        for d in docs:
            b = core.HeldBucket(d, ObjectId(), time.time(), 30)
            b.origin = q  # as a claim sets it: commit() checks who delivered the message
            msgs = b.ready_messages(time.time(), None)
            b.queued = len(msgs)
            q._consumer.held[b.id] = b
            q._consumer.ready.extend(msgs)
        return q

    def best(run: Callable[[], None], setup: Callable[[], object] | None = None) -> float:
        out = float("inf")
        for _ in range(args.reps):
            state = setup() if setup else None
            gc.collect()
            t = time.thread_time()
            run() if state is None else run(state)  # type: ignore[call-arg]
            out = min(out, time.thread_time() - t)
        return 1e6 * out / n

    def push_all() -> None:
        q = queue()
        for p in items:
            q.push(p)

    def push_many_all() -> None:
        q = queue()
        for i in range(0, n, 1000):
            q.push_many(items[i : i + 1000])

    def one_by_one(q: Queue) -> None:
        for _ in range(n):
            q.commit(q.reserve(0.05))  # with a timeout, as a worker loop calls it

    def in_batches(q: Queue) -> None:
        while batch := q.reserve_many(1000, timeout=0):
            q.commit_many(batch)

    rows = [
        ("BSON floor (encode + decode each payload)", best(lambda: [bson.decode(bson.encode(p)) for p in items])),
        ("encode_item", best(lambda: [encode_item(p) for p in items])),
        ("push", best(push_all)),
        ("push_many (1,000 at a time)", best(push_many_all)),
        ("decode_items (whole buckets)", best(lambda: [decode_items(d["items"]) for d in docs])),
        ("fetch (decode + messages)", best(lambda: fetched())),
        ("reserve(timeout) + commit", best(one_by_one, fetched)),
        ("reserve_many + commit_many (1,000)", best(in_batches, fetched)),
    ]  # fmt: skip
    floor = rows[0][1]
    print(f"client CPU per item, best of {args.reps} runs of {n:,} items (no server):")
    for name, us in rows:
        print(f"  {name:<44} {us:6.2f} µs  {us / floor:5.2f}x floor")
    per_item = rows[2][1] + rows[5][1] + rows[6][1]
    batched = rows[3][1] + rows[5][1] + rows[7][1]
    print(
        f"  {'lifecycle, one item at a time':<44} {per_item:6.2f} µs  {per_item / floor:5.2f}x floor"
    )
    print(
        f"  {'lifecycle, through the _many calls':<44} {batched:6.2f} µs  {batched / floor:5.2f}x floor"
    )
    for q in opened:
        q._closed = True  # nothing to write: skip the exit-time close


if __name__ == "__main__":
    main()
