"""Scenario 7: 4 producer and 4 consumer processes move BUCKETQ_SOAK_N items (default
1,000,000); the committed multiset covers the pushed one: nothing lost, duplicates counted."""

from __future__ import annotations

import os
import time

import pytest

from .conftest import consumers, ids, run_worker

pytestmark = pytest.mark.soak


@pytest.mark.timeout(6 * 3600)
def test_soak_four_producers_four_consumers(db, mongo_uri, tmp_path):
    n = int(os.environ.get("BUCKETQ_SOAK_N", "1000000"))
    share = -(-n // 4)
    opts = {"state_flush_period": 0.2, "poll_interval": 0.2, "lease": 30.0}
    t0 = time.time()
    producers = [
        run_worker(
            "push",
            mongo_uri,
            db.name,
            "q",
            tmp_path / f"acked{k}.txt",
            "--start",
            str(k * share),
            "--count",
            str(min(share, n - k * share)),
            "--batch",
            "1000",
            options=opts,
        )  # fmt: skip
        for k in range(4)
    ]
    procs, outs = consumers(4, mongo_uri, db.name, "q", tmp_path, "--idle", "20", options=opts)
    for p in producers + procs:
        assert p.wait() == 0
    # Until the last commit was written (the consumers then idle out).
    elapsed = max(os.path.getmtime(out) for out in outs) - t0
    acked = ids(*(tmp_path / f"acked{k}.txt" for k in range(4)))
    consumed = ids(*outs)
    lost = set(acked) - set(consumed)
    dups = sum(v - 1 for v in consumed.values() if v > 1)
    print(f"\nsoak: N={n} in {elapsed:.0f}s ({n / elapsed:.0f} items/s end to end): acked={len(acked)} "
          f"committed={sum(consumed.values())} lost={len(lost)} duplicates={dups}")  # fmt: skip
    assert sorted(acked) == list(range(n)) and max(acked.values()) == 1
    assert not lost, f"{len(lost)} items lost"
    assert set(consumed) == set(acked)
    assert db["q"].count_documents({}) == 0
