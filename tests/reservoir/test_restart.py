"""SIGKILL an ingest process mid-run; a new process delivers every acknowledged record
to storage (at-least-once: duplicates are counted and printed). Also: SIGTERM drains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pymongo import AsyncMongoClient

from bucketq.reservoir import BufferedReservoir, MongoReservoir

from .helpers import eventually

pytestmark = pytest.mark.timeout(150)

CHILD = Path(__file__).with_name("child.py")


def start_child(
    transport: str, prefix: str, mongo_uri: str, db: str, redis_url: str, mode: str
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CHILD), transport, prefix, mongo_uri, db, redis_url, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def wait_for_line(proc: subprocess.Popen, predicate, timeout: float = 60.0) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited early (rc={proc.poll()}); last lines {lines[-3:]}")
        lines.append(line.strip())
        if predicate(line.strip()):
            return lines
    raise AssertionError("child too slow")


def acked(lines: list[str]) -> int:
    """Records acknowledged to the caller: ``ACK <seq>`` means 0..seq were."""
    seqs = [int(x.split()[1]) for x in lines if x.startswith("ACK ")]
    return max(seqs) + 1 if seqs else 0


@pytest.mark.parametrize("transport", ["redis", "bucketq"])
async def test_sigkill_mid_run_then_a_new_process_stores_every_acknowledged_record(
    transport, backends, mongo_uri, mongo_client, redis_url
):
    prefix = backends.prefix if transport == "redis" else backends.prefix.replace(":", "_")
    db_name = backends.db_name
    backends.adb()  # registers the database for cleanup
    proc = start_child(transport, prefix, mongo_uri, db_name, redis_url, "kill")
    try:
        lines = wait_for_line(proc, lambda x: x.startswith("ACK ") and int(x.split()[1]) >= 799)
        stored_at_kill = mongo_client[db_name]["logs"].count_documents({})
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    lines += rest.split("\n")
    enqueued = acked(lines)
    assert 0 < stored_at_kill < enqueued, "the kill should land mid-run"

    # The next process: same transport, same storage.
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri)
    db = client[db_name]
    if transport == "redis":
        from bucketq.reservoir import RedisTransport

        t = RedisTransport(backends.redis(), prefix=prefix, claim_idle=1.0)
    else:
        from bucketq.reservoir import BucketqTransport

        t = BucketqTransport(
            db,
            prefix=prefix,
            queue_options={"lease": 2.0, "state_flush_period": 0.2, "poll_interval": 0.2},
        )
    from .child import CONFIG

    logs_col = mongo_client[db_name]["logs"]
    want = {f"rec-{i}" for i in range(enqueued)}
    buf = BufferedReservoir(MongoReservoir(db), t, CONFIG)
    async with buf:
        pending_at_restart = buf.pending
        await eventually(
            lambda: want <= set(logs_col.distinct("message")), timeout=90, what="every acked record"
        )
        await eventually(lambda: buf.pending == 0 or buf.stats()["stored"] > 0, timeout=30)
    await client.close()
    messages = [d["message"] for d in logs_col.find({}, {"message": 1})]
    distinct = set(messages)
    duplicates = len(messages) - len(distinct)
    print(
        f"\n[restart/{transport}] enqueued(acked)={enqueued} stored_at_kill={stored_at_kill} "
        f"pending_at_restart={pending_at_restart} stored_rows={len(messages)} distinct={len(distinct)} "
        f"acked_missing={len(want - distinct)} duplicates={duplicates} "
        f"stored_beyond_acked={len(distinct - want)}"
    )
    assert want <= distinct  # every acknowledged record reached storage
    assert dlq_empty(buf)


def dlq_empty(buf: BufferedReservoir) -> bool:
    return buf.stats().get("dead_lettered", 0) == 0


async def test_sigterm_drains_and_reports(backends, mongo_uri, mongo_client, redis_url):
    db_name = backends.db_name
    backends.adb()
    proc = start_child("redis", backends.prefix, mongo_uri, db_name, redis_url, "sigterm")
    try:
        lines = wait_for_line(proc, lambda x: x == "READY")
        os.kill(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines += rest.split("\n")
    (report,) = [json.loads(x[len("STOPPED ") :]) for x in lines if x.startswith("STOPPED ")]
    enqueued = acked(lines)
    stored = set(mongo_client[db_name]["logs"].distinct("message"))
    print(f"\n[sigterm/redis] enqueued={enqueued} report={report} stored_distinct={len(stored)}")
    assert proc.returncode == 0
    assert report["lost"] == 0 and report["timed_out"] is False
    # What the report calls left is still in Redis, not lost: stored + left covers the acked.
    missing = {f"rec-{i}" for i in range(enqueued)} - stored
    assert len(missing) <= report["left"]
