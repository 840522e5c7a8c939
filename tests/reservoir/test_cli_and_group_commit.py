"""The ``bucketq dlq`` commands on real DLQs, and the bucketq transport's group commit."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from bucketq.errors import ConfigurationError
from bucketq.reservoir._policy import new_entry, shard_for

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bucketq.reservoir.cli", "dlq", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})  # fmt: skip


@pytest.mark.parametrize("name", ["redis", "bucketq"])
async def test_dlq_list_requeue_purge_from_the_command_line(backends, name, redis_url, mongo_uri):
    t = backends.transport(name)
    await t.start(2)
    await t.enqueue_many(
        1, [new_entry("log", "p", {"project_id": "p", "message": f"m{i}"}) for i in range(3)]
    )
    got = []
    for _ in range(40):
        got += await t.dequeue(1, 10, 0.3)
        if len(got) == 3:
            break
    for d in got:
        d.entry["attempts"] = 3
        d.entry["error"] = f"bad {d.entry['record']['message']}"
    await t.dead_letter(1, got)
    await t.stop()
    if name == "redis":
        where = ["--transport", "redis", "--redis-url", redis_url, "--prefix", t.prefix]
    else:
        where = ["--transport", "bucketq", "--mongodb-uri", mongo_uri, "--database", backends.db_name,
                 "--prefix", t.prefix]  # fmt: skip

    out = cli("list", *where, "--json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(r["reason"] for r in rows) == ["bad m0", "bad m1", "bad m2"]
    assert {r["shard"] for r in rows} == {1} and {r["attempts"] for r in rows} == {3}
    out = cli("inspect", *where)  # the old name still works, after one line naming the new
    assert out.stderr.strip() == ("bucketq dlq inspect: deprecated, use `bucketq dlq list` "
                                  "(the old name goes in a later release)")  # fmt: skip
    assert out.stdout.startswith("3 dead-lettered record(s)") and "reason: bad m1" in out.stdout

    # The requeue goes to the record's shard under today's configuration: 3 shards now.
    home = shard_for("p", 3)
    out = cli("requeue", *where, "--limit", "1", env={"RESERVOIR_BUFFER_SHARDS": "3"})
    assert out.returncode == 0 and "requeued 1 record" in out.stdout, out.stderr
    out = cli("purge", *where)
    assert "2 record(s) would be purged" in out.stdout
    out = cli("purge", *where, "--yes")
    assert "purged 2 record(s)" in out.stdout, out.stderr

    t2 = backends.transport(name)
    await t2.start(3)
    assert await t2.dlq_size() == 0
    back = []
    for _ in range(40):
        back += await t2.dequeue(home, 10, 0.3)
        if back:
            break
    assert len(back) == 1 and back[0].entry["attempts"] == 0 and back[0].entry["error"] is None
    await t2.ack(home, back)
    await t2.stop()


def test_cli_without_a_transport_says_what_to_pass():
    out = cli("list", "--transport", "redis", "--redis-url", "")
    assert out.returncode == 1 and "REDIS_URL" in out.stderr


async def test_bucketq_enqueue_is_durable_on_return_and_concurrent_requests_share_inserts(
    backends, mongo_client
):
    t = backends.transport("bucketq")
    await t.start(1)
    requests = 20
    await asyncio.gather(*(
        t.enqueue_many(0, [new_entry("log", "p", {"project_id": "p", "message": f"r{r}-{i}"}) for i in range(5)])
        for r in range(requests)
    ))  # fmt: skip
    # Durable on return: the bucket documents are already in MongoDB.
    col = mongo_client[backends.db_name][t.queue_name(0)]
    docs = list(col.find({}, {"n": 1}))
    assert sum(d["n"] for d in docs) == 5 * requests
    written = t.queues[0].stats()["buckets_written"]
    print(
        f"\n[group commit] {requests} concurrent enqueues of 5 records -> {written} bucket insert(s)"
    )
    assert written < requests
    await t.stop()


def test_commit_slots_write_at_once_when_idle_and_share_one_slot_per_window():
    from bucketq.reservoir import BucketqTransport
    from bucketq.reservoir._bucketq import CommitSlots

    slots = CommitSlots(0.010)
    assert slots.begin(0, 100.000) == 0  # idle: written at once
    assert slots.begin(0, 100.004) == pytest.approx(0.006)  # one pending: the next slot
    assert slots.begin(0, 100.008) == pytest.approx(0.002)  # joins that slot
    assert slots.begin(1, 100.008) == 0  # another shard queue has its own slots
    assert slots.begin(0, 100.012) == pytest.approx(0.008)  # the slot began: the one after
    assert slots.begin(0, 100.031) == 0  # a window after the last slot: at once
    for _ in range(5):
        slots.end(0)
    # Nothing pending, but the last slot began less than half a window ago: the next one.
    assert slots.begin(0, 100.033) == pytest.approx(0.008)
    slots.end(0)
    assert slots.begin(0, 100.047) == 0  # idle: at once
    slots.end(0)
    zero = CommitSlots(0)
    assert [zero.begin(0, 100 + i / 1000) for i in range(5)] == [0] * 5
    for bad in (2, -0.1, float("nan"), True):
        with pytest.raises(
            ConfigurationError, match="commit_window must be a finite number from 0 to 1"
        ):
            BucketqTransport(None, commit_window=bad)
