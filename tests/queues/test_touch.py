"""``touch(msg)``: an item handed out and still being worked on keeps its place; the
queue's stall rule (``lease + reject_timeout_grace``) counts from the last touch."""

from __future__ import annotations

import time

import pytest

from bucketq import AsyncQueue, ConfigurationError, Queue
from fast_settings import FAST
from waiting import eventually


def test_touch_is_true_while_the_item_is_in_hand(db):
    q = Queue(db, "q", **FAST)
    q.push({"i": 0}, durable=True)
    m = q.reserve(timeout=10)
    assert q.touch(m)
    assert q.rollback(m, delay=0)
    assert not q.touch(m)  # its delivery ended
    m2 = q.reserve(timeout=10)
    assert q.commit(m2) and not q.touch(m2)
    other = Queue(db, "q", **FAST)
    with pytest.raises(ConfigurationError, match="delivered by another queue object"):
        other.touch(m2)
    other.close()
    q.close()


def test_an_item_touched_in_time_is_not_rolled_back_by_the_stall_rule(db):
    # A stall limit of 1.8 s: a thread touching every 0.1 s misses it only if frozen for it.
    q = Queue(db, "q", **{**FAST, "lease": 1.2, "reject_timeout_grace": 0.6})
    q.push({"i": 0}, durable=True)
    q.push({"i": 1}, durable=True)
    kept, left = q.reserve(timeout=10), q.reserve(timeout=10)
    until = time.monotonic() + 3.6  # twice the stall limit
    while time.monotonic() < until:
        assert q.touch(kept)
        time.sleep(0.1)
    # The untouched one was rolled back and is served again; the touched one was not.
    again = eventually(lambda: q.reserve(timeout=0), what="the untouched item again")
    assert again.payload["i"] == left.payload["i"] and again.tries == 1
    assert q.commit(kept) and q.commit(again)
    q.close()


async def test_async_touch(adb):
    q = AsyncQueue(adb, "q", **FAST)
    await q.push({"i": 0}, durable=True)
    m = await q.reserve(timeout=10)
    assert q.touch(m)
    assert await q.commit(m)
    assert not q.touch(m)
    await q.close()
