"""The Celery app of the broker tests, imported by a real ``celery worker`` process
(``-A celery_app``, run by path) and by the tests (``make_app``). It imports nothing of
bucketq: the broker URL alone selects the transport.

Every task appends one line per run to ``OUT/runs-<pid>.txt`` (unbuffered, so a line
written survives a SIGKILL): ``<event> <key> <unix time> <tries>``; ``runs(out)`` reads
them all back.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from celery import Celery

BROKER = "BQ_TEST_BROKER"
BACKEND = "BQ_TEST_BACKEND"
OUT = "BQ_TEST_OUT"
OPTIONS = "BQ_TEST_TRANSPORT_OPTIONS"


def _record(out: str, event: str, key: str, retries: int = 0) -> None:
    with open(os.path.join(out, f"runs-{os.getpid()}.txt"), "a", buffering=1) as f:
        f.write(f"{event} {key} {time.time():.6f} {retries}\n")


def runs(out: str | Path) -> list[tuple[str, str, float, int]]:
    """Every line the tasks wrote: (event, key, time, retries)."""
    found = []
    for p in sorted(Path(out).glob("runs-*.txt")):
        for line in p.read_text().splitlines():
            event, key, t, retries = line.split()
            found.append((event, key, float(t), int(retries)))
    return found


def make_app(broker: str, backend: str | None, out: str, options: dict | None = None) -> Celery:
    """The app, its settings as a user of acks_late sets them, and its tasks."""
    app = Celery("bq_tests", broker=broker, backend=backend)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_transport_options=options or {},
        broker_connection_retry_on_startup=True,
        worker_lost_wait=1.0,  # how long Celery waits for a killed pool process's result
    )

    @app.task(name="add", shared=False)
    def add(x: int, y: int) -> int:
        _record(out, "add", f"{x}+{y}")
        return x + y

    @app.task(name="record", shared=False)
    def record(key: str) -> str:
        _record(out, "run", key)
        return key

    @app.task(name="gated", shared=False, bind=True)
    def gated(self, key: str, gate: str) -> str:
        """Start, wait (at most a minute) until the file ``gate`` exists, finish. A
        delivery marked redelivered is recorded too."""
        if self.request.delivery_info.get("redelivered"):
            _record(out, "redelivered", key)
        _record(out, "start", key)
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)
        _record(out, "done", key)
        return key

    @app.task(name="flaky", shared=False, bind=True, max_retries=5)
    def flaky(self, key: str, fails: int, countdown: float) -> str:
        """Fail ``fails`` times, each retried after ``countdown`` seconds."""
        _record(out, "try", key, self.request.retries)
        if self.request.retries < fails:
            raise self.retry(countdown=countdown)
        return key

    return app


app = make_app(
    os.environ.get(BROKER, "bucketq://"),
    os.environ.get(BACKEND) or None,
    os.environ.get(OUT, "."),
    json.loads(os.environ.get(OPTIONS, "{}")),
)
