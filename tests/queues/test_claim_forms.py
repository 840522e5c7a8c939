"""The two claim forms' pure parts (``core.claim_form``, ``candidate_request``,
``conditional_claim``) and, on the real server, the fence of a conditional claim: a
bucket changed since its candidate find, by any writer, is not claimed from the stale
read."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from bson import ObjectId

from bucketq import Queue
from bucketq.bucket import CLAIM_SORT
from bucketq.queue import _core as core
from fast_settings import FAST


def test_auto_picks_by_server_and_a_named_form_wins():
    assert core.claim_form("auto", {"version": "8.0.4"}) == "find_and_modify"
    assert core.claim_form("auto", {"version": "8.2.11", "secantusVersion": "0.7"}) == (
        "find_then_update"
    )
    for form in ("find_and_modify", "find_then_update"):
        assert core.claim_form(form, {"secantusVersion": "0.7"}) == form
        assert core.claim_form(form, {}) == form


def test_the_candidate_find_has_no_or_and_names_its_partition():
    now = time.time()
    assert "$or" not in core.candidate_request(now, 3)
    assert core.candidate_request(now, 3)["part"] == 3
    assert core.candidate_request(now, 0)["part"] is None
    assert "part" not in core.candidate_request(now, None)


def test_a_conditional_claim_requires_every_fence_field_as_read():
    doc = {"_id": ObjectId(), "n": 3, "live": 2, "done": b"\x01", "mature": 1, "lease": None}
    flt, upd = core.conditional_claim(doc, ObjectId(), "h:1", time.time(), 30.0)
    assert flt["_id"] == doc["_id"] and flt["lease"] is None
    for f in core.FENCE_FIELDS:
        assert f in flt and flt[f] == doc.get(f)  # missing: None, matched as missing
    assert "$or" not in flt
    assert upd["$inc"] == {"leases": 1} and "tok" in upd["$set"]["lease"]


#: Each kind of write to a stored bucket, done behind a reader's back.
CHANGES = {
    "claim": {
        "$set": {"lease": {"tok": ObjectId(), "owner": "x", "until": 0}},
        "$inc": {"leases": 1},
    },  # fmt: skip
    "remove": {"$inc": {"live": -1}, "$set": {"done": b"\x01"}},
    "rollback flush": {"$set": {"tries": {"0": 1}}},
    "release": {"$set": {"mature": datetime.now(UTC) - timedelta(seconds=1)}},
}


@pytest.mark.parametrize("writer", list(CHANGES))
def test_a_bucket_changed_since_the_find_is_not_claimed(db, writer):
    q = Queue(db, "q", bucket_max_size=2, **FAST)
    q.push_many([1, 2])
    q.flush()
    q.close()
    now = time.time()
    (doc,) = db.q.find(core.candidate_request(now, None), sort=CLAIM_SORT, limit=8)
    db.q.update_one({"_id": doc["_id"]}, CHANGES[writer])
    flt, upd = core.conditional_claim(doc, ObjectId(), "h:1", now, 30.0)
    assert db.q.update_one(flt, upd).matched_count == 0
    # Read again, it is claimed: the fence holds what was read, whatever it is.
    (fresh,) = db.q.find({"_id": doc["_id"]})
    flt, upd = core.conditional_claim(fresh, ObjectId(), "h:1", now, 30.0)
    assert db.q.update_one(flt, upd).matched_count == 1


def _docs(ids):
    return [{"_id": i} for i in ids]


def test_a_consumer_alone_takes_its_candidates_in_claim_order():
    c = core.Candidates()
    c.of(2)
    assert c.order() == CLAIM_SORT
    c.fill(_docs(range(8)))
    taken = []
    while c.of(2):
        taken.append(c.take()["_id"])
    assert taken == list(range(8))
    assert c.order() == CLAIM_SORT  # the next find: still in order
    c.fill(_docs(range(8, 10)))
    assert c.take()["_id"] == 8


def test_a_lost_race_drops_the_stale_list_and_reads_elsewhere_in_the_partition():
    c = core.Candidates()
    c.of(0)
    c.fill(_docs(range(8)))
    assert c.take()["_id"] == 0 and c.skip() == 0
    c.lost()  # another consumer took 0: it claims from the oldest on
    assert not c.of(0)  # this list is stale
    assert c.order() == core.NEWEST_FIRST == [("mature", -1), ("_id", -1)]
    assert c.skip() == 0
    c.fill(_docs(range(30, 22, -1)))  # the partition's newest 8, newest first
    assert [c.take()["_id"] for _ in range(3)] == [30, 29, 28]
    # it stays at the newest end while it is in this partition
    assert c.order() == core.NEWEST_FIRST
    c.fill(_docs(range(27, 19, -1)))
    assert c.take()["_id"] == 27
    c.lost()  # a third consumer: both ends are taken, it reads a window in the middle
    assert c.order() == CLAIM_SORT
    lo, hi = core.MIDDLE_SKIP
    skips = {c.skip() for _ in range(200)}
    assert min(skips) >= lo == core.CANDIDATES and max(skips) < hi and len(skips) > 1
    c.fill(_docs(range(12, 20)))
    c.take()
    c.lost()  # met someone there too: from the oldest again
    assert c.order() == CLAIM_SORT and c.skip() == 0


def test_a_short_find_goes_back_to_claim_order():
    # Fewer than CANDIDATES claimable: the partition is nearly empty, the ends meet anyway.
    c = core.Candidates()
    c.of(1)
    c.fill(_docs(range(8)))
    c.take()
    c.lost()
    assert c.order() == core.NEWEST_FIRST
    c.fill(_docs(range(3)))
    assert c.order() == CLAIM_SORT


def test_candidates_belong_to_one_partition():
    c = core.Candidates()
    c.of(1)
    c.fill(_docs(range(3)))
    c.take()
    c.lost()
    assert c.order() == core.NEWEST_FIRST
    assert not c.of(2)  # another partition: none, and claim order again
    assert c.order() == CLAIM_SORT
    c.fill(_docs(range(5)))
    assert c.take()["_id"] == 0
    assert c.of(2) and not c.of(1)
