"""One contract, every transport: what ``Transport``'s docstring promises."""

from __future__ import annotations

import asyncio
import time

import pytest

from bucketq.reservoir._policy import new_entry
from fast_settings import FAST_SHARD_QUEUE

from .conftest import TRANSPORTS

#: The bucketq transport on partitioned shard queues, too (``queue_options``).
PARTITIONED = {**FAST_SHARD_QUEUE, "partitions": 4}

pytestmark = pytest.mark.timeout(120)


def entries(n: int, project: str = "p1", start: int = 0) -> list[dict]:
    return [
        new_entry("log", project, {"project_id": project, "message": f"m{start + i}"})
        for i in range(n)
    ]


def msgs(deliveries) -> list[str]:
    return [d.entry["record"]["message"] for d in deliveries]


@pytest.fixture(params=[*TRANSPORTS, "bucketq-partitioned"])
async def transport(request, backends):
    if request.param == "bucketq-partitioned":
        t = backends.transport("bucketq", queue_options=PARTITIONED)
    else:
        t = backends.transport(request.param)
    await t.start(2)
    yield t
    await t.stop()


async def put(t, shard: int, items: list[dict]) -> asyncio.Task | None:
    """Enqueue; a passthrough enqueue returns only when settled, so run it as a task."""
    if t.name == "passthrough":
        task = asyncio.ensure_future(t.enqueue_many(shard, items))
        await asyncio.sleep(0)
        return task
    await t.enqueue_many(shard, items)
    return None


async def collect(t, shard: int, n: int, max_batch: int = 100, rounds: int = 40) -> list:
    out: list = []
    for _ in range(rounds):
        out += await t.dequeue(shard, max_batch, 0.3)
        if len(out) >= n:
            break
    return out


async def test_enqueue_dequeue_ack_in_order_and_pending_is_exact(transport):
    t = transport
    task = await put(t, 0, entries(5))
    got = await collect(t, 0, 5)
    assert sorted(msgs(got)) == [f"m{i}" for i in range(5)]
    assert all(d.entry["attempts"] == 0 and d.entry["kind"] == "log" for d in got)
    assert (await t.pending())[0] == 5  # delivered but not settled still counts
    assert (await t.pending())[1] == 0
    await t.ack(0, got)
    if task:
        assert await task == [None] * 5
    assert (await t.pending())[0] == 0  # acked entries are not pending (LogTide counted them)
    assert await t.dequeue(0, 10, 0.2) == []


async def test_dequeue_respects_max_batch_and_returns_empty_after_max_wait(transport):
    t = transport
    started = time.monotonic()
    assert await t.dequeue(1, 10, 0.2) == []
    assert time.monotonic() - started >= 0.15
    task = await put(t, 1, entries(7))
    first = await collect(t, 1, 3, max_batch=3, rounds=20)
    assert len(first) == 3
    rest = await collect(t, 1, 4, max_batch=10)
    assert sorted(msgs(first + rest)) == sorted(f"m{i}" for i in range(7))
    await t.ack(1, first + rest)
    if task:
        await task


async def test_requeue_redelivers_the_updated_entry_after_its_delay(transport):
    t = transport
    task = await put(t, 0, entries(2))
    got = await collect(t, 0, 2)
    for d in got:
        d.entry["attempts"] = 1
        d.entry["error"] = "storage said no"
    await t.requeue(0, got, 0.3)
    assert (await t.pending())[0] == 2
    early = await t.dequeue(0, 10, 0.0)
    assert early == []  # not before its delay
    again = await collect(t, 0, 2)
    assert sorted(msgs(again)) == ["m0", "m1"]
    assert {d.entry["attempts"] for d in again} == {1}
    assert {d.entry["error"] for d in again} == {"storage said no"}
    await t.ack(0, again)
    if task:
        await task
    assert (await t.pending())[0] == 0


@pytest.mark.parametrize("name", ["memory", "redis", "bucketq"])
async def test_a_dispatch_delay_holds_entries_at_once_and_delivers_them_when_due(backends, name):
    """Pending (held, durable where the transport is) as soon as the enqueue returns;
    delivered after entries enqueued later without a delay, in their own order."""
    t = backends.transport(name)
    await t.start(1)
    try:
        await t.enqueue_many(0, entries(3), 1.0)
        assert (await t.pending())[0] == 3
        await t.enqueue_many(0, entries(1, start=3))
        got: list = []
        while len(got) < 4:
            got += await t.dequeue(0, 10, 0.3)
        assert msgs(got) == ["m3", "m0", "m1", "m2"]
        await t.ack(0, got)
        assert (await t.pending())[0] == 0
    finally:
        await t.stop()


async def test_memory_expedite_ends_the_dequeues_waiting_for_a_batch(backends):
    """Stopping (``expedite``): a dequeue waiting to fill its batch returns what it has
    and an idle one returns empty, instead of each waiting out its max_wait (a buffer's
    stop waited a batch age for every idle consumer); later dequeues wait as ever."""
    t = backends.transport("memory")
    await t.start(2)
    try:
        await t.enqueue_many(1, entries(1))
        waiting = [asyncio.create_task(t.dequeue(s, 10, 600.0)) for s in (0, 1)]
        await asyncio.sleep(0)  # both wait now
        await t.expedite()
        idle, partial = await asyncio.wait_for(asyncio.gather(*waiting), 60)
        assert idle == [] and msgs(partial) == ["m0"]
        await t.enqueue_many(0, entries(1, start=1), 0.2)  # a dispatch delay, after expedite
        got: list = []
        while not got:
            got = await t.dequeue(0, 10, 0.3)
        assert msgs(got) == ["m1"]
    finally:
        await t.stop()


async def test_dead_letter_inspect_replay_purge(transport):
    t = transport
    task = await put(t, 1, entries(3))
    got = await collect(t, 1, 3)
    poisoned = [d for d in got if d.entry["record"]["message"] == "m1"]
    fine = [d for d in got if d not in poisoned]
    poisoned[0].entry["attempts"] = 3
    poisoned[0].entry["error"] = "bad field"
    await t.dead_letter(1, poisoned)
    await t.ack(1, fine)
    if task:
        assert sorted(await task, key=str) == [None, None, "bad field"]
    assert (await t.pending())[1] == 0
    assert await t.dlq_size() == 1
    (dead,) = await t.dlq_inspect(10)
    assert dead["record"]["message"] == "m1"
    assert dead["reason"] == "bad field" and dead["shard"] == 1 and dead["attempts"] == 3
    assert await t.dlq_size() == 1  # inspecting does not consume
    if t.name == "passthrough":
        return  # replay re-enqueues with nobody waiting; covered by memory
    assert await t.dlq_replay() == 1
    assert await t.dlq_size() == 0
    (back,) = await collect(t, 1, 1)
    assert back.entry["record"]["message"] == "m1" and back.entry["attempts"] == 0
    await t.dead_letter(1, [back], "again")
    assert await t.dlq_size() == 1
    assert await t.dlq_purge() == 1
    assert await t.dlq_size() == 0


async def test_shards_are_independent(transport):
    t = transport
    t0 = await put(t, 0, entries(2, start=0))
    t1 = await put(t, 1, entries(2, start=10))
    a = await collect(t, 0, 2)
    b = await collect(t, 1, 2)
    assert sorted(msgs(a)) == ["m0", "m1"] and sorted(msgs(b)) == ["m10", "m11"]
    await t.ack(0, a)
    await t.ack(1, b)
    for task in (t0, t1):
        if task:
            await task


@pytest.mark.parametrize("name", ["redis", "bucketq", "bucketq-partitioned"])
async def test_durable_unsettled_deliveries_come_back_to_a_new_consumer(backends, name):
    """A consumer that took entries and vanished (no ack): a new transport object (a new
    process, as far as the backend can tell) gets them again (on partitioned shard
    queues, the new one starts its claims at another partition)."""
    quick = {**FAST_SHARD_QUEUE, "lease": 1.5}  # the new consumer waits out the vanished one's
    opts: dict = (
        {"claim_idle": 0.5}
        if name == "redis"
        else {"queue_options": {**quick, "partitions": 4}}
        if name == "bucketq-partitioned"
        else {"queue_options": quick}
    )
    name = "bucketq" if name == "bucketq-partitioned" else name
    first = backends.transport(name, **opts)
    await first.start(1)
    await first.enqueue_many(0, entries(4))
    taken = await collect(first, 0, 4)
    assert len(taken) == 4
    if name == "bucketq":
        # Simulate a dead process: stop renewing without releasing.
        c = first.queues[0]._consumer
        for w in (c.flusher, c.fetcher, c.watcher and c.watcher.loop):
            if w is not None:
                w._task.cancel()
    second = backends.transport(name, **opts)
    await second.start(1)
    again = await collect(second, 0, 4, rounds=40)
    assert sorted(msgs(again)) == ["m0", "m1", "m2", "m3"]
    await second.ack(0, again)
    assert (await second.pending())[0] == 0
    await second.stop()
