"""``bucketq worker --processes P``: worker processes killed, stuck and replaced, a
supervisor killed and stopped; nothing is lost. Each test starts a supervisor and three
worker processes and waits out a lease or a stuck handler, so each takes seconds."""

from __future__ import annotations

import os
import signal

from processes import alive

from waiting import eventually

from .handlers import read
from .procs import WorkerProcess, health, metric, stored_items
from .test_cli import OPTS, push

#: A 2 s lease: a killed process's items come back within seconds.
SHORT_LEASE = [*OPTS, "--queue-option", "lease=2"]


def test_a_killed_worker_process_loses_nothing_and_is_replaced(db, mongo_uri, tmp_path, events):
    push(db, [{"i": i, "sleep": 0.1} for i in range(60)], size=5)
    w = WorkerProcess(mongo_uri, db.name, tmp_path, "handlers:handle", "--processes", "2",
                      "--concurrency", "2", "--metrics-port", "0", *SHORT_LEASE)  # fmt: skip
    base = w.metrics_url()
    eventually(lambda: len(health(base)["processes"]) == 2 and health(base)["ok"],
               what="two worker processes reporting")  # fmt: skip
    eventually(lambda: sum(e == "done" for e, *_ in read(events)) >= 4, what="4 items done")
    victim = read(events)[0][3]
    os.kill(victim, signal.SIGKILL)  # no drain, no flush: its leases run out
    w.wait_log(f"worker process {victim} exited \\(exit status -9\\)")
    eventually(lambda: {i for e, i, _, _ in read(events) if e == "done"} == set(range(60)),
               timeout=60, what="every item done")  # fmt: skip
    eventually(lambda: health(base)["restarts"] == 1 and health(base)["ok"],
               what="the replacement reporting")  # fmt: skip
    assert metric(base, "bucketq_worker_processes", queue="jobs") == 2.0
    children = [p["pid"] for p in health(base)["processes"]]
    w.signal(signal.SIGKILL)  # the supervisor too: its children stop on their own
    w.wait()
    eventually(lambda: not any(alive(p) for p in children), what="the orphans to stop")
    ev = read(events)
    unfinished = {i for e, i, _, p in ev if e == "start" and p == victim} - {
        i for e, i, _, p in ev if e == "done" and p == victim
    }
    assert unfinished, "the killed process had nothing in hand"
    for i in unfinished:  # delivered again after the lease, one try more
        assert any(e == "done" and j == i and t >= 1 for e, j, t, _ in ev), i
    assert stored_items(db["jobs"]) == {}


def test_a_process_with_a_stuck_sync_handler_is_replaced(db, mongo_uri, tmp_path, events):
    push(db, [{"i": 0, "block": 1}, *({"i": i} for i in range(1, 4))], size=10)
    w = WorkerProcess(mongo_uri, db.name, tmp_path, "handlers:handle", "--processes", "2",
                      "--time-limit", "0.5", *OPTS, "--queue-option", "reject_delta_base=0",
                      "--queue-option", "reject_delta_factor=0")  # fmt: skip
    w.wait_log("exited \\(a handler was stuck past its time limit\\) after .* starting another")
    eventually(lambda: ("done", 0, 1) in [(e, i, t) for e, i, t, _ in read(events)],
               timeout=60, what="item 0 done on its second try")  # fmt: skip
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.log()
    stuck_pid = next(p for e, i, _, p in read(events) if (e, i) == ("start", 0))
    assert ("done", 0, 0) not in [(e, i, t) for e, i, t, _ in read(events)]
    assert {i for e, i, _, _ in read(events) if e == "done"} == {0, 1, 2, 3}
    assert f"worker process {stuck_pid} exited" in w.log()
    assert stored_items(db["jobs"]) == {}
