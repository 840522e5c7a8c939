"""Fixtures of the reservoir tests: fake storage engines (the buffer's dependency, whose
failures are the thing under test) and real transports (Redis, MongoDB)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from bucketq.reservoir import MemoryTransport, PassthroughTransport, Reservoir
from fast_settings import FAST_SHARD_QUEUE

TRANSPORTS = ["memory", "passthrough", "redis", "bucketq"]


class FakeStorage(Reservoir):
    """Stores in memory. ``poison(record)`` says which records fail and ``mode`` how:
    ``"report"`` (failed count only), ``"indexed"`` (failed count and indices) or
    ``"raise"`` (the whole call raises). ``down`` fails every call by raising.
    ``gated=True`` holds every write (the records stay pending) until ``gate`` is set."""

    def __init__(
        self,
        poison: Callable[[dict], bool] | None = None,
        mode: str = "report",
        gated: bool = False,
    ) -> None:
        self.poison = poison or (lambda r: False)
        self.mode = mode
        self.down = False
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()
        self.stored: dict[str, list[dict]] = {"log": [], "span": [], "metric": []}
        self.calls: Counter[str] = Counter()
        self.seen_poison_calls = 0

    def _write(self, kind: str, records: Sequence[dict]) -> dict[str, Any]:
        self.calls[kind] += 1
        if self.down:
            raise OSError("storage is down")
        bad = [i for i, r in enumerate(records) if self.poison(r)]
        if bad and self.mode == "raise":
            raise ValueError(f"cannot store record {records[bad[0]].get('message')!r}")
        for i, r in enumerate(records):
            if i not in bad:
                self.stored[kind].append(dict(r))
        errors: list[Any] = []
        if bad and self.mode == "indexed":
            errors = [{"index": i, "error": "poison record"} for i in bad]
        elif bad:
            errors = [f"{len(bad)} records rejected"]
        return {"ingested": len(records) - len(bad), "failed": len(bad), "errors": errors}

    async def _gated_write(self, kind: str, records: Sequence[dict]) -> dict[str, Any]:
        await self.gate.wait()
        return self._write(kind, records)

    async def ingest(self, logs):
        return await self._gated_write("log", logs)

    async def ingest_spans(self, spans):
        return await self._gated_write("span", spans)

    async def ingest_metrics(self, metrics):
        return await self._gated_write("metric", metrics)

    async def query(self, kind="log", **filters):
        return [r for r in self.stored[kind] if all(r.get(k) == v for k, v in filters.items())]

    def messages(self, kind: str = "log") -> list[Any]:
        return [r.get("message") for r in self.stored[kind]]


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def prefix() -> str:
    return f"bqtest:{uuid.uuid4().hex[:8]}"


class Backends:
    """Makes transports on the session's servers and removes what they left behind."""

    def __init__(self, request: pytest.FixtureRequest, prefix: str) -> None:
        self.request = request
        self.prefix = prefix
        self.redis_clients: list[Any] = []
        self.mongo_clients: list[Any] = []
        self.db_name = f"bqr_{uuid.uuid4().hex[:10]}"

    def redis(self) -> Any:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.request.getfixturevalue("redis_url"))
        self.redis_clients.append(client)
        return client

    def adb(self) -> Any:
        from pymongo import AsyncMongoClient

        client: Any = AsyncMongoClient(self.request.getfixturevalue("mongo_uri"))
        self.mongo_clients.append(client)
        return client[self.db_name]

    def transport(self, name: str, **options: Any) -> Any:
        """A fresh transport of kind ``name``."""
        if name == "memory":
            return MemoryTransport(**options)
        if name == "passthrough":
            return PassthroughTransport(**options)
        if name == "redis":
            from bucketq.reservoir import RedisTransport

            return RedisTransport(self.redis(), prefix=self.prefix, **options)
        if name == "bucketq":
            from bucketq.reservoir import BucketqTransport

            options.setdefault("queue_options", FAST_SHARD_QUEUE)
            return BucketqTransport(self.adb(), prefix=self.prefix.replace(":", "_"), **options)
        raise ValueError(name)

    async def cleanup(self) -> None:
        for c in self.redis_clients:
            keys = [k async for k in c.scan_iter(match=f"{self.prefix}*")]
            if keys:
                await c.delete(*keys)
            await c.aclose()
        if self.mongo_clients:
            await self.mongo_clients[0].drop_database(self.db_name)
        for c in self.mongo_clients:
            await c.close()


@pytest.fixture
async def backends(request: pytest.FixtureRequest, prefix: str):
    b = Backends(request, prefix)
    yield b
    await b.cleanup()


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()
