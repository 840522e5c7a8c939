"""A claim that reaches the server late: the lease it writes is counted from the moment
the claim was sent, so a consumer whose claim took longer than the lease must not serve
the bucket before it has renewed the lease, and loses it if another consumer took over."""

from __future__ import annotations

import threading
import time

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from bucketq import Queue
from fast_settings import FAST_FAULTS
from waiting import eventually

LEASE = 1.0
BLOCK_MS = 1500  # the slow consumer's claim waits this long at the server: past its lease


def _slow_consumer(db, mongo_uri, mongo_client, request, app: str, *, block_ms: int = BLOCK_MS,
                   commands: tuple[str, ...] = ("findAndModify",), times: int = 0) -> Queue:  # fmt: skip
    """10 items in one bucket, and a consumer whose first ``times`` (default: one per name)
    commands named in ``commands`` wait ``block_ms`` at the server: a failCommand
    failpoint on its client's appName."""
    q = Queue(db, "q", bucket_max_size=10, **FAST_FAULTS)
    for i in range(10):
        q.push({"i": i})
    q.close()
    client: MongoClient = MongoClient(mongo_uri, appname=app)
    request.addfinalizer(client.close)
    try:
        mongo_client.admin.command(
            "configureFailPoint",
            "failCommand",
            mode={"times": times or len(commands)},
            data={
                "failCommands": list(commands),
                "appName": app,
                "blockConnection": True,
                "blockTimeMS": block_ms,
            },
        )
    except OperationFailure as exc:  # a server given by URI, started without test commands
        pytest.skip(f"the server has no failpoints (start it with enableTestCommands): {exc}")
    slow = Queue(client[db.name], "q", **{**FAST_FAULTS, "lease": LEASE, "prefetch": 0})
    request.addfinalizer(slow.close)
    return slow


def test_a_claim_that_outlives_its_lease_serves_nothing_another_consumer_holds(
    db, mongo_uri, mongo_client, request
):
    # Its renewal is held up too, so the other consumer's claim surely comes first.
    slow = _slow_consumer(
        db, mongo_uri, mongo_client, request, "slow-claim", commands=("findAndModify", "update")
    )
    assert slow.reserve(timeout=0.05) is None  # starts its fetcher; the claim is blocked
    eventually(lambda: slow.stats()["claims"], timeout=10, interval=0.01, what="the blocked claim")

    # The slow consumer now holds the bucket in memory, but the lease it wrote ran out
    # while its claim waited: another consumer takes the bucket over.
    other = Queue(db, "q", **{**FAST_FAULTS, "lease": 30.0, "prefetch": 0})
    request.addfinalizer(other.close)
    got = other.reserve_many(10, timeout=5)
    assert sorted(m.payload["i"] for m in got) == list(range(10))
    assert other.stats()["takeovers"] == 1

    # Its held-up renewal (BLOCK_MS) finds the bucket taken: a lease loss. Until then
    # and after, it serves nothing.
    served: list[int] = []

    def lost() -> bool:
        served.extend(m.payload["i"] for m in slow.reserve_many(10, timeout=0.05))
        return slow.stats()["lease_losses"] > 0

    eventually(lost, timeout=BLOCK_MS / 1000 + 10, interval=0, what="the lease loss")
    served.extend(m.payload["i"] for m in slow.reserve_many(10, timeout=0.2))
    assert served == [], f"items {served} were served by two consumers at once"
    assert slow.stats()["lease_losses"] == 1
    assert other.commit_many(got) == 10
    other.close()
    assert db["q"].count_documents({}) == 0


def test_a_late_claim_renews_its_lease_before_serving(db, mongo_uri, mongo_client, request):
    """Nobody else took the bucket: the slow consumer renews and serves every item once."""
    slow = _slow_consumer(db, mongo_uri, mongo_client, request, "slow-claim-2")
    got = slow.reserve_many(10, timeout=10)
    while len(got) < 10 and (more := slow.reserve_many(10 - len(got), timeout=5)):
        got += more
    assert sorted(m.payload["i"] for m in got) == list(range(10))
    assert slow.stats()["lease_losses"] == 0
    assert slow.commit_many(got) == 10
    slow.close()
    assert db["q"].count_documents({}) == 0


def test_a_claim_that_comes_back_with_little_lease_left_renews_before_serving(
    db, mongo_uri, mongo_client, request
):
    """The claim returns with a fifth of its lease left, and the renewal is slow too.
    Serving at once would hand out items whose commits cannot be flushed before the lease
    runs out; the consumer that takes the bucket over then serves them again."""
    block = LEASE * 0.8
    # Three: the claim, the renewal, and the claim that follows if the bucket is served
    # at once (which would otherwise take the second and let the renewal through).
    slow = _slow_consumer(db, mongo_uri, mongo_client, request, "slow-claim-3",
                          block_ms=int(block * 1000), commands=("findAndModify", "update"), times=3)  # fmt: skip
    served: list[int] = []
    t = threading.Thread(
        target=lambda: served.extend(m.payload["i"] for m in slow.reserve_many(10, timeout=3))
    )
    t.start()
    eventually(lambda: slow.stats()["claims"], timeout=10, interval=0.005, what="the blocked claim")
    # The claim was sent ~block ago, so its lease runs out in ~LEASE - block; the
    # renewal, held up for block, lands after that. Claim in between.
    time.sleep((LEASE - block) + (block - (LEASE - block)) / 3)
    other = Queue(db, "q", **{**FAST_FAULTS, "lease": 30.0, "prefetch": 0})
    request.addfinalizer(other.close)
    got = other.reserve_many(10, timeout=5)
    t.join()
    both = set(served) & {m.payload["i"] for m in got}
    assert not both, f"items {sorted(both)} were served by two consumers at once"
    assert sorted(served + [m.payload["i"] for m in got]) == list(range(10))
    assert other.commit_many(got) == len(got)
