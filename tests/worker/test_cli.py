"""``bucketq worker MODULE:FUNCTION`` in a process of its own: signals, logs, metrics."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from bucketq import Queue
from fast_settings import FAST
from waiting import eventually

from .handlers import read
from .procs import WorkerProcess, get, health, metric, stored_items

#: The queue options the command lines below pass (as FAST, for a process of its own).
OPTS = ["--queue-option", "state_flush_period=0.1", "--queue-option", "poll_interval=0.2",
        "--queue-option", "lease=5"]  # fmt: skip


def push(db, items: list[dict], size: int = 10) -> None:
    q = Queue(db, "jobs", **{**FAST, "bucket_max_size": size})
    q.push_many(items)
    q.close()


def test_sigterm_finishes_the_items_in_hand_releases_the_rest_and_exits_0(
    db, mongo_uri, tmp_path, events
):
    push(db, [{"i": i, "sleep": 0.3} for i in range(40)])
    w = WorkerProcess(mongo_uri, db.name, tmp_path, "handlers:handle", "--concurrency", "4",
                      "--drain-timeout", "20", *OPTS)  # fmt: skip
    eventually(lambda: sum(e == "done" for e, *_ in read(events)) >= 6, what="6 items done")
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.log()
    ev = read(events)
    started = {i for e, i, _, _ in ev if e == "start"}
    done = [i for e, i, _, _ in ev if e == "done"]
    assert started == set(done), "an item in hand was not finished"
    left = stored_items(db["jobs"])
    assert set(left) | set(done) == set(range(40)) and not set(left) & set(done)
    assert max(left.values()) == 1
    for doc in db["jobs"].find({}, {"lease": 1, "tries": 1}):
        assert doc.get("lease") is None and not doc.get("tries")  # released, no try counted
    assert "stopping (SIGTERM)" in w.log()


def test_a_second_signal_releases_what_is_held_at_once(db, mongo_uri, tmp_path, events):
    push(db, [{"i": i, "sleep": 3600} for i in range(3)])
    w = WorkerProcess(mongo_uri, db.name, tmp_path, "handlers:handle", "--drain-timeout", "3600",
                      *OPTS)  # fmt: skip
    eventually(lambda: read(events), what="the handler to start")
    w.signal(signal.SIGTERM)
    w.wait_log("stopping \\(SIGTERM\\)")
    w.signal(signal.SIGINT)  # the handler would take an hour, the drain as long
    assert w.wait(timeout=60) == 0, w.log()
    assert "stopping at once (SIGINT)" in w.log()
    assert stored_items(db["jobs"]) == {0: 1, 1: 1, 2: 1}  # nothing lost
    (doc,) = db["jobs"].find({}, {"lease": 1, "tries": 1})
    assert doc.get("lease") is None and not doc.get("tries")


def test_failures_are_logged_as_json_and_metrics_and_health_are_served(
    db, mongo_uri, tmp_path, events
):
    push(db, [{"i": i} for i in range(5)] + [{"i": 5, "fail_until": 99, "secret": "s3cr3t"}])
    w = WorkerProcess(mongo_uri, db.name, tmp_path, "handlers:handle_async", "--log-json",
                      "--metrics-port", "0", "--concurrency", "2", *OPTS,
                      "--queue-option", "max_tries=2", "--queue-option", "reject_delta_base=0",
                      "--queue-option", "reject_delta_factor=0")  # fmt: skip
    base = w.metrics_url()
    eventually(lambda: metric(base, "bucketq_worker_items_total", queue="jobs",
                              outcome="committed") == 5.0, what="5 commits in /metrics")  # fmt: skip
    eventually(lambda: metric(base, "bucketq_queue_dead_lettered_total", queue="jobs") == 1.0,
               what="a dead letter in /metrics")  # fmt: skip
    assert metric(base, "bucketq_worker_items_total", queue="jobs", outcome="failed") == 1.0
    assert metric(base, "bucketq_worker_items_total", queue="jobs", outcome="dead_letter") == 1.0
    assert metric(base, "bucketq_worker_handler_seconds_count", queue="jobs") == 7.0
    assert metric(base, "bucketq_worker_processes", queue="jobs") == 1.0
    assert metric(base, "bucketq_queue_items", queue="jobs", kind="queue", state="ready") == 0.0
    h = health(base)
    assert h["ok"] and h["state"] == "running" and h["queue"]["ok"]
    assert get(base + "/nothing")[0] == 404
    w.signal(signal.SIGTERM)
    assert w.wait() == 0, w.log()
    lines = [json.loads(x) for x in w.log().splitlines() if x.startswith("{")]
    failures = [x for x in lines if x.get("outcome") in ("failed", "dead_letter")]
    assert [(x["tries"], x["exception"], x["outcome"], x["level"]) for x in failures] == [
        (1, "ValueError", "failed", "WARNING"),
        (2, "ValueError", "dead_letter", "ERROR"),
    ]
    assert failures[0]["items"] == failures[1]["items"] and failures[0]["queue"] == "jobs"
    assert "s3cr3t" not in w.log()
    dead = Queue(db, "jobs.dlq", **FAST)
    assert dead.pop(timeout=10).payload["i"] == 5
    dead.close()


def test_a_handler_that_cannot_be_imported_is_one_line_and_exit_1(db, mongo_uri):
    r = subprocess.run(
        [sys.executable, "-m", "bucketq", "worker", "no_such_module:handle", "--queue", "jobs",
         "--mongodb-uri", mongo_uri, "--database", db.name],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "bucketq worker: error: Cannot import the handler's module 'no_such_module': No module "
        "named 'no_such_module'. Run the command where the module can be imported (or set "
        "PYTHONPATH)."
    ]
