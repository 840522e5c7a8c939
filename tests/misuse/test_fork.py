"""os.fork() with an open queue: the child gets a clear error at once (never a hang,
never an item the parent also delivers), and the parent goes on as if nothing happened."""

from __future__ import annotations

import json
import os
import signal
import time
import warnings

import pytest

from bucketq import ElementQueue, Queue, QueueClosed
from bucketq.stream import StreamQueue
from fast_settings import FAST

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child(q) -> dict[str, str]:
    """Every call the child might make, with what it answered."""
    out: dict[str, str] = {}
    calls = {
        "push": lambda: q.push("from the child"),
        "push_many": lambda: q.push_many(["a", "b"]),
        "flush": q.flush,
        "reserve": lambda: q.reserve(timeout=1),
    }
    if isinstance(q, StreamQueue):
        calls = {k: calls[k] for k in ("push", "push_many", "flush")}
        calls["consumer"] = q.consumer
    for name, fn in calls.items():
        try:
            got = fn()
            out[name] = f"returned {got!r}"
        except QueueClosed as exc:
            out[name] = "QueueClosed: " + str(exc)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            out[name] = f"{type(exc).__name__}: {exc}"
    out["close"] = json.dumps(q.close())  # waiting on the parent's writer would hang
    return out


def _fork_and_ask(q) -> dict[str, str]:
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "this process is multi-threaded": that is the point
        pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's atexit
        code = 0
        try:
            os.close(r)
            os.write(w, json.dumps(_in_child(q)).encode())
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung using the parent's queue")
        time.sleep(0.05)
    with os.fdopen(r) as f:
        report = json.loads(f.read() or "{}")
    assert os.waitstatus_to_exitcode(status) == 0
    return report


@pytest.mark.parametrize("cls", [Queue, ElementQueue])
def test_a_forked_child_is_told_to_open_its_own_queue(db, cls):
    q = cls(db, "q", **FAST)
    for i in range(10):
        q.push(i)
    q.flush()
    first = q.reserve(timeout=10)  # the fetcher runs and holds read-ahead items
    assert first is not None
    q.push("buffered")  # not yet written when the child is forked
    report = _fork_and_ask(q)
    for call in ("push", "push_many", "flush", "reserve"):
        assert report[call].startswith("QueueClosed"), (call, report[call])
        assert "os.fork()" in report[call] and "new queue in the child" in report[call]
    # close() returned (a child that waits on the parent's writer hangs: _fork_and_ask
    # fails it) and touched nothing: the parent writes, serves and releases.
    closed = json.loads(report["close"])
    assert closed and not any(closed.values()), closed
    # The parent goes on: every item exactly once, nothing written by the child.
    assert q.commit(first)
    got = [first.payload]
    while len(got) < 11 and (m := q.reserve(timeout=10)) is not None:
        got.append(m.payload)
        assert q.commit(m)
    assert q.reserve(timeout=0) is None
    q.close()
    assert sorted(map(str, got)) == sorted([str(i) for i in range(10)] + ["buffered"])
    assert db["q"].count_documents({}) == 0


def test_a_forked_child_cannot_use_the_parents_stream(db):
    s = StreamQueue(db, "s", bucket_max_wait=0.05)
    s.push("one", durable=True)
    s.push("buffered")
    report = _fork_and_ask(s)
    for call in ("push", "push_many", "flush", "consumer"):
        assert report[call].startswith("QueueClosed") and "os.fork()" in report[call], report
    s.flush()
    c = s.consumer()
    got = []
    while len(got) < 2 and (b := c.next_batch(timeout=10)) is not None:
        got += b.items
        c.ack(b.seq)
    assert c.next_batch(timeout=0) is None
    s.close()
    assert got == ["one", "buffered"]
