"""The queue contract, run against bucket and per-element queues, sync and async."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest

from bucketq import ConfigurationError, PayloadNotEncodable, PayloadTooLarge, QueueClosed
from queue_kinds import resolve
from waiting import eventually_async


async def consume_all(q, expected, timeout=10.0):
    """Reserve and commit until ``expected`` items came (each may wait up to ``timeout``),
    then check that nothing more is ready, in memory or stored, without waiting on an
    empty queue."""
    out = []
    while len(out) < expected:
        m = await resolve(q.reserve(timeout=timeout))
        assert m is not None, f"only {len(out)} of {expected} items came"
        out.append(m)
        await resolve(q.commit(m))
    extra = await resolve(q.reserve(timeout=0))
    assert extra is None, f"more than {expected} items: {extra!r}"
    assert await resolve(q.size()) == 0, "ready items are left in the queue"
    return out


async def test_fifo_within_a_producer(flavour):
    q = flavour.open()
    for i in range(50):
        await resolve(q.push({"i": i}))
    await resolve(q.flush())
    got = [m.payload["i"] for m in await consume_all(q, 50)]
    assert got == list(range(50))


async def test_payload_types_and_headers_round_trip(flavour):
    q = flavour.open()
    values = [{"a": 1}, "text", 42, 1.5, None, [1, "x"], b"\x00\x01", True]
    for v in values:
        await resolve(q.push(v, headers={"kind": type(v).__name__}))
    await resolve(q.flush())
    got = await consume_all(q, len(values))
    assert [m.payload for m in got] == values
    assert [m.headers["kind"] for m in got] == [type(v).__name__ for v in values]
    assert all(m.tries == 0 for m in got)


async def test_delay_is_not_before(flavour):
    q = flavour.open()
    pushed = time.time()
    await resolve(q.push("later", delay=1.5))
    await resolve(q.push("now"))
    await resolve(q.flush())
    first = await resolve(q.reserve(timeout=1.0))
    assert first is not None and first.payload == "now"
    await resolve(q.commit(first))
    assert await resolve(q.reserve(timeout=0.2)) is None or time.time() - pushed >= 1.5
    m = await resolve(q.reserve(timeout=5))
    assert m is not None and m.payload == "later"
    assert time.time() - pushed >= 1.5
    assert m.mature >= datetime.fromtimestamp(pushed + 1.5, UTC) - timedelta(milliseconds=2)
    await resolve(q.commit(m))


async def test_mature_datetime_is_not_before(flavour):
    q = flavour.open()
    at = datetime.now(UTC) + timedelta(seconds=1.2)
    await resolve(q.push("x", mature=at))
    await resolve(q.flush())
    scheduled = await resolve(q.sched_size())
    if datetime.now(UTC) < at:  # counted before it matured (a loaded machine may be later)
        assert scheduled == 1
    m = await resolve(q.reserve(timeout=5))
    assert m is not None and datetime.now(UTC) >= at


async def test_commit_rollback_pop(flavour):
    q = flavour.open()
    for v in ("a", "b"):
        await resolve(q.push(v))
    await resolve(q.flush())
    m = await resolve(q.reserve(timeout=2))
    assert m.payload == "a" and m.tries == 0
    assert await resolve(q.rollback(m, delay=0)) is True
    seen = []
    for _ in range(2):
        n = await resolve(q.reserve(timeout=2))
        seen.append((n.payload, n.tries))
        await resolve(q.commit(n))
    assert sorted(seen) == [("a", 1), ("b", 0)]
    await resolve(q.push("c", durable=True))
    p = await resolve(q.pop(timeout=2))
    assert p.payload == "c"
    await resolve(q.flush())
    assert await resolve(q.total_size()) == 0


async def test_rollback_delay_holds_only_that_item(flavour):
    q = flavour.open()
    for i in range(5):
        await resolve(q.push(i))
    await resolve(q.flush())
    first = await resolve(q.reserve(timeout=10))
    assert first is not None and first.payload == 0
    # Held for longer than the test runs: the rest of its bucket comes without it.
    await resolve(q.rollback(first, delay=3600))
    rest = [await resolve(q.reserve(timeout=10)) for _ in range(4)]
    assert [m and m.payload for m in rest] == [1, 2, 3, 4]
    # A short delay: the item comes again once it passed, never before, its try counted.
    t0 = time.time()
    await resolve(q.rollback(rest[0], delay=1.5))
    for m in rest[1:]:
        await resolve(q.commit(m))
    again = await resolve(q.reserve(timeout=10))
    assert again is not None and again.payload == 1 and again.tries == 1
    assert time.time() - t0 >= 1.5
    await resolve(q.commit(again))
    assert await resolve(q.reserve(timeout=0)) is None  # the first is still held


async def test_default_rollback_delay_uses_reject_deltas(flavour):
    q = flavour.open(reject_delta_base=0.8, reject_delta_factor=0.4)
    await resolve(q.push("x", durable=True))
    m = await resolve(q.reserve(timeout=2))
    t0 = time.time()
    await resolve(q.rollback(m))  # 0.4 * 1 + 0.8 = 1.2 s
    # On a loaded machine this first wait can outlast the delay and take the item itself.
    early = await resolve(q.reserve(timeout=0.9))
    assert early is None or time.time() - t0 >= 1.2
    again = early or await resolve(q.reserve(timeout=5))
    assert again is not None and time.time() - t0 >= 1.2


async def test_dead_letter_after_max_tries(flavour):
    q = flavour.open(max_tries=2)
    await resolve(q.push({"poison": True}, headers={"origin": "test"}))
    await resolve(q.push({"ok": True}))
    await resolve(q.flush())
    committed = []
    for _ in range(10):
        m = await resolve(q.reserve(timeout=1.5))
        if m is None:
            break
        if m.payload.get("poison"):
            await resolve(q.rollback(m, delay=0))
        else:
            committed.append(m.payload)
            await resolve(q.commit(m))
    await resolve(q.flush())
    assert committed == [{"ok": True}]
    dlq = flavour.open(q.options.dead_letter_name("q"))
    dead = await consume_all(dlq, 1)
    assert [m.payload for m in dead] == [{"poison": True}]
    h = dead[0].headers
    assert h["origin"] == "test"
    assert h["x-source-queue"] == "q"
    assert h["x-tries"] == 2
    assert "max_tries=2" in h["x-reason"]
    assert isinstance(h["x-dead-at"], datetime)
    assert await resolve(q.total_size()) == 0


async def test_remove_an_unleased_item(flavour):
    q = flavour.open()
    receipts = [await resolve(q.push(i)) for i in range(3)]
    await resolve(q.flush())
    assert await resolve(q.remove(receipts[1].id)) is True
    assert await resolve(q.remove(receipts[1].id)) is False
    assert await resolve(q.total_size()) == 2
    assert [m.payload for m in await consume_all(q, 2)] == [0, 2]


async def test_sizes(flavour):
    q = flavour.open(mature_granularity=0.5)
    for i in range(5):
        await resolve(q.push(i))
    for i in range(3):
        await resolve(q.push(i, delay=30))
    await resolve(q.flush())
    assert await resolve(q.size()) == 5
    assert await resolve(q.sched_size()) == 3
    assert await resolve(q.total_size()) == 8
    assert await resolve(q.resv_size()) == 0
    nt = await resolve(q.next_t())
    assert nt is not None and nt <= datetime.now(UTC)
    m = await resolve(q.reserve(timeout=2))
    assert m is not None
    assert await resolve(q.resv_size()) >= 1
    s = q.stats()
    assert s["pushed"] == 8 and s["reserved"] == 1


async def test_pause_and_resume(flavour):
    q = flavour.open()
    await resolve(q.push("x", durable=True))
    q.pause()
    assert await resolve(q.reserve(timeout=0.4)) is None
    q.resume()
    m = await resolve(q.reserve(timeout=2))
    assert m is not None and m.payload == "x"


async def test_receipt_resolves_only_after_the_insert(flavour):
    q = flavour.open(bucket_max_wait=0.6)
    col = flavour.sync_db[q.name]
    r = await resolve(q.push("x"))
    if flavour.bucket:
        assert not r.done()
        assert col.count_documents({}) == 0
    assert await resolve(r.wait(5)) is True
    assert r.done()
    assert col.count_documents({}) == 1


async def test_durable_push_and_flush_store(flavour):
    q = flavour.open(bucket_max_wait=30)
    col = flavour.sync_db[q.name]
    await resolve(q.push("a", durable=True))
    assert col.count_documents({}) == 1
    await resolve(q.push("b"))
    await resolve(q.flush())
    assert await resolve(q.total_size()) == 2


async def test_close_is_idempotent_and_final(flavour):
    q = flavour.open()
    await resolve(q.push("x"))
    await resolve(q.close())
    await resolve(q.close())
    assert await resolve(q.total_size()) == 1  # close wrote the open bucket
    with pytest.raises(QueueClosed):
        await resolve(q.push("y"))


async def test_context_manager_flushes(flavour):
    q = flavour.open(bucket_max_wait=30)
    if flavour.is_async:
        async with q:
            await q.push("x")
    else:
        with q:
            q.push("x")
    assert flavour.sync_db[q.name].count_documents({}) == 1


async def test_bad_input_harms_nothing_else(flavour):
    q = flavour.open(bucket_max_bytes=64 * 1024, bucket_max_wait=30)
    await resolve(q.push("before"))
    with pytest.raises(PayloadNotEncodable, match="BSON"):
        await resolve(q.push(object()))
    with pytest.raises(PayloadTooLarge, match="bucket_max_bytes"):
        await resolve(q.push("x" * 70 * 1024))
    with pytest.raises(PayloadNotEncodable):
        await resolve(q.push_many(["fine", {1, 2}]))
    await resolve(q.push("after"))
    await resolve(q.flush())
    assert [m.payload for m in await consume_all(q, 2)] == ["before", "after"]


async def test_push_many(flavour):
    q = flavour.open()
    receipts = await resolve(q.push_many([{"i": i} for i in range(20)], durable=True))
    assert len(receipts) == 20 and all(r.done() for r in receipts)
    assert len({r.id for r in receipts}) == 20
    assert [m.payload["i"] for m in await consume_all(q, 20)] == list(range(20))


async def test_reserve_many_and_commit_many(flavour):
    q = flavour.open(bucket_max_size=16)
    await resolve(q.push_many([{"i": i} for i in range(50)], durable=True))
    got = []
    while len(got) < 50:
        batch = await resolve(q.reserve_many(20, timeout=5))
        assert 1 <= len(batch) <= 20
        got.extend(batch)
        assert await resolve(q.commit_many(batch)) == len(batch)
    assert [m.payload["i"] for m in got] == list(range(50))
    assert await resolve(q.reserve_many(20, timeout=0.3)) == []
    with pytest.raises(ConfigurationError, match="max_items"):
        await resolve(q.reserve_many(0))
    await resolve(q.close())  # writes the commits: gone for every consumer
    assert await resolve(flavour.open().reserve(timeout=0.5)) is None


async def test_blocked_reserve_wakes_on_local_push(flavour):
    # The next poll comes long after the reserve gave up: only the push can wake it.
    q = flavour.open(poll_interval=600.0)
    if flavour.is_async:
        waiter = asyncio.ensure_future(q.reserve(timeout=30))
    else:  # a sync reserve blocks its thread: wait in another one
        waiter = asyncio.ensure_future(asyncio.to_thread(q.reserve, 30))
    await eventually_async(lambda: q.stats()["waiting_reserves"] == 1, timeout=10,
                           what="the reserve to block")  # fmt: skip
    await resolve(q.push("wake"))
    m = await waiter
    assert m is not None and m.payload == "wake"
