"""A real ``celery worker`` (prefork) on bucketq: tasks and results, countdowns, ETAs and
retries through the queue's mature time, and workers that die (SIGKILL) or are stopped
(SIGTERM) losing nothing."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import bucketq.celery  # noqa: F401 - this test process sends tasks; its workers use the .pth
from bucketq import Queue
from celery_broker.celery_app import runs
from waiting import eventually

#: Short leases: a killed worker's tasks come back within seconds.
FAST = {"lease": 2.0, "state_flush_period": 0.2, "poll_interval": 0.2}


def _events(out, event):
    return Counter(k for e, k, _, _ in runs(out) if e == event)


def _received(text):
    """The ids of the tasks a worker's log says it received, in order."""
    return re.findall(r"Task \w+\[([0-9a-f-]+)\] received", text)


def test_tasks_run_and_their_results_come_back(celery_env, db):
    celery_env.start_worker("w1", "-c", "2", **FAST).wait_ready()
    app = celery_env.app(**FAST)
    add = app.tasks["add"]
    results = [add.delay(i, i) for i in range(20)]
    assert [r.get(timeout=30) for r in results] == [2 * i for i in range(20)]
    assert _events(celery_env.out, "add") == Counter(f"{i}+{i}" for i in range(20))
    # Every acknowledgement was a commit: the queue empties (its buckets are deleted).
    eventually(lambda: db["celery"].count_documents({}) == 0, what="the queue to empty")


def test_countdown_eta_and_retry_countdowns_wait_in_mongodb(celery_env, db, mongo_client):
    celery_env.start_worker("w1", "-c", "2", **FAST).wait_ready()
    app = celery_env.app(**FAST)
    record, flaky = app.tasks["record"], app.tasks["flaky"]
    sent = time.time()
    later = record.apply_async(("countdown",), countdown=2)
    eta = datetime.now(UTC) + timedelta(seconds=2)
    at_eta = record.apply_async(("eta",), eta=eta)
    # Stored as not yet mature, not handed to a worker (which would hold them in memory).
    q = Queue(mongo_client[db.name], "celery")
    scheduled = q.sched_size()
    if time.time() < sent + 2:  # counted before either matured (a loaded machine may be later)
        assert scheduled == 2
    retried = flaky.delay("flaky", 2, 1)
    assert later.get(timeout=30) == "countdown" and at_eta.get(timeout=30) == "eta"
    assert retried.get(timeout=30) == "flaky"
    got = {k: t for e, k, t, _ in runs(celery_env.out) if e == "run"}
    assert got["countdown"] >= sent + 2 and got["eta"] >= eta.timestamp()
    tries = sorted((r, t) for e, k, t, r in runs(celery_env.out) if e == "try")
    assert [r for r, _ in tries] == [0, 1, 2]
    # Each retry ran not before its countdown after the try that failed.
    assert all(b[1] >= a[1] + 1 for a, b in zip(tries, tries[1:], strict=False))
    q.close()


def test_a_sigkilled_worker_leaves_its_tasks_to_the_next_one(celery_env, db):
    # publish_durable=False: the tasks share one bucket, all held by the first worker.
    sender = celery_env.app(**FAST, publish_durable=False)
    gate = celery_env.out / "gate"
    w1 = celery_env.start_worker("w1", "-c", "1", **FAST).wait_ready()
    first = sender.tasks["gated"].delay("slow", str(gate))
    rest = [sender.tasks["record"].delay(f"r{i}") for i in range(10)]
    eventually(lambda: _events(celery_env.out, "start")["slow"] == 1, what="the slow task to start")
    w1.kill()  # mid-task, with the other ten prefetched or held in its bucket
    gate.touch()
    celery_env.start_worker("w2", "-c", "2", **FAST).wait_ready()
    assert first.get(timeout=30) == "slow"
    assert [r.get(timeout=30) for r in rest] == [f"r{i}" for i in range(10)]
    # acks_late: the task the dead worker was running ran again, to the end, once.
    assert _events(celery_env.out, "start")["slow"] == 2
    assert _events(celery_env.out, "done")["slow"] == 1
    assert set(_events(celery_env.out, "run")) == {f"r{i}" for i in range(10)}


def test_a_sigtermed_worker_finishes_its_task_and_gives_the_rest_back(celery_env, db):
    # A lease far longer than the test: what comes back comes back by the worker's
    # rollback and release at shutdown, not because a lease ran out.
    slow_lease = {**FAST, "lease": 120.0}
    sender = celery_env.app(**slow_lease, publish_durable=False)
    gate = celery_env.out / "gate"
    w1 = celery_env.start_worker("w1", "-c", "1", **slow_lease).wait_ready()
    first = sender.tasks["gated"].delay("slow", str(gate))
    rest = [sender.tasks["record"].delay(f"r{i}") for i in range(10)]
    eventually(lambda: _events(celery_env.out, "start")["slow"] == 1, what="the slow task to start")
    stopped = time.time()
    w1.proc.terminate()  # warm shutdown: stop taking tasks, finish the running one
    eventually(lambda: "Warm shutdown" in w1.text(), what="the warm shutdown to begin")
    gate.touch()
    assert w1.proc.wait(30) == 0, w1.text()[-3000:]
    assert first.get(timeout=30) == "slow"
    celery_env.start_worker("w2", "-c", "2", **slow_lease).wait_ready()
    assert [r.get(timeout=20) for r in rest] == [f"r{i}" for i in range(10)]
    # It finished after the SIGTERM, was acknowledged, and did not run again.
    assert [t for e, k, t, _ in runs(celery_env.out) if (e, k) == ("done", "slow")][0] >= stopped
    assert _events(celery_env.out, "start")["slow"] == 1
    assert _events(celery_env.out, "run") == Counter(f"r{i}" for i in range(10))


def test_a_warm_shutdown_takes_nothing_more_and_releases_what_it_did_not_start(
    celery_env, db, mongo_client
):
    """SIGTERM to a prefork worker whose processes are busy, with more tasks in hand than
    it runs: from the signal on it is delivered nothing; what it held and had not
    received goes back at once, untried, to another worker; what Celery had received
    (its two running tasks, and the one its consumer was handing to the busy pool) runs
    to the end there and is acknowledged; nothing is lost or run twice."""
    slow_lease = {**FAST, "lease": 120.0}  # nothing comes back because a lease ran out
    sender = celery_env.app(**slow_lease)  # published one by one: a bucket each
    gate = celery_env.out / "gate"
    q = Queue(mongo_client[db.name], "celery")
    w1 = celery_env.start_worker("w1", "-c", "2", **slow_lease).wait_ready()
    keys = [f"t{i}" for i in range(7)]
    results = {k: sender.tasks["gated"].delay(k, str(gate)) for k in keys}
    # Two running, one received and waiting for a process, more held in w1's memory.
    eventually(
        lambda: (
            sum(_events(celery_env.out, "start").values()) == 2
            and len(_received(w1.text())) == 3
            and q.resv_size() > 3
        ),
        what="w1 running two tasks, holding more",
    )
    w1.proc.terminate()
    eventually(lambda: "Warm shutdown" in w1.text(), what="the warm shutdown to begin")
    # Given back at once: w1 cannot exit before the gate opens.
    eventually(lambda: (q.size(), q.resv_size()) == (4, 3), what="four ready, three leased")
    assert w1.proc.poll() is None
    celery_env.start_worker("w2", "-c", "4", **slow_lease).wait_ready()
    eventually(
        lambda: sum(_events(celery_env.out, "start").values()) == 6,
        what="w2 starting the four w1 gave back",
    )
    assert w1.proc.poll() is None
    gate.touch()
    assert w1.proc.wait(30) == 0, w1.text()[-3000:]
    assert {k: r.get(timeout=30) for k, r in results.items()} == {k: k for k in keys}
    before, _, after = w1.text().partition("Warm shutdown")
    assert _received(after) == []
    # w1 ran to the end exactly the three it had received before the signal.
    assert sorted(re.findall(r"Task gated\[([0-9a-f-]+)\] succeeded", after)) == sorted(
        _received(before)
    )
    assert _events(celery_env.out, "start") == Counter(keys)
    assert _events(celery_env.out, "done") == Counter(keys)
    assert not _events(celery_env.out, "redelivered")  # no try counted
    eventually(lambda: q.total_size() == 0, what="every task acknowledged")
    q.close()


def test_a_killed_pool_process_gives_its_task_back_at_once(celery_env, db):
    """A pool process killed (the OOM killer): Celery rejects the task with requeue
    (reject_on_worker_lost), which is a rollback: delivered again at once, no lease to wait."""
    slow_lease = {**FAST, "lease": 120.0}
    sender = celery_env.app(**slow_lease)
    gate = celery_env.out / "gate"
    w = celery_env.start_worker("w1", "-c", "1", **slow_lease).wait_ready()
    result = sender.tasks["gated"].delay("slow", str(gate))
    eventually(lambda: _events(celery_env.out, "start")["slow"] == 1, what="the task to start")
    child = next(int(p.stem.split("-")[1]) for p in celery_env.out.glob("runs-*.txt"))
    os.kill(child, signal.SIGKILL)
    eventually(
        lambda: _events(celery_env.out, "start")["slow"] == 2, what="the task to start again"
    )
    gate.touch()
    assert result.get(timeout=30) == "slow"
    assert _events(celery_env.out, "done")["slow"] == 1
    assert w.proc.poll() is None
