"""``Queue.consume`` and ``AsyncQueue.consume`` in the test's process, on a real server:
what a user checks in MongoDB and in what the handler saw."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from bucketq import AsyncQueue, Queue
from bucketq.bucket.times import from_datetime
from bucketq.worker import TimeLimitExceeded, Worker
from fast_settings import FAST
from waiting import eventually

from .handlers import handle, handle_async, read


def fill(q: Queue, n: int, **fields) -> None:
    q.push_many([{"i": i, **fields} for i in range(n)])
    q.flush()


def stored(db, name: str = "jobs") -> list[dict]:
    return list(db[name].find({}, {"items": 0}))


@pytest.mark.parametrize("handler", [handle, handle_async], ids=["sync handler", "async handler"])
def test_queue_consume_commits_every_item_once(db, events, handler):
    q = Queue(db, "jobs", **FAST)
    fill(q, 30)
    report = q.consume(handler, concurrency=3, max_items=30, signals=False)
    q.close()
    done = sorted(i for ev, i, _, _ in read(events) if ev == "done")
    assert done == list(range(30))
    assert report["committed"] == 30
    assert report["reason"] == "max_items (30) handled"
    assert stored(db) == []


@pytest.mark.parametrize("handler", [handle_async, handle], ids=["async handler", "sync handler"])
async def test_async_queue_consume_commits_every_item_once(adb, db, events, handler):
    q = AsyncQueue(adb, "jobs", **FAST)
    await q.push_many([{"i": i} for i in range(30)])
    await q.flush()
    report = await q.consume(handler, concurrency=3, max_items=30, signals=False)
    await q.close()
    assert sorted(i for ev, i, _, _ in read(events) if ev == "done") == list(range(30))
    assert report["committed"] == 30
    assert stored(db) == []


def test_failures_back_off_then_go_to_the_dead_letter_queue(db, events, caplog):
    q = Queue(db, "jobs", **FAST, max_tries=2, reject_delta_base=0.0, reject_delta_factor=0.0)
    q.push({"i": 0, "fail_until": 99, "secret": "s3cr3t-payload"})
    q.push({"i": 1})
    q.push({"i": 2, "fail_until": 1})
    q.flush()
    with caplog.at_level(logging.INFO, "bucketq.worker"):
        report = q.consume(handle, max_items=5, signals=False)
    q.close()
    ev = read(events)
    assert sorted((i, t) for e, i, t, _ in ev if e == "done") == [(1, 0), (2, 1)]
    # item 0's second failure is its last: counted as the dead letter it became
    assert (report["committed"], report["failed"], report["dead_letter"]) == (2, 2, 1)
    assert caplog.records[-1].getMessage() == (
        "queue jobs: worker stopped (max_items (5) handled): committed 2, failed 2, dead_letter 1"
    )
    dead = Queue(db, "jobs.dlq", **FAST)
    m = dead.reserve(timeout=10)
    assert m is not None and m.payload["i"] == 0
    assert m.headers["x-tries"] == 2
    assert m.headers["x-reason"] == "ValueError: item 0 fails on try 1"
    dead.commit(m)
    dead.close()
    failures = [
        r for r in caplog.records if getattr(r, "outcome", None) in ("failed", "dead_letter")
    ]
    # Item 0 fails, item 2 fails, item 0 fails again: its second rollback is its last.
    assert [(r.tries, r.exception, r.outcome, r.levelno) for r in failures] == [
        (1, "ValueError", "failed", logging.WARNING),
        (1, "ValueError", "failed", logging.WARNING),
        (2, "ValueError", "dead_letter", logging.ERROR),
    ]
    assert failures[0].items == failures[2].items != failures[1].items
    assert failures[0].retry_in == 0.0 and failures[2].retry_in is None
    assert not any("s3cr3t" in r.getMessage() for r in caplog.records)
    assert all(r.exc_info is None for r in failures)  # no message, no traceback by default


def test_a_failed_item_waits_for_its_delay(db, events):
    q = Queue(db, "jobs", **FAST, bucket_max_size=10)
    q.push({"i": 0, "retry": 300})  # Retry(300)
    q.push({"i": 1, "fail_until": 1})  # ValueError: retry_for says 600
    q.push({"i": 2, "retry": None})  # Retry(): the queue's back-off, 10 * 1 + 10 s
    q.flush()
    before = time.time()
    report = q.consume(handle, max_items=3, retry_for={ValueError: 600}, signals=False)
    q.close()
    assert (report["retried"], report["failed"]) == (2, 1)
    (doc,) = stored(db)
    assert doc["tries"] == {"0": 1, "1": 1, "2": 1}
    waits = {k: from_datetime(t) - before for k, t in doc["next"].items()}
    # Not before its delay (the contract); well before twice it (a sanity bound).
    assert 300 <= waits["0"] < 330
    assert 600 <= waits["1"] < 630
    assert 20 <= waits["2"] < 50
    assert doc["lease"] is None


async def test_an_async_handler_past_its_time_limit_is_cancelled_and_tried_again(adb, db, events):
    q = AsyncQueue(adb, "jobs", **FAST)
    await q.push({"i": 0, "block": 1}, durable=True)  # blocks on its first try only
    report = await q.consume(handle_async, time_limit=0.5, max_items=2, signals=False,
                             retry_for={TimeLimitExceeded: 0})  # fmt: skip
    await q.close()
    assert [(e, t) for e, _, t, _ in read(events)] == [("start", 0), ("start", 1), ("done", 1)]
    assert (report["timed_out"], report["committed"], report["late"]) == (1, 1, 0)
    assert stored(db) == []


def test_a_sync_handler_past_its_time_limit_is_released_and_its_result_ignored(db, caplog):
    q = Queue(db, "jobs", **FAST)
    q.push({"i": 0}, durable=True)
    stuck = threading.Event()
    seen = []

    def h(m):
        seen.append(m.tries)
        if m.tries == 0:
            stuck.wait(30)  # a thread cannot be stopped: it runs on past its limit
        else:
            stuck.set()  # the item came back to the other handler meanwhile

    with caplog.at_level(logging.WARNING, "bucketq.worker"):
        report = q.consume(h, concurrency=2, time_limit=0.5, max_items=2, signals=False,
                           retry_for={TimeLimitExceeded: 0})  # fmt: skip
    q.close()
    assert seen == [0, 1]
    assert (report["timed_out"], report["committed"], report["late"]) == (1, 1, 1)
    assert any("finished after its time limit; its result is ignored" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert stored(db) == []


def test_a_handler_may_run_past_the_queues_stall_limit(db, events):
    """The queue rolls back an item handed out and untouched for lease +
    reject_timeout_grace; the worker touches its items while their handler runs."""
    q = Queue(db, "jobs", **{**FAST, "lease": 0.6, "reject_timeout_grace": 0.3})
    q.push({"i": 0, "sleep": 2.0}, durable=True)  # twice the stall limit
    report = q.consume(handle, max_items=1, signals=False)
    q.close()
    assert [(e, t) for e, _, t, _ in read(events)] == [("start", 0), ("done", 0)]
    assert (report["committed"], report["lost"]) == (1, 0)
    assert stored(db) == []


def test_sync_handlers_run_at_once(db):
    q = Queue(db, "jobs", **FAST)
    fill(q, 4)
    together = threading.Barrier(4, timeout=20)  # broken unless all four are in at once
    report = q.consume(lambda m: together.wait(), concurrency=4, max_items=4, signals=False)
    q.close()
    assert (report["committed"], report["failed"]) == (4, 0)


async def test_async_handlers_run_at_once(adb, db):
    q = AsyncQueue(adb, "jobs", **FAST)
    await q.push_many([{"i": i} for i in range(4)])
    await q.flush()
    together = asyncio.Barrier(4)

    async def h(m):
        async with asyncio.timeout(20):
            await together.wait()

    report = await q.consume(h, concurrency=4, max_items=4, signals=False)
    await q.close()
    assert (report["committed"], report["failed"]) == (4, 0)


def test_a_batch_handler_gets_lists_and_they_are_committed_together(db):
    q = Queue(db, "jobs", **FAST)
    fill(q, 25)
    sizes, seen = [], []

    def h(msgs):
        sizes.append(len(msgs))
        seen.extend(m.payload["i"] for m in msgs)

    report = q.consume(h, batch=10, max_items=25, signals=False)
    q.close()
    assert sorted(seen) == list(range(25)) and max(sizes) <= 10
    assert report["committed"] == 25
    assert stored(db) == []


def test_stop_lets_the_items_in_hand_finish_and_releases_the_rest(db):
    q = Queue(db, "jobs", **FAST, bucket_max_size=100)
    fill(q, 20)
    done = []

    def h(m):
        if not done:
            w.stop()
            time.sleep(0.3)  # in hand while the worker stops: it finishes
        done.append(m.payload["i"])

    w = Worker(q, h, concurrency=2, signals=False)
    report = w.run()
    q.close()
    assert report["reason"] == "stop()" and report["committed"] == len(done) >= 1
    (doc,) = stored(db)
    assert doc["live"] == 20 - len(done)
    assert doc["lease"] is None  # released at once
    assert doc.get("tries", {}) == {}  # no try counted for what was released


def test_a_stopping_worker_gives_back_at_once_the_buckets_it_read_ahead(db):
    """While the item in hand finishes (up to drain_timeout), the buckets the worker claimed
    ahead and handed nothing of are released at once, with no try counted: another worker
    takes them meanwhile instead of waiting for the drain."""
    q = Queue(db, "jobs", **{**FAST, "drain_timeout": 60}, bucket_max_size=5)
    fill(q, 20)  # four buckets
    in_hand, go_on = threading.Event(), threading.Event()

    def h(m):
        w.stop()
        in_hand.set()
        go_on.wait(30)

    w = Worker(q, h, concurrency=1, signals=False)
    runner = threading.Thread(target=w.run)
    runner.start()
    other = Queue(db, "jobs", **FAST)
    try:
        assert in_hand.wait(30)
        # the other worker gets every item but the first bucket's while the first still runs
        got = []
        eventually(lambda: got.extend(other.reserve_many(20, timeout=0.2)) or len(got) == 15,
                   what="the read-ahead buckets, released")  # fmt: skip
        assert runner.is_alive() and len({m.payload["i"] for m in got}) == 15
        assert other.reserve_many(20, timeout=0) == []  # the first bucket stays with the worker
        assert other.commit_many(got) == 15
    finally:
        go_on.set()
        runner.join(30)
        other.close()
        q.close()
    assert not runner.is_alive()
    assert [d.get("tries", {}) for d in stored(db)] == [{}], "no try counted for a release"


def test_the_start_and_stop_lines_say_what_it_reads_and_what_it_did(db, caplog):
    q = Queue(db, "jobs", **FAST)
    w = Worker(q, handle, concurrency=2, signals=False)
    w.stop()  # before it starts: it stops at once, having handled nothing
    with caplog.at_level(logging.INFO, "bucketq.worker"):
        w.run()
    q.close()
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == f"queue jobs: worker started on database {db.name}: handle, 2 sync handlers"
    assert said[-1] == "queue jobs: worker stopped (stop()): nothing handled"


def test_stop_now_releases_what_is_held_without_waiting(db, caplog):
    q = Queue(db, "jobs", **FAST, bucket_max_size=100)
    fill(q, 20)
    go_on = threading.Event()

    def h(m):
        w.stop(now=True)
        go_on.wait(30)

    w = Worker(q, h, signals=False)
    with caplog.at_level(logging.INFO, "bucketq.worker"):
        report = w.run()  # returns while the handler still runs
    assert "queue jobs: 1 delivery still in hand: released now" in caplog.text
    assert report["reason"] == "stop(now=True)" and report["committed"] == 0
    (doc,) = stored(db)
    assert doc["live"] == 20 and doc["lease"] is None and doc.get("tries", {}) == {}
    go_on.set()
    eventually(lambda: w.stats()["lost"] == 1, what="the handler's commit, refused")
    q.close()
