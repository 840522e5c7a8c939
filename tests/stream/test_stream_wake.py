"""A stream consumer waiting in next_batch is woken by a change stream where the server
has them, by its own stream object's writes, and polls otherwise; its watcher stops
with the consumer, or once it is fenced. (What the watcher does on failures and
without change streams, for both kinds of consumer: tests/queues/test_wake.py. How
fast it wakes is measured by ``bucketq bench stream-wake``, not asserted here.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bucketq.errors import Fenced
from bucketq.stream import AsyncStreamQueue, StreamQueue, core
from waiting import eventually, eventually_async

WORKER = str(Path(__file__).with_name("stream_worker.py"))
#: Polling alone would take long to notice a bucket: what wakes the consumer is the point.
SLOW_POLL = {"poll_interval": 600.0}


def push_from_another_process(uri: str, db_name: str) -> None:
    out = subprocess.run(
        [sys.executable, WORKER, "push", uri, db_name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == "pushed", out.stderr[-2000:]


def waiting_read(c, timeout: float = 300.0):
    """``c.next_batch(timeout)`` in a thread: the future of its result."""
    pool = ThreadPoolExecutor(1)
    fut = pool.submit(c.next_batch, timeout)
    pool.shutdown(wait=False)
    return fut


def pushed_while_waiting(c, uri: str, db_name: str, ready, what: str):
    """The batch ``c.next_batch`` returns when, as it waits and once ``ready()``, another
    process pushes a bucket to ``db_name`` at ``uri``."""
    fut = waiting_read(c)
    eventually(ready, what=what)
    push_from_another_process(uri, db_name)
    return fut.result(timeout=60)


def test_a_waiting_consumer_gets_a_bucket_pushed_by_another_process(
    db, mongo_uri, db_name, change_streams_here
):
    q = StreamQueue(db, "s", **SLOW_POLL)
    c = q.consumer()
    b = pushed_while_waiting(c, mongo_uri, db_name, lambda: c._watch.live,
                             "the watcher's change stream to open")  # fmt: skip
    assert b.seq == 1 and list(b.items[0]) == ["pid"]
    st_ = q.stats()
    assert st_["change_stream_events"] >= 1  # the change stream woke it, not a poll
    assert st_["change_stream_fallbacks"] == 0 and st_["loop_errors"] == 0
    c.ack(1)
    c.close()
    eventually(lambda: not c._watch.active, what="the watcher to end after close()")
    assert not c._watch.running


def test_its_own_producer_wakes_it_without_change_streams(db):
    q = StreamQueue(db, "s", change_streams=False, **SLOW_POLL)
    c = q.consumer()
    assert c._watch is None  # change_streams=False: no watcher at all
    fut = waiting_read(c)
    eventually(lambda: c.waiting, what="the consumer to wait")
    q.push({"own": True}, durable=True)
    b = fut.result(timeout=60)
    assert b.items == [{"own": True}]
    assert q.stats()["change_stream_events"] == 0


async def test_async_consumer_is_woken_by_another_process_and_stops_on_close(
    adb, mongo_uri, db_name, change_streams_here
):
    q = AsyncStreamQueue(adb, "s", **SLOW_POLL)
    c = await q.consumer()
    task = asyncio.ensure_future(c.next_batch(timeout=300))
    await eventually_async(lambda: c._watch.live, what="the watcher's change stream to open")
    await asyncio.to_thread(push_from_another_process, mongo_uri, db_name)
    b = await asyncio.wait_for(task, 60)
    assert b.seq == 1
    assert q.stats()["change_stream_events"] >= 1
    await c.ack(1)
    await c.close()
    await eventually_async(lambda: not c._watch.active, what="the watcher to end after close()")
    await q.close()


def test_change_streams_off_polls_across_processes(db, mongo_uri, db_name):
    q = StreamQueue(db, "s", change_streams=False, poll_interval=0.2)
    c = q.consumer()
    fut = waiting_read(c)
    push_from_another_process(mongo_uri, db_name)
    assert fut.result(timeout=60).seq == 1
    assert c._watch is None and q.stats()["change_stream_events"] == 0


def test_a_fenced_consumer_stops_its_watcher(db, change_streams_here):
    q = StreamQueue(db, "s", **SLOW_POLL)
    old = q.consumer()
    assert old.next_batch(timeout=0.2) is None  # it waited: its watcher started
    eventually(lambda: old._watch.active, what="the watcher to start")
    q.consumer()
    with pytest.raises(Fenced):
        old.next_batch(timeout=0.2)
    eventually(lambda: not old._watch.active, what="the fenced consumer's watcher to end")


@given(
    idle=st.integers(1, 100),
    wait=st.floats(0.001, 1000),
    poll=st.floats(0.001, 1000),
)
def test_an_idle_nap_grows_and_is_bounded_by_the_poll_interval_and_the_wait(idle, wait, poll):
    nap = core.idle_nap(idle, wait, poll)
    assert 0 < nap <= min(wait, poll)
    assert nap <= core.idle_nap(idle + 1, wait, poll)


def test_the_stream_wake_benchmark_reports_each_mode(mongo_uri, change_streams_here, tmp_path):
    """``bucketq bench stream-wake`` end to end, small: every mode reads every bucket."""
    out = tmp_path / "wake.json"
    r = subprocess.run(
        [sys.executable, "-m", "bucketq", "bench", "stream-wake", "--n", "5", "--gap-min",
         "0.01", "--gap-max", "0.02", "--mongodb-uri", mongo_uri, "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    modes = json.loads(out.read_text())["modes"]
    assert list(modes) == ["change-stream", "polling", "same-process"]
    assert all(m["n"] == 5 and m["from_receipt"]["max_ms"] >= m["from_receipt"]["p50_ms"]
               for m in modes.values())  # fmt: skip
    assert modes["change-stream"]["change_stream_events"] >= 1
    assert modes["polling"]["change_stream_events"] == 0
    assert "| change-stream |" in r.stdout
