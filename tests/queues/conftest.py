"""One contract suite for every queue flavour: bucket and per-element, sync and async.

Tests are written once as coroutines against ``queue_kinds.QueueKind``, whose queues
``queue_kinds.resolve`` awaits when async and passes through when sync.
"""

from __future__ import annotations

import pytest

from queue_kinds import BUCKET_QUEUES, CLAIM_QUEUES, QUEUES, opened_kind


@pytest.fixture(params=QUEUES + CLAIM_QUEUES)
async def flavour(request, db, mongo_uri):
    async for k in opened_kind(request.param, db, mongo_uri):
        yield k


@pytest.fixture(params=BUCKET_QUEUES)
async def bucket_flavour(request, db, mongo_uri):
    async for k in opened_kind(request.param, db, mongo_uri):
        yield k
