"""Two consumer processes working down a large backlog deliver every item once.

Behind ``-m soak`` (not in CI): with 600,000 items already stored, the embedded server's
claims scan ~60 MB each and take longer than a short lease. Before the fix (2026-11-22)
a consumer counted its lease from when its claim returned, not from when it was sent, so
a claim slower than the lease served a bucket whose lease had already run out, and the
other consumer took it over: 2,048 items came twice here, and ``bucketq bench`` at
N=1,000,000, P=2 failed its exactly-once check. tests/faults/test_slow_claim.py shows
the same deterministically with a failpoint; this is the load that found it.
"""

from __future__ import annotations

import os

import pytest

from .conftest import consumers, ids, run_worker

pytestmark = pytest.mark.soak


@pytest.mark.timeout(3600)
def test_two_consumers_of_a_large_backlog_deliver_every_item_once(db, mongo_uri, tmp_path):
    n = int(os.environ.get("BUCKETQ_BACKLOG_N", "600000"))
    opts = {"lease": 5.0}
    push = run_worker("push", mongo_uri, db.name, "q", tmp_path / "acked.txt",
                      "--start", "0", "--count", str(n), "--batch", "1000", options=opts)  # fmt: skip
    assert push.wait() == 0
    procs, outs = consumers(2, mongo_uri, db.name, "q", tmp_path, "--idle", "20", options=opts)
    for p in procs:
        assert p.wait() == 0
    consumed = ids(*outs)
    dups = sum(v - 1 for v in consumed.values() if v > 1)
    print(f"\nbacklog: N={n} committed={sum(consumed.values())} duplicates={dups}")
    assert set(consumed) == set(range(n)), "an item was lost"
    assert dups == 0, f"{dups} items were delivered twice with no consumer dying"
