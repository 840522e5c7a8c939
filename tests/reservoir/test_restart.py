"""SIGKILL an ingest process mid-run; a new process delivers every acknowledged record
to storage, each exactly once (the storage is idempotent). Also: SIGTERM drains."""

from __future__ import annotations

import json
import os
import signal

import pytest
from stored_logs import stored_logs

from .crash import acked, crash_and_drain, read_rest, start_child, wait_for_line

pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize("transport", ["redis", "bucketq"])
async def test_sigkill_between_storage_write_and_ack_then_every_acked_record_is_stored_once(
    transport, backends, mongo_uri, redis_url
):
    """The child is killed after a storage write landed and before its ack; a new process
    drains the transport (redelivering that batch): each record is stored exactly once."""
    prefix = backends.prefix if transport == "redis" else backends.prefix.replace(":", "_")
    backends.adb()  # registers the database for cleanup
    backends.redis()  # registers the prefix's keys for cleanup
    out = await crash_and_drain(
        transport, mongo_uri, redis_url, db_name=backends.db_name, prefix=prefix, kill_after=800
    )
    print(f"\n[restart/{transport}] {out}")
    assert 0 < out["stored_at_kill"] < out["documents"], "the kill should land mid-run"
    assert out["pending_at_restart"] > 0
    assert out["missing"] == 0  # every acknowledged record reached storage
    assert out["lost_from_stored"] == 0
    assert out["documents"] == out["distinct"]  # ... exactly once
    # Beyond the acknowledged ones: at most the one ingest in flight at the kill.
    in_flight = {f"rec-{i}" for i in range(out["acked"], out["acked"] + 10)}
    assert set(out["beyond_acked"]) <= in_flight
    assert out["dead_lettered"] == 0


async def test_sigterm_drains_and_reports(backends, mongo_uri, mongo_client, redis_url):
    db_name = backends.db_name
    backends.adb()
    proc = start_child("redis", backends.prefix, mongo_uri, db_name, redis_url, "sigterm")
    try:
        lines = wait_for_line(proc, lambda x: x == "READY")
        os.kill(proc.pid, signal.SIGTERM)
        rest = read_rest(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines += rest.split("\n")
    (report,) = [json.loads(x[len("STOPPED ") :]) for x in lines if x.startswith("STOPPED ")]
    enqueued = acked(lines)
    stored = {r["message"] for r in stored_logs(mongo_client[db_name])}
    print(f"\n[sigterm/redis] enqueued={enqueued} report={report} stored_distinct={len(stored)}")
    assert proc.returncode == 0
    assert report["lost"] == 0 and report["timed_out"] is False
    # What the report calls left is still in Redis, not lost: stored + left covers the acked.
    missing = {f"rec-{i}" for i in range(enqueued)} - stored
    assert len(missing) <= report["left"]
