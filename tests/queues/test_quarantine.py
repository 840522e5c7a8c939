"""A damaged bucket among good ones: it is set aside (kept, listed, counted, logged),
every good item is still delivered, and what can be recovered can be re-queued."""

from __future__ import annotations

import logging
import time

import bson
import pytest

from bucketq import Queue
from bucketq.bucket.codec import decode_items, encode_item
from bucketq.cli import main as cli_main
from queue_kinds import consume, resolve


async def listed_soon(q, deadline: float = 30.0) -> list:
    """The quarantine list once it is not empty (a consumer claims the damaged bucket
    when it gets to it)."""
    end = time.monotonic() + deadline
    while not (rows := await resolve(q.quarantined())) and time.monotonic() < end:
        await resolve(q.reserve(timeout=0.2))
    return rows


def write_buckets(db, name: str, per_bucket: int, count: int) -> list:
    """``count`` good buckets of ``per_bucket`` items, written by a queue; their ids."""
    q = Queue(db, name, bucket_max_size=per_bucket, bucket_max_wait=30)
    q.push_many([{"i": i} for i in range(per_bucket * count)])
    q.close()
    return [d["_id"] for d in db[name].find({}, {"_id": 1}).sort("_id", 1)]


DAMAGE = {
    "undecodable": lambda d: {"$set": {"items": b"\x05\x00\x00\x00garbage"}},
    "count": lambda d: {"$set": {"n": d["n"] + 3, "live": d["n"] + 3}},
    "missing": lambda d: {"$unset": {"items": ""}},
    "ill-typed": lambda d: {"$set": {"tries": "seven"}},
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
async def test_a_damaged_bucket_is_set_aside_and_the_good_items_flow(bucket_flavour, how, caplog):
    db = bucket_flavour.sync_db
    ids = write_buckets(db, "q", 100, 3)
    first = db.q.find_one({"_id": ids[0]})
    db.q.update_one({"_id": ids[0]}, DAMAGE[how](first))

    q = bucket_flavour.open("q")
    with caplog.at_level(logging.ERROR, logger="bucketq.queue"):
        got = await consume(q, 200)
    assert sorted(p["i"] for p in got) == list(range(100, 300))
    assert q.stats()["quarantined"] == 1
    assert any(str(ids[0]) in r.getMessage() for r in caplog.records)

    # Kept, not deleted: gone from the queue, listed in the quarantine.
    assert db.q.find_one({"_id": ids[0]}) is None
    listed = await listed_soon(q)
    assert [e["id"] for e in listed] == [str(ids[0])]
    assert listed[0]["reason"] and listed[0]["source"] == "q"
    assert db["q.quarantine"].find_one({"_id": ids[0]})["bucket"]["_id"] == ids[0]
    await resolve(q.flush())
    assert await resolve(q.total_size()) == 0

    if how in ("count", "ill-typed"):
        # Every item still decodes: re-queued in full, and the record leaves the quarantine.
        report = await resolve(q.requeue_quarantined())
        assert report == {"buckets": 1, "items": 100, "lost": 0 if how == "ill-typed" else 3,
                          "kept": 0 if how == "ill-typed" else 1}  # fmt: skip
        again = await consume(q, 100)
        assert sorted(p["i"] for p in again) == list(range(100))
    else:
        report = await resolve(q.requeue_quarantined())
        assert report["items"] == 0 and report["kept"] == 1
    left = await resolve(q.quarantined())
    assert len(left) == (0 if how == "ill-typed" else 1)
    assert await resolve(q.remove_quarantined()) == len(left)
    assert await resolve(q.quarantined()) == []


async def test_a_truncated_bucket_gives_back_the_items_before_the_damage(bucket_flavour):
    """Items committed before the damage are not re-queued; the readable ones are,
    once (a second requeue finds nothing more to do); the record stays until removed."""
    db = bucket_flavour.sync_db
    ids = write_buckets(db, "q", 10, 2)
    doc = db.q.find_one({"_id": ids[1]})
    blob = doc["items"]
    sizes = [len(encode_item(it["p"])) for it in decode_items(blob)]
    cut = sum(sizes[:6]) + 3  # items 0-5 whole, item 6 broken
    done = bytes([0b00000011, 0])  # items 0 and 1 were committed already
    db.q.update_one({"_id": ids[1]}, {"$set": {"items": blob[:cut], "done": done, "live": 8}})
    q = bucket_flavour.open("q")
    got = await consume(q, 10)
    assert sorted(p["i"] for p in got) == list(range(10))
    [entry] = await listed_soon(q)
    assert (entry["recoverable"], entry["lost"]) == (4, 4)

    report = await resolve(q.requeue_quarantined(entry["id"]))
    assert report == {"buckets": 1, "items": 4, "lost": 4, "kept": 1}
    again = await consume(q, 4)
    assert sorted(p["i"] for p in again) == [12, 13, 14, 15]
    assert (await resolve(q.requeue_quarantined()))["buckets"] == 0  # done once
    assert (await resolve(q.quarantined()))[0]["requeued"] == 4
    assert await resolve(q.remove_quarantined(entry["id"])) == 1


def test_the_quarantine_command_lists_requeues_and_purges(db, mongo_uri, capsys):
    ids = write_buckets(db, "cq", 5, 2)
    db.cq.update_one({"_id": ids[0]}, {"$set": {"tries": {"x": "y"}}})
    q = Queue(db, "cq", poll_interval=0.2)
    assert len(consume_sync(q, 5)) == 5
    q.close()
    common = ["--mongodb-uri", mongo_uri, "--database", db.name, "--queue", "cq"]
    capsys.readouterr()
    assert cli_main(["quarantine", "list", *common]) == 0
    out = capsys.readouterr().out
    assert str(ids[0]) in out and "tries" in out
    assert cli_main(["quarantine", "requeue", *common]) == 0
    assert "5 items" in capsys.readouterr().out
    assert db["cq.quarantine"].count_documents({}) == 0
    assert db.cq.count_documents({}) == 1
    # A damaged one again, purged this time.
    db.cq.update_one({}, {"$set": {"items": b"\x00"}})
    q = Queue(db, "cq", poll_interval=0.2)
    assert consume_sync(q, 1, deadline=3.0) == []
    q.close()
    assert db["cq.quarantine"].count_documents({}) == 1
    assert cli_main(["quarantine", "purge", "--id", str(ids[0]), *common]) == 0
    assert "purged 0" in capsys.readouterr().out  # re-queued in full before: gone already
    assert db["cq.quarantine"].count_documents({}) == 1
    assert cli_main(["quarantine", "remove", *common]) == 0  # the old name still works
    out = capsys.readouterr()
    assert "purged 1" in out.out and "use `bucketq quarantine purge`" in out.err
    assert db["cq.quarantine"].count_documents({}) == 0
    assert cli_main(["quarantine", "list", *common]) == 0
    assert "no quarantined buckets" in capsys.readouterr().out


def consume_sync(q, want: int, deadline: float = 60.0) -> list:
    got = []
    end = time.monotonic() + deadline
    while len(got) < want and time.monotonic() < end:
        msg = q.reserve(timeout=0.5)
        if msg is not None:
            q.commit(msg)
            got.append(msg.payload)
    return got


def test_bson_damage_is_not_a_payload_error():
    """A damaged item binary is a DecodeError, never mistaken for a bad push."""
    from bucketq.errors import DecodeError, PayloadError

    with pytest.raises(DecodeError) as err:
        decode_items(bson.encode({"p": 1})[:-2])
    assert not isinstance(err.value, PayloadError)
