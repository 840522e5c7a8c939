"""``bucketq serve --workers 2``: one port served by two processes,
``/metrics`` counting both whichever answers it, and SIGTERM stopping both gracefully
(their memory buffers flushed: every acknowledged record stored)."""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

import httpx
from processes import alive
from pymongo import MongoClient
from stored_logs import stored_logs

from bucketq.queue import Queue
from bucketq.server import _keys
from waiting import eventually

from .helpers import TLS, Serve, log_batch
from .test_admission import metric

REQUESTS = 30


def _children(pid: int) -> set[int]:
    """The worker processes of ``bucketq serve`` (its children running uvicorn)."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found |= {int(c) for c in f.read().split()}
        except OSError:
            pass
    workers = set()
    for c in found:
        try:
            with open(f"/proc/{c}/cmdline", "rb") as f:
                if b"multiprocessing" in f.read() and not _is_tracker(c):
                    workers.add(c)
        except OSError:
            pass
    return workers


def _is_tracker(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return b"resource_tracker" in f.read()


def test_two_workers_one_port_metrics_of_both_and_a_graceful_stop(
    mongo_uri: str, mongo_client: MongoClient, tmp_path: Path
) -> None:
    db = f"bqw_{secrets.token_hex(5)}"
    key = _keys.create_key(mongo_client[db], "workers")
    serve = Serve(mongo_uri, db, tmp_path / "serve.log", "--workers", "2",
                  RESERVOIR_BUFFER_ENABLED="true", RESERVOIR_BUFFER_TRANSPORT="memory",
                  BUCKETQ_WATCH_QUEUES="jobs").start()  # fmt: skip
    try:
        assert serve.proc is not None
        workers = eventually(lambda: len(w := _children(serve.proc.pid)) == 2 and w,
                             what="two worker processes")  # fmt: skip
        # a connection each (Connection: close), so the kernel hands them to either worker
        for i in range(REQUESTS):
            r = httpx.post(serve.url + "/api/v1/ingest", verify=TLS, json=log_batch(2, prefix=f"r{i}"),
                           headers={"X-API-Key": key, "Connection": "close"}, timeout=30)  # fmt: skip
            assert r.status_code == 200, r.text
        for _ in range(6):  # whichever worker answers, it counts both
            text = httpx.get(
                serve.url + "/metrics", verify=TLS, headers={"Connection": "close"}
            ).text
            n = metric(text, "bucketq_http_requests_total", route="/api/v1/ingest", status="200")
            assert n == REQUESTS, text
            assert metric(text, "reservoir_buffer_enqueued_total") == 2 * REQUESTS, text
        # The watched queue's sizes (the same in every worker), whichever worker answers.
        with Queue(mongo_client[db], "jobs") as q:
            q.push_many(range(3), durable=True)
        jobs = 'bucketq_queue_items{kind="queue",queue="jobs",state="ready"} 3.0'
        for _ in range(4):
            eventually(lambda: jobs in httpx.get(serve.url + "/metrics", verify=TLS, headers={"Connection": "close"}).text,
                       30, what="/metrics to export the watched queue")  # fmt: skip

        # SIGTERM: each worker stops its buffer (flushes what it holds), then the parent ends
        assert serve.terminate(signal.SIGTERM) == 0, serve.output()
        assert not any(alive(w) for w in workers)
        assert len(stored_logs(mongo_client[db], {"project_id": "workers"})) == 2 * REQUESTS
        assert "Traceback" not in serve.output()
    finally:
        serve.terminate(signal.SIGKILL)
        mongo_client.drop_database(db)
