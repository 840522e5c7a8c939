"""One contract suite for every queue flavour: bucket and per-element, sync and async.

Tests are written once as coroutines against :class:`Flavour`, which awaits the
async queues and calls the sync ones directly.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from bucketq import AsyncElementQueue, AsyncQueue, ElementQueue, Queue

# Short periods keep the suite fast; the semantics do not depend on them.
FAST = {
    "bucket_max_wait": 0.05,
    "state_flush_period": 0.1,
    "poll_interval": 0.2,
    "lease": 5.0,
    "drain_timeout": 0.5,  # close() at teardown: a message left reserved is not waited on for 5 s
}


async def resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class Flavour:
    def __init__(self, kind: str, sync_db: Any, async_db: Any) -> None:
        self.kind = kind
        self.bucket = kind.startswith("bucket")
        self.is_async = kind.endswith("async")
        self.sync_db = sync_db
        self.async_db = async_db
        self.opened: list[Any] = []

    def open(self, name: str = "q", **options: Any) -> Any:
        cls = {
            "bucket-sync": Queue,
            "bucket-async": AsyncQueue,
            "element-sync": ElementQueue,
            "element-async": AsyncElementQueue,
        }[self.kind]
        q = cls(self.async_db if self.is_async else self.sync_db, name, **{**FAST, **options})
        self.opened.append(q)
        return q

    async def close_all(self) -> None:
        for q in self.opened:
            await resolve(q.close())


async def _flavour(kind, db, mongo_uri):
    client = AsyncMongoClient(mongo_uri)
    f = Flavour(kind, db, client[db.name])
    try:
        yield f
    finally:
        await f.close_all()
        await client.close()


@pytest.fixture(params=["bucket-sync", "bucket-async", "element-sync", "element-async"])
async def flavour(request, db, mongo_uri):
    async for f in _flavour(request.param, db, mongo_uri):
        yield f


@pytest.fixture(params=["bucket-sync", "bucket-async"])
async def bucket_flavour(request, db, mongo_uri):
    async for f in _flavour(request.param, db, mongo_uri):
        yield f
