"""Processes the stream tests start and kill (run as a script: ``python stream_worker.py MODE URI DB``)."""

from __future__ import annotations

import os
import sys
import time

from pymongo import MongoClient

from bucketq.errors import Fenced
from bucketq.stream import StreamQueue


def zombie(db) -> None:
    """Open a consumer, read one batch, then (when told) try to go on: must be fenced."""
    q = StreamQueue(db, "s")
    c = q.consumer()
    b = c.next_batch(timeout=10)
    print(f"read {b.seq}", flush=True)
    sys.stdin.readline()  # the test opens a newer consumer meanwhile
    for name, call in (
        ("ack", lambda: c.ack(b.seq)),
        ("next_batch", lambda: c.next_batch(timeout=1)),
    ):
        try:
            call()
            print(f"{name} ok", flush=True)
        except Fenced:
            print(f"{name} fenced", flush=True)


def sink(db) -> None:
    """Consume into a sink that stores each bucket under its seq (atomic, one insert);
    resume after the sink's highest seq. Runs until killed."""
    q = StreamQueue(db, "s")
    top = db.sink.find_one(sort=[("_id", -1)])
    c = q.consumer(after=top["_id"] if top else None)
    print("started", flush=True)
    while True:
        b = c.next_batch(timeout=0.5)
        if b is None:
            print("idle", flush=True)
            continue
        db.sink.insert_one({"_id": b.seq, "items": b.items})
        c.ack(b.seq)


def die_after_allocate(db) -> None:
    """Take a sequence number and hang before writing the bucket (the test SIGKILLs us)."""
    q = StreamQueue(db, "s")
    real_insert = q._col.insert_one

    def hang(*a, **k):
        print("allocated", flush=True)
        time.sleep(3600)
        return real_insert(*a, **k)

    q._col.insert_one = hang  # type: ignore[method-assign]
    q.push({"lost": True})
    q.flush()


def push(db) -> None:
    """Push one item (``{"pid": ...}``) durably, say so, and exit."""
    q = StreamQueue(db, "s")
    q.push({"pid": os.getpid()}, durable=True)
    print("pushed", flush=True)
    q.close()


if __name__ == "__main__":
    mode, uri, name = sys.argv[1:4]
    client = MongoClient(uri)
    modes = {"zombie": zombie, "sink": sink, "die-after-allocate": die_after_allocate, "push": push}
    modes[mode](client[name])
