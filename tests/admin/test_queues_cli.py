"""``bucketq queues`` and the ``Inspector`` behind it, against a real server: the counts
a user checks against what they pushed, peek that reserves nothing, dead letters put
back in their queue or purged, and the refusals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bucketq.admin import AsyncInspector, Inspector
from bucketq.cli import main
from bucketq.queue import AsyncQueue, Queue
from bucketq.stream import StreamQueue
from fast_settings import FAST
from waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


def cli(capsys, mongo_uri: str, db, *args: str) -> tuple[int, str]:
    code = main(["queues", *args, "--mongodb-uri", mongo_uri, "--database", db.name])
    return code, capsys.readouterr().out


def dead_letters(db, name: str, n: int) -> Queue:
    """A queue ``name`` with ``n`` items moved to its dead-letter queue (max_tries=1)."""
    q = Queue(db, name, max_tries=1, **FAST)
    q.push_many([{"job": i} for i in range(n)], headers={"origin": "test"})
    q.flush()
    for _ in range(n):
        m = q.reserve(timeout=10)
        assert m is not None
        q.rollback(m)
    eventually(lambda: q.stats()["dead_lettered"] == n, 30, what="items dead-lettered")
    q.flush()
    return q


def test_list_counts_ready_scheduled_leased_dead_and_streams(db, mongo_uri, capsys):
    dead_letters(db, "jobs", 2).close()
    q = Queue(db, "jobs", **FAST)  # pushes only: nothing here claims
    # partitioned: its objects take member numbers in bucketq.members, not a queue
    held = Queue(db, "held", **{**FAST, "lease": 60, "partitions": 2})
    try:
        q.push_many(range(5))
        q.push("later", delay=3600)
        q.flush()
        held.push_many(range(3), durable=True)
        assert held.reserve(timeout=10) is not None
        s = StreamQueue(db, "events")
        s.push_many([{"e": i} for i in range(4)], durable=True)
        s.close()

        code, out = cli(capsys, mongo_uri, db, "list", "--json")
        assert code == 0
        rows = {r["name"]: r for r in json.loads(out)}
        assert "bucketq.members" in db.list_collection_names()
        assert set(rows) == {"jobs", "held", "events"}  # jobs.dlq is jobs' dead column
        assert (rows["jobs"]["ready"], rows["jobs"]["scheduled"], rows["jobs"]["dead"]) == (5, 1, 2)
        assert rows["jobs"]["next_mature"] is not None
        assert rows["held"]["leased"] == 3 and rows["held"]["ready"] == 0
        assert len(rows["held"]["consumers"]) == 1
        assert rows["events"]["kind"] == "stream"
        assert (rows["events"]["ready"], rows["events"]["lag"]) == (4, 1)

        code, out = cli(capsys, mongo_uri, db, "list")
        assert code == 0
        head, *body = (re.split(r"\s{2,}", line.strip()) for line in out.splitlines())
        assert head == ["NAME", "KIND", "READY", "SCHEDULED", "LEASED", "DEAD", "QUARANTINED",
                        "LAG", "OLDEST READY", "NEXT MATURE", "CONSUMERS"]  # fmt: skip
        table = {row[0]: dict(zip(head, row, strict=True)) for row in body}
        assert table["events"]["KIND"] == "stream"
        assert table["jobs"]["READY"] == "5" and table["jobs"]["DEAD"] == "2"
        assert re.fullmatch(r"\d+\.\d s", table["jobs"]["OLDEST READY"])
    finally:
        held.close()
        q.close()


def test_peek_shows_items_without_reserving_them(db, mongo_uri, capsys):
    q = Queue(db, "jobs", **FAST)
    try:
        q.push({"big": "x" * 1000}, headers={"trace": "t1"})
        q.push_many([1, 2])
        q.flush()
        before = list(db.jobs.find({}, {"lease": 1, "leases": 1}))
        code, out = cli(capsys, mongo_uri, db, "peek", "jobs", "--n", "2", "--json")
        assert code == 0
        items = json.loads(out)
        assert len(items) == 2
        assert items[0]["headers"] == {"trace": "t1"}
        assert len(items[0]["payload"]) <= 200 and items[0]["payload"].endswith("…")
        assert items[0]["tries"] == 0
        assert list(db.jobs.find({}, {"lease": 1, "leases": 1})) == before
        assert q.size() == 3
    finally:
        q.close()


def test_requeue_one_dead_letter_puts_it_back_with_its_headers(db, mongo_uri, capsys):
    q = dead_letters(db, "jobs", 2)
    q.close()
    code, out = cli(capsys, mongo_uri, db, "dead", "jobs", "--json")
    dead = json.loads(out)
    assert code == 0 and len(dead) == 2
    assert dead[0]["headers"]["x-source-queue"] == "jobs"
    # the tries it had in jobs (max_tries=1), as its headers say, not the dead-letter queue's
    assert [(d["tries"], d["headers"]["x-tries"]) for d in dead] == [(1, 1), (1, 1)]
    code, out = cli(capsys, mongo_uri, db, "dead", "jobs")
    assert out.count("  tries=1  ") == 2 and "tries=0" not in out
    one = dead[0]["id"]
    code, out = cli(
        capsys, mongo_uri, db, "dead", "jobs", "requeue", "--id", one, "--yes", "--json"
    )
    assert code == 0 and json.loads(out)["items"] == 1
    # Back in jobs, once, with its own headers and no tries; the other stays dead.
    q = Queue(db, "jobs", **FAST)
    try:
        m = q.reserve(timeout=10)
        assert m is not None and m.payload == {"job": 0} and m.tries == 0
        assert db.jobs.find_one() is not None
        assert [x.id for x in Inspector(db).dead("jobs")] == [dead[1]["id"]]
        got = Inspector(db).peek("jobs")
        assert got[0].headers == {"origin": "test"}
    finally:
        q.close()
    code, out = cli(capsys, mongo_uri, db, "dead", "jobs", "purge", "--yes")
    assert code == 0 and "purged 1" in out
    assert Inspector(db).dead("jobs") == [] and db["jobs.dlq"].count_documents({}) == 0


def test_a_dead_letter_bucket_a_consumer_holds_is_skipped(db, mongo_uri, capsys):
    dead_letters(db, "jobs", 1).close()
    dlq = Queue(db, "jobs.dlq", **{**FAST, "lease": 60})
    try:
        assert dlq.reserve(timeout=10) is not None
        code, out = cli(capsys, mongo_uri, db, "dead", "jobs", "requeue", "--yes", "--json")
        assert code == 1 and json.loads(out) == {"items": 0, "buckets": 0, "busy": 1, "missing": 0}
        assert db.jobs.count_documents({}) == 0
    finally:
        dlq.close()


def test_requeue_asks_first_and_refuses_without_a_terminal(db, mongo_uri):
    dead_letters(db, "jobs", 1).close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-m", "bucketq", "queues", "dead", "jobs", "requeue",
         "--mongodb-uri", mongo_uri, "--database", db.name],
        env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 2 and "--yes" in res.stderr
    assert len(Inspector(db).dead("jobs")) == 1


def test_no_mongodb_is_one_line_that_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BUCKETQ_MONGODB_URI", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # no running embedded store's URI file
    assert main(["queues", "list"]) == 1
    err = capsys.readouterr().err
    assert "--mongodb-uri" in err and "bucketq store" in err and "Traceback" not in err


def test_bad_names_and_counts_are_refused(db, mongo_uri, capsys):
    with pytest.raises(SystemExit):
        main(["queues", "peek", "jobs", "--n", "0", "--mongodb-uri", mongo_uri])
    assert main(["queues", "peek", "a$b", "--mongodb-uri", mongo_uri, "--database", db.name]) == 1
    assert main(["queues", "dead", "jobs", "requeue", "--id", "nope", "--yes",
                 "--mongodb-uri", mongo_uri, "--database", db.name]) == 1  # fmt: skip
    assert "error" in capsys.readouterr().err


async def test_the_async_inspector_agrees(adb):
    q = AsyncQueue(adb, "jobs", **FAST)
    try:
        await q.push_many(range(3))
        await q.flush()
        rows = await AsyncInspector(adb).queues()
        assert [(r.name, r.ready) for r in rows] == [("jobs", 3)]
        assert rows[0].oldest_ready_s is not None and rows[0].next_mature is None
        assert datetime.now(UTC) >= (await AsyncInspector(adb).peek("jobs", 1))[0].mature  # type: ignore[operator]
    finally:
        await q.close()


def test_watch_prints_a_table_per_refresh_with_rates(db, mongo_uri, capsys):
    with Queue(db, "jobs", **FAST) as q:
        q.push_many(range(3), durable=True)
    code, out = cli(capsys, mongo_uri, db, "watch", "--json", "--count", "2", "--interval", "0.2")
    assert code == 0
    frames = [json.loads(line) for line in out.splitlines()]
    assert len(frames) == 2
    assert [(r["name"], r["ready"], r["rates"]["total"]) for r in frames[1]["queues"]] == [
        ("jobs", 3, 0.0)
    ]


def test_rates_and_watch_settings():
    from bucketq.admin import QueueRow, Rates
    from bucketq.admin._core import classify
    from bucketq.admin.watch import parse_watch

    old, new = QueueRow("q", "queue", ready=10), QueueRow("q", "queue", ready=4, leased=2)
    assert Rates.between(old, new, 2.0) == Rates(total=-2.0, ready=-3.0, dead=0.0)
    assert Rates.between(None, new, 1.0) == Rates()
    assert (
        parse_watch("*") is None and parse_watch("") == [] and parse_watch(" a, b ,") == ["a", "b"]
    )
    assert classify(
        ["jobs", "jobs.dlq", "jobs.quarantine", "ev", "ev.meta", "orphan.dlq", "system.x"]
    ) == (
        ["jobs", "orphan.dlq"],
        ["ev"],
    )


def test_a_damaged_bucket_is_shown_not_fatal(db, mongo_uri, capsys):
    with Queue(db, "jobs", **FAST) as q:
        q.push_many(range(2), durable=True)
    from bson import ObjectId

    from bucketq.bucket import to_datetime

    db.jobs.insert_one({"_id": ObjectId(), "mature": to_datetime(0), "n": 3, "live": 3,
                        "items": b"\x05\x00\x00\x00garbage", "leases": 0, "lease": None})  # fmt: skip
    code, out = cli(capsys, mongo_uri, db, "peek", "jobs", "--json")
    assert code == 0
    views = json.loads(out)
    assert views[0]["payload"].startswith("<damaged bucket") and len(views) == 3
    code, out = cli(capsys, mongo_uri, db, "list", "--json")
    assert code == 0 and json.loads(out)[0]["ready"] == 5  # counted as stored, per bucket
