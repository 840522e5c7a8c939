"""The circuit breaker, alone and in the buffer, with an injected clock (no sleeps to
wait out cooldowns)."""

from __future__ import annotations

import asyncio

import pytest

from bucketq.errors import ConfigurationError
from bucketq.reservoir import BufferedReservoir
from bucketq.reservoir._breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from fast_settings import FAST_BUFFER

from .conftest import FakeStorage
from .helpers import eventually, logs, settled

pytestmark = pytest.mark.timeout(60)


def breaker(clock, **kw) -> CircuitBreaker:
    opts = {
        "pending_threshold": 100,
        "failure_threshold": 3,
        "cooldown": 30.0,
        "window": 60.0,
        "clock": clock,
    }
    return CircuitBreaker(**{**opts, **kw})


def test_opens_on_pending_over_threshold(fake_clock):
    b = breaker(fake_clock)
    b.record_pending(100)
    assert b.state == CLOSED and b.allow()
    b.record_pending(101)
    assert b.state == OPEN and not b.allow() and "101 records pending" in b.reason
    assert b.retry_after() == 30.0


def test_opens_on_failures_in_the_rolling_window_only(fake_clock):
    b = breaker(fake_clock, rule="window")
    b.record_failure(3)
    assert b.state == CLOSED  # 3 is not more than 3
    fake_clock.advance(61)  # those fall out of the window
    b.record_failure(3)
    assert b.state == CLOSED and b.failures_in_window() == 3
    b.record_failure()
    assert b.state == OPEN and "4 flush failures" in b.reason


def test_consecutive_rule_opens_on_failed_flushes_in_a_row_and_a_success_resets(fake_clock):
    b = breaker(fake_clock)  # the seed's rule is the default
    assert b.rule == "consecutive"
    b.record_failure()
    b.record_failure()
    b.record_success()  # a fully stored flush: the count starts over
    b.record_failure()
    b.record_failure()
    assert b.state == CLOSED and b.consecutive_failures == 2
    fake_clock.advance(3600)  # no window: time alone does not forgive
    b.record_failure()
    assert b.state == OPEN and "3 flushes failed in a row (threshold 3)" in b.reason
    # Its options are checked as every option is, the error naming the option.
    for bad, says in [({"rule": "sometimes"}, "rule must be one of 'consecutive', 'window'"),
                      ({"failure_threshold": 0}, "failure_threshold must be a whole number"),
                      ({"window": float("nan")}, "window must be a finite number"),
                      ({"cooldown": -1.0}, "cooldown must be a finite number at least 0")]:  # fmt: skip
        with pytest.raises(ConfigurationError, match=says):
            breaker(fake_clock, **bad)


async def test_a_flush_counts_once_and_refused_enqueues_do_not_count(backends):
    from bucketq.errors import TransportUnavailable

    storage = FakeStorage(poison=lambda r: r.get("name") == "bad" or r.get("message") == "bad",
                          mode="indexed")  # fmt: skip
    transport = backends.transport("memory")
    buf = BufferedReservoir(
        storage, transport, FAST_BUFFER.with_(failure_threshold=3, max_retry_attempts=1)
    )
    async with buf:
        # One flush in which two kinds fail: one failed flush, not two.
        await asyncio.gather(
            buf.ingest([{"project_id": "a0", "message": "bad"}]),
            buf.ingest_metrics([{"project_id": "a0", "name": "bad", "value": 1}]),
        )
        await settled(buf)
        assert buf.stats()["dead_lettered"] == 2 and storage.calls == {"log": 1, "metric": 1}
        assert buf.breaker.consecutive_failures == 1 and buf.breaker.state == CLOSED
        # A refused enqueue goes straight to storage and is no flush failure.
        inner = transport.enqueue_many

        async def refuse(shard, entries):
            raise TransportUnavailable("full")

        transport.enqueue_many = refuse
        failures = buf.breaker.consecutive_failures
        for _ in range(5):
            assert (await buf.ingest(logs(2)))["ingested"] == 2
        assert buf.breaker.consecutive_failures == failures and buf.breaker.state == CLOSED
        transport.enqueue_many = inner


def test_half_opens_after_cooldown_then_success_closes_and_failure_reopens(fake_clock):
    seen = []
    b = breaker(fake_clock)
    b.listeners.append(lambda old, new, why: seen.append((old, new)))
    b.record_pending(1000)
    fake_clock.advance(29.9)
    assert b.state == OPEN and b.retry_after() == pytest.approx(0.1)
    fake_clock.advance(0.1)
    assert b.state == HALF_OPEN and b.allow()
    b.record_failure()
    assert b.state == OPEN  # a failure while half-open reopens at once
    fake_clock.advance(30)
    assert b.state == HALF_OPEN
    b.record_success()
    assert b.state == CLOSED and b.failures_in_window() == 0
    assert seen == [
        (CLOSED, OPEN),
        (OPEN, HALF_OPEN),
        (HALF_OPEN, OPEN),
        (OPEN, HALF_OPEN),
        (HALF_OPEN, CLOSED),
    ]


async def test_buffer_trips_on_pending_bypasses_then_half_opens_and_closes(fake_clock, backends):
    storage = FakeStorage(gated=True)
    cfg = FAST_BUFFER.with_(pending_threshold=5, cooldown_ms=30_000)
    buf = BufferedReservoir(storage, backends.transport("memory"), cfg, clock=fake_clock)
    async with buf:
        res = await buf.ingest(logs(8))  # accepted into the buffer; the writes hang
        assert res == {"ingested": 8, "failed": 0, "errors": []}
        assert buf.breaker.state == OPEN and buf.pending == 8
        # While open, an ingest is a synchronous storage write: it returns once stored.
        storage.gate.set()
        res = await buf.ingest(logs(3, start=100))
        assert res["ingested"] == 3
        assert {"rec-100", "rec-101", "rec-102"} <= set(storage.messages())
        assert buf.stats()["bypassed"] == 3
        await settled(buf)
        fake_clock.advance(30)
        assert buf.breaker.state == HALF_OPEN
        await buf.ingest(logs(2, start=200))  # buffered again
        await eventually(
            lambda: buf.breaker.state == CLOSED, what="a successful flush to close the breaker"
        )
        await settled(buf)
    assert sorted(storage.messages()) == sorted(
        [f"rec-{i}" for i in range(8)] + ["rec-100", "rec-101", "rec-102", "rec-200", "rec-201"]
    )
    assert buf.stats()["enqueued"] == 10


async def test_buffer_trips_on_flush_failures_and_bypass_reports_storage_errors(
    fake_clock, backends
):
    storage = FakeStorage()
    storage.down = True
    cfg = FAST_BUFFER.with_(
        failure_threshold=2, max_retry_attempts=10, base_delay_ms=1, max_delay_ms=5
    )
    buf = BufferedReservoir(storage, backends.transport("memory"), cfg, clock=fake_clock)
    async with buf:
        await buf.ingest(logs(4))
        await eventually(lambda: buf.breaker.state == OPEN, what="the breaker to open on failures")
        assert "flushes failed in a row" in buf.breaker.reason
        with pytest.raises(OSError):  # the caller sees storage's failure, not a false ack
            await buf.ingest(logs(1, start=50))
        storage.down = False
        fake_clock.advance(cfg.cooldown_ms / 1000)
        await eventually(
            lambda: buf.breaker.state == CLOSED, what="half-open, then a successful flush"
        )
        await settled(buf)
    assert sorted(storage.messages()) == [f"rec-{i}" for i in range(4)]
