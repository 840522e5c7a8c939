"""The key cache under concurrency: requests arriving together while the entry is
missing or expired share one lookup (real MongoDB, finds counted by command monitoring)."""

from __future__ import annotations

import asyncio

from pymongo import AsyncMongoClient, monitoring

from bucketq.server import _keys


class _Finds(monitoring.CommandListener):
    def __init__(self) -> None:
        self.n = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        # Finds of keys (the checksum's secret is read once besides, at the first new key).
        if event.command_name == "find" and event.command["find"] == _keys.KEYS_COLLECTION:
            self.n += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None: ...

    def failed(self, event: monitoring.CommandFailedEvent) -> None: ...


async def test_concurrent_lookups_of_one_key_send_one_find(mongo_uri, db):
    key = _keys.create_key(db, "p1")
    other = _keys.create_key(db, "p2")
    finds = _Finds()
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri, event_listeners=[finds])
    now = [0.0]
    try:
        cache = _keys.KeyCache(client[db.name], ttl=1.0, clock=lambda: now[0])
        got = await asyncio.gather(*(cache.lookup(k) for k in [key] * 50 + [other] * 20))
        assert {i.project for i in got[:50]} == {"p1"} and {i.project for i in got[50:]} == {"p2"}
        assert finds.n == 2
        # expired: the next burst shares one lookup again, and sees a revocation
        _keys.revoke_key(db, key[: _keys.SHOWN])
        now[0] = 1.5
        got = await asyncio.gather(*(cache.lookup(key) for _ in range(30)))
        assert all(i.revoked for i in got) and finds.n == 3
        # a caller that gives up does not take the shared lookup down with it
        now[0] = 3.0
        first = asyncio.ensure_future(cache.lookup(key))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(cache.lookup(key))
        first.cancel()
        assert (await second).revoked and finds.n == 4
    finally:
        await client.close()
