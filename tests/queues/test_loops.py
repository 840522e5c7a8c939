"""Background loops survive what they do not expect: a failure injected into the
fetcher, the flusher or the writer is counted in stats()["loop_errors"], logged once
with its traceback, and the queue goes on delivering."""

from __future__ import annotations

import logging
import time

import pytest

from bucketq import PushFailed
from bucketq._guard import LoopGuard
from queue_kinds import consume, resolve


def fail_first(obj, name: str, times: int = 1) -> list[int]:
    """Make ``obj.name`` raise RuntimeError on its first ``times`` calls."""
    real = getattr(obj, name)
    calls = [0]

    def patched(*a, **k):
        calls[0] += 1
        if calls[0] <= times:
            raise RuntimeError(f"injected failure in {name}")
        return real(*a, **k)

    setattr(obj, name, patched)
    return calls


def errors_about(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and text in str(r.exc_info)]


@pytest.mark.parametrize("loop,method", [("fetcher", "_claim"), ("flusher", "_requeue_due")])
async def test_a_loop_that_fails_goes_on(bucket_flavour, loop, method, caplog):
    q = bucket_flavour.open(bucket_max_size=10)
    await resolve(q.push_many(list(range(50))))
    await resolve(q.flush())
    calls = fail_first(q._consumer, method, times=2)  # the consume side lives there
    with caplog.at_level(logging.DEBUG, logger="bucketq.queue"):
        got = await consume(q, 50)
        end = time.monotonic() + 30
        while calls[0] <= 2 and time.monotonic() < end:  # the flusher's failures come later
            await resolve(q.reserve(timeout=0.2))
    assert sorted(got) == list(range(50))
    assert q.stats()["loop_errors"] == 2
    # Logged with its traceback once; the same failure again only at debug level.
    assert len(errors_about(caplog, f"injected failure in {method}")) == 1
    assert any(loop in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    await resolve(q.flush())
    assert await resolve(q.total_size()) == 0  # the commits were flushed after all


async def test_the_writer_fails_one_batch_and_writes_the_next(bucket_flavour, caplog):
    q = bucket_flavour.open()
    fail_first(q._producer, "_write")  # the writer calls the write it was given
    with caplog.at_level(logging.ERROR, logger="bucketq.queue"):
        r = await resolve(q.push({"lost": True}))
        with pytest.raises(PushFailed):
            await resolve(r.wait(30))
    assert await resolve((await resolve(q.push({"kept": True}, durable=True))).wait(1))
    assert q.stats()["loop_errors"] == 1
    assert [m["kept"] for m in await consume(q, 1)] == [True]


def test_the_guard_backs_off_bounded_and_starts_over_after_a_quiet_minute():
    now = [0.0]
    g = LoopGuard("x", {}, logging.getLogger("t"), base=0.1, cap=2.0, clock=lambda: now[0],
                  rng=lambda: 1.0)  # fmt: skip
    waits = [g.failed(RuntimeError("same")) for _ in range(10)]
    assert waits[:3] == [0.1, 0.2, 0.4] and max(waits) == 2.0
    now[0] = 61.0
    assert g.failed(RuntimeError("same")) == 0.1
    assert g.stats["loop_errors"] == 11
