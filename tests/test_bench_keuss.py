"""`bucketq bench keuss` end to end at a tiny N: bucketq's Queue and keuss's
bucket-mongo-safe (Node.js, installed from npm into the user's cache the first time)
on the test server, what a user reads of the output; and the one line it says without
node. No timing thresholds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from bucketq.benchmark.keuss import FIGURES

pytestmark = pytest.mark.bench

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
N = 1_500


def _need_node() -> None:
    missing = [t for t in ("node", "npm") if not shutil.which(t)]
    if missing:
        reason = (
            f"{' and '.join(missing)} not installed: `bucketq bench keuss` runs keuss under Node.js"
        )
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: node and npm are on this kind of machine)")
        pytest.skip(reason)


def _bench_keuss(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``bucketq bench keuss ARGS`` run as a user runs it, its output captured."""
    return subprocess.run([sys.executable, "-m", "bucketq", "bench", "keuss", *args],
                          capture_output=True, text=True, **kw)  # fmt: skip


def test_bench_keuss_runs_both_queues_and_reports_their_ratios(mongo_uri, tmp_path):
    _need_node()
    out = tmp_path / "keuss.json"
    done = _bench_keuss("--n", str(N), "--rounds", "1", "--mongodb-uri", mongo_uri,
                        "--json", str(out), timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["n"] == N and len(doc["rounds"]) == 1
    assert doc["env"]["versions"]["keuss"].startswith("2.")
    s = doc["summary"]
    for who in ("bucketq", "keuss"):
        assert all(s["median"][who][f] > 0 for f in FIGURES), s["median"][who]
    assert all(s["median"]["ratio"][f] > 0 for f in FIGURES)
    assert s["floor_us"] > 0 and s["median"]["bucketq"]["cpu_us"] > 0
    table = done.stdout
    for words in ("push/s", "consume/s", "end-to-end/s", "15x", "BSON floor", "load avg",
                  "where the time goes", "commands per 1,000 items"):  # fmt: skip
        assert words in table, table
    # The split: each side's commands per phase, counted by its own client (pymongo's
    # command monitoring; the node driver's for keuss): the bucket inserts when pushing,
    # a claim per bucket when consuming.
    split = s["split"]
    assert split["bucketq"]["push"]["commands_per_1000"].get("insert", 0) > 0, split
    assert (
        split["bucketq"]["consume"]["commands_per_1000"].get("update", 0)
        + split["bucketq"]["consume"]["commands_per_1000"].get("findAndModify", 0)
        > 0
    ), split
    assert split["keuss"]["push"]["commands_per_1000"].get("insert", 0) > 0, split
    assert split["keuss"]["consume"]["commands_per_1000"].get("findAndModify", 0) > 0, split
    for who in ("bucketq", "keuss"):
        for phase in ("push", "consume"):
            assert split[who][phase]["wall_us"] > 0 and split[who][phase]["cpu_us"] > 0, split
    # keuss's databases are dropped (bucketq's too, by the same code as `bucketq bench`'s,
    # whose databases other tests may be using now)
    from pymongo import MongoClient

    with MongoClient(mongo_uri) as c:
        assert not [d for d in c.list_database_names() if d.startswith("bucketq_bench_keuss_")]


def test_bench_keuss_without_node_says_so_in_one_line(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # neither node nor npm on it
    done = _bench_keuss("--n", "10", "--keuss-dir", str(tmp_path), timeout=120, env=env)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert (
        lines[0].startswith("bucketq bench keuss: node is not installed") and "Node.js" in lines[0]
    )
