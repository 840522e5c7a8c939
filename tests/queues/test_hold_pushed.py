"""``hold_pushed``: a queue object that consumes inserts the buckets it writes already
leased to itself and serves them without a claim; nobody else gets them while it holds
them, a close gives back what it did not hand out, a SIGKILLed holder's buckets come
back to another consumer when their lease runs out, and one that stopped consuming
holds nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

from bucketq import AsyncQueue
from fast_settings import FAST
from waiting import eventually_async


async def test_a_consuming_queue_serves_what_it_pushes_without_a_claim(adb):
    q = AsyncQueue(adb, "q", hold_pushed=True, **FAST)
    other = AsyncQueue(adb, "q", **FAST)
    try:
        first = asyncio.create_task(q.reserve(timeout=30))  # a consumer waits
        await eventually_async(lambda: q._consumer._waiters)
        await q.push_many([f"m{i}" for i in range(5)], durable=True)
        got = [await first] + [await q.reserve(timeout=10) for _ in range(4)]
        assert [m.payload for m in got if m is not None] == [f"m{i}" for i in range(5)]
        assert q.stats()["claims"] == 0
        assert q.stats()["held_on_write"] == 1
        # Leased to q in MongoDB: another consumer cannot take them.
        assert await other.reserve(timeout=0.5) is None
        assert await other.resv_size() == 5
        for m in got:
            await q.commit(m)
        await q.flush()
        assert await other.total_size() == 0
    finally:
        await q.close()
        await other.close()


async def test_close_gives_back_what_was_held_and_not_handed_out(adb):
    q = AsyncQueue(adb, "q", hold_pushed=True, **FAST)
    waiter = asyncio.create_task(q.reserve(timeout=30))
    await eventually_async(lambda: q._consumer._waiters)
    await q.push_many(["a", "b"], durable=True)
    assert q.stats()["held_on_write"] == 1
    first = await waiter
    assert first is not None
    await q.rollback(first, delay=0)
    await q.close()
    other = AsyncQueue(adb, "q", **FAST)
    try:
        got = [await other.reserve(timeout=10) for _ in range(2)]
        assert sorted(m.payload for m in got if m is not None) == ["a", "b"]
    finally:
        await other.close()


async def test_a_queue_that_does_not_consume_pushes_unleased(adb):
    # A 3 s lease: its third, the idle time after which pushes go unleased, is 1 s.
    producer = AsyncQueue(adb, "q", hold_pushed=True, **{**FAST, "lease": 3.0})
    consumer = AsyncQueue(adb, "q", **FAST)
    try:
        await producer.push("x", durable=True)
        assert producer.stats()["held_on_write"] == 0
        msg = await consumer.reserve(timeout=10)
        assert msg is not None and msg.payload == "x"
        # Reserved once, then only pushes: nothing waits in reserve() and nothing was served
        # for a third of its lease, so its buckets are not leased on write (what its fetcher
        # claims ahead stays bounded by prefetch, as for any consumer).
        assert await producer.reserve(timeout=0) is None
        await asyncio.sleep(1.1)
        await producer.push("y", durable=True)
        assert producer.stats()["held_on_write"] == 0
    finally:
        await producer.close()
        await consumer.close()


_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from pymongo import AsyncMongoClient
    from bucketq import AsyncQueue

    async def main(uri, name):
        q = AsyncQueue(AsyncMongoClient(uri)[name], "q", hold_pushed=True, lease=2.0,
                       state_flush_period=0.2, poll_interval=0.2)
        waiter = asyncio.create_task(q.reserve(timeout=30))
        while not q._consumer._waiters:
            await asyncio.sleep(0.01)
        await q.push_many(["k1", "k2", "k3"], durable=True)
        assert q.stats()["held_on_write"] == 1
        await q.rollback(await waiter, delay=0)
        print("held", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_a_killed_holder_s_buckets_come_back_when_the_lease_runs_out(adb, mongo_uri):
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, mongo_uri, adb.name],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        other = AsyncQueue(adb, "q", **FAST)
        try:
            # Held by the live child: not deliverable here.
            assert await other.reserve(timeout=0.3) is None
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            got = [await other.reserve(timeout=30) for _ in range(3)]
            assert sorted(m.payload for m in got if m is not None) == ["k1", "k2", "k3"]
            assert other.stats()["takeovers"] == 1
        finally:
            await other.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
