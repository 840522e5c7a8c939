"""Correctness debts found in review: a memory consumer that dies mid-flush gives its
batch back; a Redis storage write slower than the claim idle time is not taken over by
another consumer; ``query`` passes through."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

from bucketq.errors import ConfigurationError, TransportUnavailable
from bucketq.reservoir import BufferedReservoir, MongoReservoir
from fast_settings import FAST_BUFFER

from .conftest import FakeStorage
from .helpers import eventually, logs, settled

pytestmark = pytest.mark.timeout(90)


def break_ack(transport, exc: Exception, times: int = 1) -> dict[str, int]:
    """Make ``transport.ack`` raise ``exc`` the next ``times`` calls; the returned
    ``{"left": n}`` counts down to 0 as they are used."""
    inner_ack = transport.ack
    broken = {"left": times}

    async def ack(shard, deliveries):
        if broken["left"]:
            broken["left"] -= 1
            raise exc
        await inner_ack(shard, deliveries)

    transport.ack = ack
    return broken


async def test_memory_records_held_by_a_flush_that_failed_are_delivered_again(backends):
    storage = FakeStorage()
    transport = backends.transport("memory")
    broken = break_ack(transport, RuntimeError("the consumer died between the write and the ack"))
    buf = BufferedReservoir(storage, transport, FAST_BUFFER)
    async with buf:
        await buf.ingest([dict(r, project_id="one") for r in logs(20)])
        await settled(buf, timeout=20)  # nothing stays in flight forever
        assert broken["left"] == 0
    assert set(storage.messages()) == {f"rec-{i}" for i in range(20)}


async def test_a_transport_that_fails_while_settling_is_trouble_not_a_crash(backends, caplog):
    # The transport's store went away during the ack (tests/server/test_lifecycle.py
    # kills it): a warning, records delivered again, no traceback and no loop error.
    storage = FakeStorage()
    transport = backends.transport("memory")
    broken = break_ack(transport, TransportUnavailable("the transport's MongoDB went away"), 2)
    buf = BufferedReservoir(storage, transport, FAST_BUFFER)
    with caplog.at_level(logging.WARNING, logger="bucketq.reservoir"):
        async with buf:
            await buf.ingest([dict(r, project_id="one") for r in logs(20)])
            await settled(buf, timeout=20)
            assert broken["left"] == 0
            assert buf.stats().get("loop_errors", 0) == 0
    assert set(storage.messages()) == {f"rec-{i}" for i in range(20)}
    unsettled = [r for r in caplog.records if "were not settled" in r.getMessage()]
    assert unsettled and all(r.exc_info is None for r in unsettled)
    assert "went away" in unsettled[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


class SlowFirstWrite(FakeStorage):
    """The first write takes ``seconds`` (longer than the claim idle time)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.started = asyncio.Event()

    async def ingest(self, logs):
        if not self.started.is_set():
            self.started.set()
            await asyncio.sleep(self.seconds)
        return self._write("log", logs)


async def test_redis_a_storage_write_slower_than_claim_idle_is_not_taken_over(backends):
    # Two consumers of one group; the first one's write outlasts claim_idle five times.
    storage = SlowFirstWrite(3.0)
    a = BufferedReservoir(storage, backends.transport("redis", claim_idle=0.6), FAST_BUFFER)
    b = BufferedReservoir(storage, backends.transport("redis", claim_idle=0.6), FAST_BUFFER)
    async with a:
        await a.ingest([dict(r, project_id="one") for r in logs(30)])
        await storage.started.wait()
        async with b:
            await eventually(lambda: len(storage.messages()) >= 30, timeout=30)
            await settled(a)  # b polled for idle deliveries all through a's 3 s write
            await settled(b)
    stored = Counter(storage.messages())
    assert set(stored) == {f"rec-{i}" for i in range(30)}
    assert sum(stored.values()) == 30, f"{sum(stored.values()) - 30} written twice"


async def test_query_passes_through_to_the_storage_engine(adb):
    buf = BufferedReservoir(MongoReservoir(adb), backends_memory(), FAST_BUFFER)
    async with buf:
        await buf.ingest([dict(r, project_id="qp", level="error" if i % 2 else "info")
                          for i, r in enumerate(logs(6))])  # fmt: skip
        await settled(buf)
        rows = await buf.query("log", project_id="qp", level="error", limit=10)
        assert sorted(r["message"] for r in rows) == ["rec-1", "rec-3", "rec-5"]
        assert await buf.query("log", project_id="nobody") == []
        with pytest.raises(ConfigurationError, match="colour"):
            await buf.query("log", colour="red")


def backends_memory():
    from bucketq.reservoir import MemoryTransport

    return MemoryTransport()
