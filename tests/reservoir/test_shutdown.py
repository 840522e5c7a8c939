"""stop(): drains, reports what is left and where; wrap_reservoir is off by default."""

from __future__ import annotations

import asyncio

import pytest

from bucketq.reservoir import BufferConfig, BufferedReservoir, MemoryTransport, wrap_reservoir
from fast_settings import FAST_BUFFER
from waiting import eventually_async

from .conftest import FakeStorage
from .helpers import logs

pytestmark = pytest.mark.timeout(60)


class SlowStorage(FakeStorage):
    async def ingest(self, logs):
        await asyncio.sleep(0.05)
        return self._write("log", logs)


async def test_memory_stop_drains_everything_including_retries(backends):
    storage = SlowStorage(poison=lambda r: r["message"] == "rec-3", mode="indexed")
    buf = BufferedReservoir(storage, backends.transport("memory"), FAST_BUFFER)
    await buf.start()
    for i in range(0, 300, 30):
        await buf.ingest(logs(30, start=i))
    report = await buf.stop()
    print(f"\n[stop/memory] {report}")
    assert report["left"] == 0 and report["lost"] == 0 and not report["timed_out"]
    assert len(set(storage.messages())) == 299 and await buf.dlq_size() == 1
    res = await buf.ingest(logs(2, start=1000))  # after stop: straight to storage
    assert res["ingested"] == 2 and "rec-1000" in storage.messages()


async def test_memory_stop_at_the_deadline_reports_what_is_lost(backends):
    storage = FakeStorage()
    storage.down = True
    cfg = FAST_BUFFER.with_(max_retry_attempts=100, base_delay_ms=200, max_delay_ms=1000)
    buf = BufferedReservoir(storage, backends.transport("memory"), cfg)
    await buf.start()
    await buf.ingest(logs(20))
    report = await buf.stop(timeout=0.5)
    print(f"\n[stop/memory, storage down] {report}")
    assert (
        report["timed_out"]
        and report["left"] == 20
        and report["lost"] == 20
        and report["kept"] == 0
    )


async def test_wrap_reservoir_is_off_by_default_and_health_reports_the_buffer():
    storage = FakeStorage()
    assert wrap_reservoir(storage, BufferConfig()) is storage
    buf = wrap_reservoir(storage, BufferConfig(enabled=True, shards=2))
    assert isinstance(buf, BufferedReservoir) and isinstance(buf.transport, MemoryTransport)
    async with buf:
        await buf.ingest(logs(3))
        h = await buf.health()
        assert h["status"] == "ok" and h["buffer"]["state"] == "running" and h["buffer"]["ok"]
        # stored, then acknowledged: no longer pending
        await eventually_async(
            lambda: len(storage.stored["log"]) == 3 and buf.stats()["pending"] == 0,
            timeout=10, what="the buffer to store the records and no longer hold them",
        )  # fmt: skip


async def test_a_signal_stops_the_http_server_first_then_drains_the_buffer(backends):
    import os
    import signal

    from bucketq.reservoir import install_signal_handlers

    storage = SlowStorage()
    buf = BufferedReservoir(storage, backends.transport("memory"), FAST_BUFFER)
    await buf.start()
    await buf.ingest(logs(50))
    events: list[tuple[str, object]] = []
    done = asyncio.Event()

    async def stop_server():
        events.append(("server stopping; buffer", buf.stats()["state"]))
        # A request still in flight while the server shuts down lands in the buffer.
        events.append(("late request ingested", (await buf.ingest(logs(5, start=500)))["ingested"]))

    def stopped(report):
        events.append(("buffer stopped; left", report["left"]))
        done.set()

    remove = install_signal_handlers(buf, before_stop=stop_server, on_stopped=stopped)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(done.wait(), 30)
    finally:
        remove()
    assert events == [
        ("server stopping; buffer", "running"),
        ("late request ingested", 5),
        ("buffer stopped; left", 0),
    ]
    assert buf.stats()["bypassed"] == 0 and len(storage.messages()) == 55
