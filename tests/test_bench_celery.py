"""`bucketq bench celery` end to end at a tiny N, bucketq alone (its peers need Redis and
RabbitMQ, which the bench only uses): the figures a user reads, and that neither a killed
worker nor a killed server lost a task. No timing thresholds. It starts four Celery workers
and kills and restarts an embedded server, so it is one of the slow tests."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("celery", reason="the celery extra is not installed")
pytestmark = pytest.mark.bench


def test_bucketq_loses_no_task_when_its_worker_or_server_is_killed(tmp_path):
    out = tmp_path / "celery.json"
    r = subprocess.run(
        [sys.executable, "-m", "bucketq", "bench", "celery", "--n", "30", "--kill-n", "10",
         "--window", "20", "--broker", "bucketq", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads(out.read_text())["brokers"]["bucketq"]
    t = row["throughput"]
    assert t["n"] == 30 and t["publish_per_s"] > 0 and t["end_to_end_per_s"] > 0
    killed = row["worker_killed"]
    assert killed["tasks"] == 10 and killed["lost"] == 0 and killed["done"] == 10
    assert killed["options"]["lease"] == 5.0
    assert row["server_killed"] == {"tasks": 10, "done": 10, "lost": 0, "run_twice_or_more": 0}
    assert "| bucketq | 30 |" in r.stdout
    assert "| bucketq | 0 of 10 |" in r.stdout and "| 0 of 10 |" in r.stdout
