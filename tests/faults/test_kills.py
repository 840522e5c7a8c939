"""Scenarios 1 and 2: producers and consumers killed with SIGKILL."""

from __future__ import annotations

import time

from bucketq import Queue
from fast_settings import FAST_FAULTS
from waiting import eventually

from .conftest import read_lines, run_worker, stored_items


def test_killed_producer_keeps_every_acknowledged_item(db, mongo_uri, tmp_path):
    """Scenario 1: every item whose receipt resolved is stored; none is stored twice."""
    out = tmp_path / "acked.txt"
    p = run_worker("push", mongo_uri, db.name, "q", out, "--count", "1000000", "--batch", "50",
                   options={**FAST_FAULTS, "bucket_max_wait": 30.0})  # fmt: skip

    def midway() -> bool:  # kill mid-run, with pushes still in flight
        assert p.poll() is None, "the producer died"
        return len(read_lines(out)) >= 500

    eventually(midway, timeout=60, what="500 acknowledged pushes")
    p.kill()
    p.wait()
    acked = {int(r[0]) for r in read_lines(out)}
    stored = stored_items(db["q"])
    lost = acked - set(stored)
    print(f"\nproducer SIGKILL: acked={len(acked)} stored={sum(stored.values())} lost_acked={len(lost)} "
          f"stored_not_acked={len(set(stored) - acked)}")  # fmt: skip
    assert not lost, f"{len(lost)} acknowledged items are not in MongoDB"
    assert max(stored.values()) == 1, "an item was stored twice"


def _hold_then_kill(db, mongo_uri, tmp_path, *args):
    q = Queue(db, "q", bucket_max_size=10, bucket_max_wait=0.05)
    for i in range(10):
        q.push({"i": i})
    q.close()
    out = tmp_path / "held.txt"
    p = run_worker("hold", mongo_uri, db.name, "q", out, "--reserve", "7", *args,
                   options={**FAST_FAULTS, "prefetch": 0})  # fmt: skip
    assert p.stdout.readline().strip() == "READY"
    p.kill()  # SIGKILL: no drain, no flush; the lease stays until it runs out
    p.wait()
    killed_at = time.monotonic()
    early = {int(r[0]) for r in read_lines(out) if r[2] == "early"}
    late = {int(r[0]) for r in read_lines(out) if r[2] == "late"}
    c = Queue(db, "q", **FAST_FAULTS)
    got = []
    recovery = 0.0
    # Every uncommitted item must come back (once the lease ran out); the late commits
    # may too. They share one bucket, so once the first is back the rest are in memory:
    # take those without waiting, and the empty collection after close() proves that
    # nothing was left behind.
    uncommitted = 10 - len(early) - len(late)
    # A wait covers the 2 s lease running out (a hang fails it), with room for a busy machine.
    while (m := c.reserve(timeout=0 if len(got) >= uncommitted else 30)) is not None:
        got.append((m.payload["i"], m.tries))
        c.commit(m)
        recovery = time.monotonic() - killed_at  # until the last redelivery
    c.close()
    assert len(got) >= uncommitted, f"only {len(got)} of {uncommitted} uncommitted items came back"
    assert db["q"].count_documents({}) == 0
    return early, late, got, recovery


def test_killed_consumer_redelivers_at_most_the_last_flush_period(db, mongo_uri, tmp_path):
    """Scenario 2: 4 commits, then several flush periods, then 2 commits and SIGKILL.
    The 3 uncommitted come back with tries + 1; the first 4 never do; of the last 2,
    at most both do."""
    early, late, got, recovery = _hold_then_kill(
        db, mongo_uri, tmp_path, "--commit", "4", "--gap", "1.0", "--late", "2"
    )
    ids = [i for i, _ in got]
    redelivered_commits = set(ids) & (early | late)
    print(f"\nconsumer SIGKILL (no flush): redelivered={len(ids)} of which committed before the kill="
          f"{sorted(redelivered_commits)} recovery={recovery:.2f}s")  # fmt: skip
    assert len(ids) == len(set(ids)), "the new consumer got an item twice"
    assert set(ids) | early | late == set(range(10)), "an item was lost"
    assert not set(ids) & early, "commits flushed before the kill came back"
    assert set(ids) - late == set(range(10)) - early - late  # exactly the uncommitted (+ late ones)
    assert all(t == 1 for _, t in got)


def test_killed_consumer_with_flushed_commits_redelivers_none(db, mongo_uri, tmp_path):
    early, late, got, recovery = _hold_then_kill(
        db, mongo_uri, tmp_path, "--commit", "6", "--flush-commits"
    )
    print(f"\nconsumer SIGKILL (flush=True): redelivered={len(got)} recovery={recovery:.2f}s")
    assert sorted(got) == [(i, 1) for i in sorted(set(range(10)) - early)]
    assert len(early) == 6
