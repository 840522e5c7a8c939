"""Two consumer processes working down a large backlog deliver every item once.

Behind ``-m soak`` (not in CI): with 600,000 items already stored, the embedded server's
claims scan the whole backlog and take longer than a short lease. A consumer counts its
lease from when its claim was sent, not from when it returned: otherwise a claim slower
than the lease would serve a bucket whose lease had already run out, and the other
consumer would take it over and deliver its items twice. tests/faults/test_slow_claim.py
shows the same deterministically with a failpoint; this is the load that shows it.
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
