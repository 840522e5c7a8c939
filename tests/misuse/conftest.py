"""The misuse suite: every queue class, the stream, the reservoir config and the CLI
given wrong values and wrong calls on purpose.

Each flavour fixture opens queues of one class on the real server; ``call`` runs a sync
method or awaits an async one, so a test is written once for all four classes.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from bucketq import AsyncElementQueue, AsyncQueue, ElementQueue, Queue
from bucketq.stream import AsyncStreamQueue, StreamQueue

FAST = {
    "bucket_max_wait": 0.05,
    "state_flush_period": 0.1,
    "poll_interval": 0.2,
    "lease": 5.0,
    "drain_timeout": 0.5,  # close() at teardown: a message left reserved is not waited on for 5 s
}
CLASSES = {
    "bucket-sync": Queue,
    "bucket-async": AsyncQueue,
    "element-sync": ElementQueue,
    "element-async": AsyncElementQueue,
    "stream-sync": StreamQueue,
    "stream-async": AsyncStreamQueue,
}


async def call(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class Opener:
    def __init__(self, kind: str, sync_db: Any, async_db: Any) -> None:
        self.kind = kind
        self.cls = CLASSES[kind]
        self.is_async = kind.endswith("async")
        self.db = async_db if self.is_async else sync_db
        self.opened: list[Any] = []

    def open(self, name: str = "q", *, fast: bool = True, **options: Any) -> Any:
        if fast and not self.kind.startswith("stream"):
            options = {**FAST, **options}
        q = self.cls(self.db, name, **options)
        self.opened.append(q)
        return q

    async def close_all(self) -> None:
        for q in self.opened:
            try:
                await call(q.close())
            except Exception:  # noqa: BLE001 - a test may have broken it on purpose
                pass


async def _opener(kind: str, db: Any, mongo_uri: str):
    client = AsyncMongoClient(mongo_uri)
    o = Opener(kind, db, client[db.name])
    try:
        yield o
    finally:
        await o.close_all()
        await client.close()


@pytest.fixture(params=["bucket-sync", "bucket-async", "element-sync", "element-async"])
async def queue_kind(request, db, mongo_uri):
    async for o in _opener(request.param, db, mongo_uri):
        yield o


@pytest.fixture(params=["bucket-sync", "bucket-async"])
async def bucket_kind(request, db, mongo_uri):
    async for o in _opener(request.param, db, mongo_uri):
        yield o


@pytest.fixture(params=["stream-sync", "stream-async"])
async def stream_kind(request, db, mongo_uri):
    async for o in _opener(request.param, db, mongo_uri):
        yield o
