"""Scenario 3: the server stops (SIGTERM or SIGKILL) and comes back on the same port and
data while a producer and a consumer process run; they recover by themselves."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from pymongo import MongoClient

from .conftest import FAST, read_lines, run_worker, stored_items

N = 3000


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
def test_producer_and_consumer_survive_a_server_restart(local_server, tmp_path, hard):
    uri = local_server.uri
    acked_f, consumed_f = tmp_path / "acked.txt", tmp_path / "consumed.txt"
    opts = {**FAST, "bucket_max_size": 50}
    prod = run_worker("push", uri, "bq", "q", acked_f, "--count", str(N), "--batch", "50", "--pause", "0.05",
                      options=opts)  # fmt: skip
    cons = run_worker("consume", uri, "bq", "q", consumed_f, "--idle", "8", options=opts)
    deadline = time.monotonic() + 60
    while len(read_lines(consumed_f)) < 300:  # both are well under way
        assert prod.poll() is None and cons.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    acked_at_stop = len(read_lines(acked_f))
    t0 = time.monotonic()
    local_server.restart(hard=hard)
    down = time.monotonic() - t0
    while len(read_lines(acked_f)) <= acked_at_stop:  # the producer is acknowledging again
        assert time.monotonic() - t0 < 90, "the producer did not recover"
        time.sleep(0.05)
    recovered = time.monotonic() - t0
    assert prod.wait(180) == 0
    assert cons.wait(180) == 0
    acked = Counter(int(r[0]) for r in read_lines(acked_f))
    consumed = Counter(int(r[0]) for r in read_lines(consumed_f))
    with MongoClient(uri) as client:
        left = stored_items(client["bq"]["q"])
    lost = set(acked) - set(consumed) - set(left)
    dups = sum(v - 1 for v in consumed.values() if v > 1)
    print(f"\nserver restart hard={hard}: down {down:.1f}s, producer acking again after {recovered:.1f}s; "
          f"acked={len(acked)} consumed={len(consumed)} lost={len(lost)} duplicates={dups} left={len(left)}")  # fmt: skip
    assert len(acked) == N
    assert not lost, f"{len(lost)} acknowledged items were lost"
    assert not left, "the run did not complete: items were left in the queue"
    assert set(consumed) <= set(range(N))
