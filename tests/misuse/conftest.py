"""The misuse suite: every queue class, the stream, the reservoir config and the CLI
given wrong values and wrong calls on purpose.

Each kind fixture opens queues of one class on the real server (``queue_kinds``);
``resolve`` runs a sync method or awaits an async one, so a test is written once for
all classes. Queues a test broke on purpose may fail to close at teardown.
"""

from __future__ import annotations

import pytest

from queue_kinds import BUCKET_QUEUES, QUEUES, STREAMS, opened_kind


@pytest.fixture(params=QUEUES)
async def queue_kind(request, db, mongo_uri):
    async for k in opened_kind(request.param, db, mongo_uri, broken_ok=True):
        yield k


@pytest.fixture(params=BUCKET_QUEUES)
async def bucket_kind(request, db, mongo_uri):
    async for k in opened_kind(request.param, db, mongo_uri, broken_ok=True):
        yield k


@pytest.fixture(params=STREAMS)
async def stream_kind(request, db, mongo_uri):
    async for k in opened_kind(request.param, db, mongo_uri, broken_ok=True):
        yield k
