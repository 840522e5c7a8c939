"""Every queue class opened on the real server, for suites written once for all of them.

A test is a coroutine against :class:`QueueKind`: ``open()`` makes a queue of its
class, and :func:`resolve` awaits what an async queue returns and passes a sync
queue's result through. Import it from any test (``tests/`` is on ``sys.path``)::

    from queue_kinds import resolve
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator
from typing import Any

from pymongo import AsyncMongoClient

from bucketq import AsyncElementQueue, AsyncQueue, ElementQueue, Queue
from bucketq.stream import AsyncStreamQueue, StreamQueue
from fast_settings import FAST

CLASSES = {
    "bucket-sync": Queue,
    "bucket-async": AsyncQueue,
    "element-sync": ElementQueue,
    "element-async": AsyncElementQueue,
    "stream-sync": StreamQueue,
    "stream-async": AsyncStreamQueue,
}
QUEUES = ["bucket-sync", "bucket-async", "element-sync", "element-async"]
#: The bucket queue with each claim form named (the plain kinds use ``claim="auto"``,
#: which picks one by server): the contract holds for both.
CLAIM_QUEUES = ["bucket-fam-sync", "bucket-ftu-async"]
CLASSES["bucket-fam-sync"] = Queue
CLASSES["bucket-ftu-async"] = AsyncQueue
KIND_OPTIONS: dict[str, dict[str, Any]] = {
    "bucket-fam-sync": {"claim": "find_and_modify"},
    "bucket-ftu-async": {"claim": "find_then_update"},
}
BUCKET_QUEUES = ["bucket-sync", "bucket-async"]
STREAMS = ["stream-sync", "stream-async"]


async def resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def consume(q: Any, want: int, deadline: float = 60.0) -> list[Any]:
    """Reserve and commit until ``want`` items came (or ``deadline`` seconds passed);
    their payloads."""
    got = []
    end = time.monotonic() + deadline
    while len(got) < want and time.monotonic() < end:
        msg = await resolve(q.reserve(timeout=0.5))
        if msg is not None:
            await resolve(q.commit(msg))
            got.append(msg.payload)
    return got


class QueueKind:
    """Opens queues of one class (a key of :data:`CLASSES`) on the test's database."""

    def __init__(self, kind: str, sync_db: Any, async_db: Any) -> None:
        self.kind = kind
        self.cls = CLASSES[kind]
        self.bucket = kind.startswith("bucket")
        self.is_async = kind.endswith("async")
        self.sync_db = sync_db
        self.async_db = async_db
        self.db = async_db if self.is_async else sync_db
        self.opened: list[Any] = []

    def open(self, name: str = "q", *, fast: bool = True, **options: Any) -> Any:
        """A queue named ``name``; queues (not streams) get :data:`FAST` unless ``fast``
        is False, under ``options``."""
        options = {**KIND_OPTIONS.get(self.kind, {}), **options}
        if fast and not self.kind.startswith("stream"):
            options = {**FAST, **options}
        q = self.cls(self.db, name, **options)
        self.opened.append(q)
        return q


async def opened_kind(
    kind: str, db: Any, mongo_uri: str, *, broken_ok: bool = False
) -> AsyncIterator[QueueKind]:
    """A :class:`QueueKind` for a fixture to yield; closes every queue it opened after
    the test (a close that fails fails the test unless ``broken_ok``: a misuse test
    may have broken the queue on purpose)."""
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri)
    k = QueueKind(kind, db, client[db.name])
    try:
        yield k
    finally:
        try:
            for q in k.opened:
                try:
                    await resolve(q.close())
                except Exception:
                    if not broken_ok:
                        raise
        finally:
            await client.close()
