"""Both kinds of consumer wake the same way (one watcher, ``bucketq/bucket/_async/wake.py``):
a bucket queue's fetcher while its claims find nothing, a stream consumer while
``next_batch`` waits. Each is woken by a change stream where the server has them and
polls otherwise (counted once in ``stats()["change_stream_fallbacks"]``); the watcher
survives failures (``change_stream_errors``, ``loop_errors``), closes its stream when
nobody waits, and stops with the consumer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import AutoReconnect, OperationFailure

from bucketq import AsyncQueue, Queue
from bucketq.bucket.writes import no_change_streams
from bucketq.stream import StreamQueue
from waiting import eventually, eventually_async

#: Polling alone would take long to notice an item: what wakes the consumer is the point.
SLOW_POLL = {"poll_interval": 600.0}
KINDS = ["queue", "stream"]


@dataclass
class Reader:
    """A consumer of either kind: ``read(timeout)`` waits for the next payloads (None at
    the timeout), ``watcher()`` is its watcher (None with change_streams=False)."""

    q: Any
    read: Callable[[float], list[Any] | None]
    watcher: Callable[[], Any]
    close: Callable[[], Any]

    def waiting(self, timeout: float = 300.0) -> Future:
        """``read(timeout)`` in a thread: the future of its result."""
        pool = ThreadPoolExecutor(1)
        fut = pool.submit(self.read, timeout)
        pool.shutdown(wait=False)
        return fut


def reader(kind: str, db: Any, **options: Any) -> Reader:
    if kind == "queue":
        q = Queue(db, "w", **options)

        def reserve(timeout: float) -> list[Any] | None:
            m = q.reserve(timeout=timeout)
            if m is None:
                return None
            q.commit(m)
            return [m.payload]

        return Reader(q, reserve, lambda: q._consumer.watcher, q.close)
    s = StreamQueue(db, "w", **options)
    c = s.consumer()

    def next_batch(timeout: float) -> list[Any] | None:
        b = c.next_batch(timeout=timeout)
        return None if b is None else b.items

    return Reader(s, next_batch, lambda: c._watch, c.close)


def push_elsewhere(kind: str, db: Any, payload: Any) -> None:
    """Store ``payload`` through another queue object: nothing in the reader's is told."""
    other = (Queue if kind == "queue" else StreamQueue)(db, "w")
    try:
        other.push(payload, durable=True)
    finally:
        other.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_waiting_consumer_is_woken_by_another_objects_push_and_its_watcher_stops_on_close(
    kind, db, change_streams_here
):
    r = reader(kind, db, **SLOW_POLL)
    fut = r.waiting()
    eventually(lambda: r.watcher().live, what="the watcher's change stream to open")
    push_elsewhere(kind, db, "hello")
    assert fut.result(timeout=60) == ["hello"]
    st_ = r.q.stats()
    assert st_["change_stream_events"] >= 1  # the change stream woke it, not a poll
    assert st_["change_stream_fallbacks"] == 0 and st_["change_stream_errors"] == 0
    assert st_["loop_errors"] == 0
    r.close()
    eventually(lambda: not r.watcher().active, what="the watcher to end after close()")
    assert not r.watcher().running


async def test_an_async_queue_is_woken_by_a_change_stream_and_its_watcher_stops_on_close(
    adb, db, change_streams_here
):
    q = AsyncQueue(adb, "w", **SLOW_POLL)
    task = asyncio.ensure_future(q.reserve(timeout=300))
    watcher = q._consumer.watcher
    await eventually_async(lambda: watcher.live, what="the watcher's change stream to open")
    await asyncio.to_thread(push_elsewhere, "queue", db, "async")
    m = await asyncio.wait_for(task, 60)
    assert m is not None and m.payload == "async"
    assert q.stats()["change_stream_events"] >= 1
    await q.commit(m)
    await q.close()
    await eventually_async(lambda: not watcher.active, what="the watcher to end after close()")


@pytest.mark.parametrize("kind", KINDS)
def test_change_streams_off_there_is_no_watcher_and_the_consumer_polls(kind, db):
    r = reader(kind, db, change_streams=False, poll_interval=0.2)
    assert r.watcher() is None
    fut = r.waiting()
    push_elsewhere(kind, db, "polled")
    assert fut.result(timeout=60) == ["polled"]
    assert r.q.stats()["change_stream_events"] == 0
    r.close()


@pytest.fixture(scope="module")
def standalone_uri():
    from bucketq.embedded import EmbeddedServer

    try:
        server = EmbeddedServer(standalone=True).start()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no embedded server for a standalone topology ({exc})")
    try:
        yield server.uri
    finally:
        server.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_without_change_streams_the_consumer_polls_and_says_so(
    kind, standalone_uri, db_name, caplog
):
    client: MongoClient = MongoClient(standalone_uri)
    try:
        db = client[db_name]
        r = reader(kind, db, poll_interval=0.2)
        with caplog.at_level(logging.INFO, logger="bucketq"):
            fut = r.waiting()
            eventually(lambda: r.watcher().polling, what="the watcher to find no change streams")
            push_elsewhere(kind, db, "polled")
            assert fut.result(timeout=60) == ["polled"]
        st_ = r.q.stats()
        assert st_["change_stream_fallbacks"] == 1 and st_["change_stream_events"] == 0
        assert st_["loop_errors"] == 0
        assert any("no change streams here" in rec.getMessage() for rec in caplog.records)
        assert not r.watcher().running  # never started again: the next waits poll
        assert r.read(0.3) is None
        assert r.q.stats()["change_stream_fallbacks"] == 1
        r.close()
    finally:
        client.drop_database(db_name)
        client.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "failure,counted",
    [(RuntimeError("injected watcher failure"), "loop_errors"),
     (AutoReconnect("injected: the server went away"), "change_stream_errors")],
)  # fmt: skip
def test_the_watcher_survives_a_failure_and_wakes_the_consumer_after_it(
    kind, db, change_streams_here, caplog, failure, counted
):
    r = reader(kind, db, **SLOW_POLL)
    real = r.q._col.watch
    calls = [0]

    def watch(*a, **k):
        calls[0] += 1
        if calls[0] == 1:
            raise failure
        return real(*a, **k)

    r.q._col.watch = watch
    with caplog.at_level(logging.INFO):
        fut = r.waiting()
        eventually(lambda: r.watcher().live, what="the watcher's change stream to open again")
        push_elsewhere(kind, db, "after")
        assert fut.result(timeout=60) == ["after"]
    st_ = r.q.stats()
    assert st_[counted] == 1 and calls[0] >= 2
    assert st_["change_stream_events"] >= 1 and st_["change_stream_fallbacks"] == 0
    if counted == "loop_errors":  # logged once with its traceback
        assert [
            rec for rec in caplog.records if rec.exc_info and "injected" in str(rec.exc_info[1])
        ]
    r.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_watcher_nobody_waits_for_closes_its_stream_and_the_next_wait_opens_it_again(
    kind, db, change_streams_here, monkeypatch
):
    monkeypatch.setattr("bucketq.bucket.writes.WATCH_IDLE_CLOSE", 0.3)
    r = reader(kind, db, **SLOW_POLL)
    fut = r.waiting()
    eventually(lambda: r.watcher().live, what="the watcher's change stream to open")
    if kind == "queue":
        r.q.pause()  # its fetcher claims nothing: nobody waits for a wake-up
    else:
        push_elsewhere(kind, db, "read")
        assert fut.result(timeout=60) == ["read"]  # next_batch returned: nobody waits
    eventually(lambda: not r.watcher().running, what="the idle watcher to close and end")
    assert not r.watcher().live
    if kind == "queue":
        r.q.resume()
    else:
        fut = r.waiting()
    eventually(lambda: r.watcher().live, what="the next wait to open the stream again")
    push_elsewhere(kind, db, "again")
    assert fut.result(timeout=60) == ["again"]
    assert r.q.stats()["change_stream_errors"] == 0
    r.close()


def test_a_server_without_change_streams_is_told_apart_from_a_passing_failure():
    no_cs = OperationFailure("The $changeStream stage is only supported on replica sets", 40573)
    assert no_change_streams(no_cs)
    assert no_change_streams(OperationFailure("not authorized", 13))
    assert not no_change_streams(OperationFailure("not primary", 10107))
    assert not no_change_streams(AutoReconnect("connection reset"))
    assert not no_change_streams(RuntimeError("bug"))
