"""The Celery app ``bucketq bench celery`` runs: the worker process imports this module
(``celery -A bucketq.benchmark.celery._app worker``) and reads its settings from the
environment; the bench process builds the same app with :func:`make_app` to send.

One task, ``bench.work(i, sleep)``: sleeps ``sleep`` seconds (0: none), then appends
``i time`` to ``OUT/done-<pid>.txt`` (a line written survives a SIGKILL). The settings
are the ones docs/celery.md recommends on every broker: ``task_acks_late`` and
``task_reject_on_worker_lost``; no result backend.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import Celery

BROKER, QUEUE, OUT, OPTIONS = "BQBENCH_BROKER", "BQBENCH_QUEUE", "BQBENCH_OUT", "BQBENCH_OPTIONS"

_files: dict[int, Any] = {}


def _done_file(out: str) -> Any:
    pid = os.getpid()
    f = _files.get(pid)
    if f is None:
        f = _files[pid] = open(os.path.join(out, f"done-{pid}.txt"), "a", buffering=1)  # noqa: SIM115 - open for the process's life
    return f


def make_app(broker: str, queue: str, out: str, options: dict[str, Any]) -> Celery:
    if broker.startswith("bucketq"):
        # The explicit registration; an installed wheel's .pth line does it by itself.
        import bucketq.celery  # noqa: F401

    app = Celery("bqbench", broker=broker)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_default_queue=queue,
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        worker_lost_wait=1.0,
    )

    @app.task(name="bench.work", shared=False)
    def work(i: int, sleep: float = 0.0) -> None:
        if sleep:
            time.sleep(sleep)
        _done_file(out).write(f"{i} {time.time():.6f}\n")

    return app


if os.environ.get(BROKER):
    app = make_app(
        os.environ[BROKER],
        os.environ[QUEUE],
        os.environ[OUT],
        json.loads(os.environ.get(OPTIONS, "{}")),
    )
