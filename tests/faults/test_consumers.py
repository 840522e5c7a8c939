"""Scenarios 4, 5 and 8: a frozen (zombie) consumer, a poison item, drain() on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import UTC, datetime

from bucketq import Queue
from bucketq.bucket.codec import decode_items
from fast_settings import FAST_FAULTS
from waiting import eventually

from .conftest import read_lines, run_worker


def _fill(db, n, size, **kw):
    q = Queue(db, "q", bucket_max_size=size, bucket_max_wait=0.05)
    for i in range(n):
        q.push({"i": i, **kw.get("extra", {}).get(i, {})}, headers=kw.get("headers"))
    q.close()


def test_zombie_consumer_is_fenced(db, mongo_uri, tmp_path, request):
    """Scenario 4: frozen past its lease while B claims the bucket, then resumed: none
    of its writes lands on B's lease, it counts a lease loss, it serves nothing again."""
    _fill(db, 10, 10)
    out = tmp_path / "zombie.txt"
    opts = {**FAST_FAULTS, "lease": 1.5, "prefetch": 0}
    z = run_worker("zombie", mongo_uri, db.name, "q", out, "--reserve", "5", "--commit", "2", "--idle", "1.5",
                   options=opts, stdin=True)  # fmt: skip
    assert z.stdout.readline().strip() == "READY"
    os.kill(z.pid, signal.SIGSTOP)
    try:
        # B can claim the bucket only once the zombie's 1.5 s lease has run out: its
        # first reserve waits for exactly that.
        b = Queue(db, "q", **{**FAST_FAULTS, "lease": 20.0})
        request.addfinalizer(b.close)
        got = []
        while len(got) < 8 and (m := b.reserve(timeout=10)) is not None:
            got.append(m)
        assert sorted((m.payload["i"], m.tries) for m in got) == [(i, 1) for i in range(2, 10)]
        b.flush()  # B's own state (its takeover's tries) is in, so what changes next is not B's
        before = db["q"].find_one()
    finally:
        os.kill(z.pid, signal.SIGCONT)
    z.stdin.write("go\n")
    z.stdin.flush()
    stats = json.loads(z.stdout.readline())
    assert z.wait(30) == 0
    after = db["q"].find_one()
    again = [r for r in read_lines(out) if r[0] == "again"]
    print(f"\nzombie: lease_losses={stats['lease_losses']} served_again={len(again)} "
          f"B_got={len(got)} doc_unchanged={after['done'] == before['done']}")  # fmt: skip
    assert after["lease"]["tok"] == before["lease"]["tok"], "the zombie overwrote B's lease"
    for k in ("done", "live", "tries", "next", "mature"):
        assert after.get(k) == before.get(k), f"the zombie's write landed on B's bucket ({k})"
    assert stats["lease_losses"] > 0
    assert not again, f"the zombie served {len(again)} items it no longer held"
    for m in got:
        assert b.commit(m)
    b.close()
    assert db["q"].count_documents({}) == 0


def test_poison_item_goes_to_the_dead_letter_queue(db, mongo_uri, tmp_path):
    """Scenario 5: the poison item is rolled back until max_tries, then dead-lettered with
    its headers; its 9 neighbours are committed at once, not after its retries."""
    _fill(db, 10, 10, extra={4: {"poison": True}}, headers={"trace": "abc"})
    out = tmp_path / "poison.txt"
    t0 = time.time()
    p = run_worker("poison", mongo_uri, db.name, "q", out, "--delay", "0.5", "--idle", "3",
                   options={**FAST_FAULTS, "max_tries": 3})  # fmt: skip
    assert p.wait(60) == 0
    rows = [(float(t), int(i), int(tries), ev) for t, i, tries, ev in read_lines(out)]
    commits = [r for r in rows if r[3] == "commit"]
    rollbacks = [r for r in rows if r[3] == "rollback"]
    assert sorted(r[1] for r in commits) == [i for i in range(10) if i != 4]
    assert [r[2] for r in rollbacks] == [0, 1, 2]
    last_good = max(r[0] for r in commits)
    # Committed before the poison's second delivery, i.e. without waiting for it.
    assert last_good < rollbacks[1][0], "good items waited for the poison item's retries"
    dlq = list(db["q.dlq"].find())
    assert len(dlq) == 1
    items = decode_items(dlq[0]["items"])
    assert [it["p"] for it in items] == [{"i": 4, "poison": True}]
    h = items[0]["h"]
    print(
        f"\npoison: good committed after {last_good - t0:.2f}s, rollbacks={len(rollbacks)}, dlq headers={h}"
    )
    assert (
        h["trace"] == "abc" and h["x-source-queue"] == "q" and h["x-tries"] >= 3 and h["x-reason"]
    )
    assert "x-dead-at" in h
    assert db["q"].count_documents({}) == 0


def test_drain_on_sigterm_releases_at_once_and_writes_open_pushes(db, mongo_uri, tmp_path):
    """Scenario 8: the draining consumer releases what it held (one reserved, one read
    ahead) at once, and writes its open push bucket."""
    _fill(db, 20, 10)
    out = tmp_path / "drain.txt"
    opts = {**FAST_FAULTS, "lease": 30.0, "prefetch": 1, "bucket_max_wait": 60.0}
    d = run_worker("drain", mongo_uri, db.name, "q", out, "--reserve", "3", "--commit", "2",
                   "--count", "5", "--start", "100", options=opts)  # fmt: skip
    assert d.stdout.readline().strip() == "READY"

    def both_leased() -> bool:  # the one being served and the read-ahead
        return db["q"].count_documents({"lease.until": {"$gt": datetime.now(UTC)}}) == 2

    eventually(both_leased, timeout=30, what="the read-ahead claim of the second bucket")
    d.send_signal(signal.SIGTERM)
    report = json.loads(d.stdout.readline())
    assert d.wait(30) == 0
    # Released at once: no lease is left for the next consumer to wait out (30 s).
    assert db["q"].count_documents({"lease": {"$ne": None}}) == 0
    c = Queue(db, "q", **{**FAST_FAULTS, "lease": 30.0})
    got = []
    while len(got) < 23 and (m := c.reserve(timeout=10)) is not None:
        got.append((m.payload["i"], m.tries))
        c.commit(m)
    c.close()
    committed = {int(r[0]) for r in read_lines(out)}
    print(f"\ndrain: report={report} others got {len(got)}")
    assert report["buckets_written"] == 1 and report["released_buckets"] == 2
    expect = sorted(
        [(i, 0) for i in range(20) if i not in committed] + [(i, 0) for i in range(100, 105)]
    )
    assert sorted(got) == expect
    assert db["q"].count_documents({}) == 0
