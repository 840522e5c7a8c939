"""A server that stops answering (SIGSTOP: connections stay open, nothing comes back).

pymongo waits forever for an answer by default; every bucketq call must still return
or raise within its budget while the server is frozen, and everything must go on by
itself once it answers again (SIGCONT). Each test runs its own server, so a frozen one
never hurts another test, and always resumes it in a ``finally``.

The bounds asserted are the contract (the configured budget plus a generous margin for
a loaded machine), not a speed threshold; the measured times are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from processes import frozen
from pymongo import AsyncMongoClient, MongoClient

from bucketq import OperationTimeout, PushFailed, Queue, ServerUnavailable, StreamQueue
from bucketq.bucket.deadline import MIN_ATTEMPT_TIMEOUT
from bucketq.embedded import EmbeddedServer
from fast_settings import FAST_FAULTS

from .conftest import stored_items

BUDGET = 2.0  # retry_budget
OP = 2.0  # op_timeout
#: Added to every bound: a loaded CI machine, a thread's wake-up, a backoff step.
MARGIN = 10.0
FREEZE = 6.0  # how long each test keeps the server frozen: past the budgets and the lease
OPTS = {**FAST_FAULTS, "retry_budget": BUDGET, "op_timeout": OP}
#: What a public call raises when the server did not answer: its deadline passed, or
#: (once pymongo's monitor has marked the server unknown) no server could be selected.
UNANSWERED = (OperationTimeout, ServerUnavailable)


@contextmanager
def frozen_for(storage: EmbeddedServer) -> Iterator[Callable[[], None]]:
    """Freeze the server; the yielded function waits out the rest of ``FREEZE``."""
    with frozen(storage.pid):
        t0 = time.monotonic()
        yield lambda: time.sleep(max(0.0, FREEZE - (time.monotonic() - t0)))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, what ``fn`` returned or raised)."""
    t0 = time.monotonic()
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the outcome is what the test looks at
        out = exc
    return time.monotonic() - t0, out


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def report(label: str, seconds: float, out: Any, bound: float) -> None:
    print(f"\nfrozen server: {label} gave up after {seconds:.2f} s "
          f"({type(out).__name__}; bound {bound:.1f} s)")  # fmt: skip
    assert seconds < bound, f"{label} took {seconds:.1f} s, past its bound of {bound:.1f} s"


def test_pushes_give_up_within_their_budget_and_land_once_resumed(storage):
    client: MongoClient = MongoClient(storage.uri)  # pymongo's defaults: no socket timeout
    try:
        q = Queue(client["bq"], "q", **OPTS)
        acked = set()
        for i in range(20):
            q.push({"i": i}, durable=True)
            acked.add(i)
        push_bound = BUDGET + OPTS["bucket_max_wait"] + MIN_ATTEMPT_TIMEOUT + MARGIN
        with frozen_for(storage) as rest:
            t, out = timed(lambda: q.push({"i": 100}, durable=True))
            report("push(durable=True)", t, out, push_bound)
            assert isinstance(out, PushFailed)
            receipt = q.push({"i": 101})
            t, out = timed(receipt.wait)
            report("receipt.wait()", t, out, push_bound)
            assert isinstance(out, PushFailed)
            t, out = timed(lambda: q.size())
            report("size()", t, out, OP + MARGIN)
            assert isinstance(out, UNANSWERED)
            t, out = timed(q.flush)
            report("flush()", t, out, push_bound + OP + MARGIN)
            health = q.health()
            assert not health["ok"] and health["unreachable_since"] is not None
            assert "timed out" in health["last_error"]
            assert q.stats()["push_failed"] == 2
            rest()
        for i in range(200, 210):
            q.push({"i": i}, durable=True)
            acked.add(i)
        assert q.health()["ok"] and q.health()["unreachable_since"] is None
        q.close()
        stored = stored_items(client["bq"]["q"])
        assert acked <= set(stored), f"acknowledged items missing: {acked - set(stored)}"
    finally:
        client.close()


def test_consumers_go_on_while_frozen_and_resume_by_themselves(storage):
    n = 200
    client: MongoClient = MongoClient(storage.uri)
    try:
        db = client["bq"]
        with Queue(db, "q", **{**OPTS, "bucket_max_size": 20}) as producer:
            producer.push_many([{"i": i} for i in range(n)], durable=True)
        consumed: Counter[int] = Counter()
        c = Queue(db, "q", **OPTS)
        other = Queue(db, "q", **OPTS)
        for _ in range(30):
            msg = c.reserve(timeout=10)
            assert msg is not None
            consumed[msg.payload["i"]] += 1
            c.commit(msg)
        held = c.reserve(timeout=10)
        assert held is not None
        consumed[held.payload["i"]] += 1
        assert other.reserve(timeout=10) is not None  # `other` holds a bucket too
        with frozen_for(storage) as rest:
            t, out = timed(lambda: c.reserve(timeout=1.0))
            report("reserve(timeout=1)", t, out, 1.0 + MARGIN)
            if out is not None:  # served from memory: the lease had time left
                consumed[out.payload["i"]] += 1
                c.commit(out)
            t, out = timed(lambda: c.commit(held, flush=True))
            flush_bound = 2 * min(OP, OPTS["lease"] / 2) + MARGIN
            report("commit(flush=True)", t, out, flush_bound)
            assert isinstance(out, UNANSWERED)
            t, out = timed(other.close)
            close_bound = OPTS["drain_timeout"] if "drain_timeout" in OPTS else 5.0
            close_bound += 4 * OP + MARGIN
            report("close() of a consumer holding a bucket", t, out, close_bound)
            wait_for(lambda: not c.health()["ok"], OP + MARGIN, "the consumer to see the outage")
            rest()
            flushes = c.stats()["state_flushes"]
        # Resumed: the consumer claims, serves and flushes again by itself, and the
        # buckets `other` could not release come back once their lease runs out.
        deadline = time.monotonic() + 120
        while set(consumed) != set(range(n)):
            assert time.monotonic() < deadline, f"missing {set(range(n)) - set(consumed)}"
            msg = c.reserve(timeout=1.0)
            if msg is not None:
                consumed[msg.payload["i"]] += 1
                c.commit(msg)
        c.close()
        assert c.health()["ok"]
        assert c.stats()["state_flushes"] > flushes
        left = wait_for(lambda: not stored_items(db["q"]) or None, 30, "an empty queue")
        assert left is True
    finally:
        client.close()


def test_stream_calls_are_bounded_while_frozen(storage):
    client: MongoClient = MongoClient(storage.uri)
    try:
        s = StreamQueue(client["bq"], "s", retry_budget=BUDGET, op_timeout=OP, bucket_max_wait=0.05)
        s.push({"i": 0}, durable=True)
        consumer = s.consumer()
        with frozen_for(storage) as rest:
            t, out = timed(lambda: s.push({"i": 1}, durable=True))
            report(
                "stream push(durable=True)", t, out, BUDGET + 0.05 + MIN_ATTEMPT_TIMEOUT + MARGIN
            )
            assert isinstance(out, PushFailed)
            t, out = timed(lambda: consumer.next_batch(timeout=1.0))
            report("stream next_batch(timeout=1)", t, out, 1.0 + MIN_ATTEMPT_TIMEOUT + MARGIN)
            assert out is None or isinstance(out, UNANSWERED)
            t, out = timed(s.position)
            report("stream position()", t, out, OP + MARGIN)
            assert isinstance(out, UNANSWERED)
            assert not s.health()["ok"]
            rest()
        s.push({"i": 2}, durable=True)
        seen = []
        while 2 not in seen:
            b = consumer.next_batch(timeout=30)
            assert b is not None
            seen.extend(item["i"] for item in b.items)
            consumer.ack(b.seq)
        assert 0 in seen
        s.close()
    finally:
        client.close()


def test_reservoir_start_and_ingest_are_bounded_while_frozen(storage):
    from bucketq.reservoir import BucketqTransport, BufferConfig, BufferedReservoir, MongoReservoir

    async def run() -> None:
        client: AsyncMongoClient = AsyncMongoClient(storage.uri)
        try:
            db = client["bq"]
            reservoir = MongoReservoir(db, op_timeout=OP)
            transport = BucketqTransport(
                db, prefix="r", queue_options={"retry_budget": BUDGET, "op_timeout": OP}
            )
            cfg = BufferConfig(enabled=True, shards=4, max_batch_age_ms=100, failure_threshold=1)
            buf = BufferedReservoir(reservoir, transport, cfg)

            async def atimed(coro: Any) -> tuple[float, Any]:
                t0 = time.monotonic()
                try:
                    out = await coro
                except Exception as exc:  # noqa: BLE001
                    out = exc
                return time.monotonic() - t0, out

            def recs(start: int, k: int) -> list[dict[str, Any]]:
                return [{"project_id": f"p{i % 7}", "service": "api", "level": "info",
                         "message": f"m-{i}"} for i in range(start, start + k)]  # fmt: skip

            with frozen(storage.pid):
                t0 = time.monotonic()
                t, out = await atimed(buf.start())
                report("reservoir start() (4 shards)", t, out, OP + MARGIN)
                assert out is buf
                t, out = await atimed(buf.ingest(recs(0, 20)))
                report("reservoir ingest() (buffer, then bypass)", t, out, BUDGET + 3 * OP + MARGIN)
                assert out["failed"] == 20 and out["ingested"] == 0
                t, out = await atimed(buf.ingest(recs(20, 20)))
                report("reservoir ingest() (breaker open)", t, out, 3 * OP + MARGIN)
                assert out["failed"] == 20
                await asyncio.sleep(max(0.0, FREEZE - (time.monotonic() - t0)))
            # Resumed: the breaker closes after its cooldown; ingests are stored again.
            accepted = 0
            start = 100
            deadline = time.monotonic() + 60
            while accepted < 50:
                assert time.monotonic() < deadline, "ingests never succeeded again"
                out = await buf.ingest(recs(start, 10))
                accepted += out["ingested"]
                start += 10
                await asyncio.sleep(0.1)
            stopped = await buf.stop(timeout=30)
            assert stopped["left"] == 0
            stored = {d["message"] for d in await reservoir.query("log", limit=10_000)}
            assert len(stored) >= accepted
            assert transport  # the shards' queues were created and used
        finally:
            await client.close()

    asyncio.run(run())


def test_a_dead_server_fails_pushes_after_the_budget_and_health_says_so(storage):
    """A durable push to a dead server fails once its budget is spent, not long after;
    reserve() returns None as on an empty queue, so health() must tell the outage."""
    client: MongoClient = MongoClient(storage.uri)
    try:
        q = Queue(client["bq"], "q", **OPTS)
        q.push({"i": 0}, durable=True)
        assert q.health()["ok"]
        storage.stop(keep_data=True)
        try:
            t, out = timed(lambda: q.push({"i": 1}, durable=True))
            report("push(durable=True) to a stopped server", t, out,
                   BUDGET + OPTS["bucket_max_wait"] + MIN_ATTEMPT_TIMEOUT + MARGIN)  # fmt: skip
            assert isinstance(out, PushFailed)
            assert t >= BUDGET - 0.1, "PushFailed before the retry budget was spent"
            assert q.reserve(timeout=0.5) is None  # as on an empty queue, but:
            health = wait_for(lambda: (h := q.health()) and not h["ok"] and h, OP + MARGIN,
                              "health() to report the outage")  # fmt: skip
            assert health["unreachable_since"] <= time.time()
            assert health["last_error"]
        finally:
            storage.start()
        q.push({"i": 2}, durable=True)
        assert q.health()["ok"] and q.health()["unreachable_since"] is None
        assert wait_for(lambda: q.reserve(timeout=1), 30, "the first item") is not None
        q.close()
    finally:
        client.close()
