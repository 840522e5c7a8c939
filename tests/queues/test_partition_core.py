"""Property tests of the partition decisions in the pure core: which partition a key or
a producer's id goes to, the partition a consumer claims in next, the probe's reads and the
map read's counts, the claim's
partition term, packing by partition, folding partitions a queue no longer has, and the
option's checks."""

from __future__ import annotations

import pytest
from bson import ObjectId
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketq.bucket import member_id, member_partition, partition_of
from bucketq.bucket.codec import encode_item
from bucketq.bucket.options import MAX_PARTITIONS, QueueOptions
from bucketq.bucket.packing import OpenBucket, Packer
from bucketq.errors import ConfigurationError
from bucketq.queue._core.claims import (
    PROBE_SORT,
    Rotation,
    candidate_request,
    claim_request,
    map_pipeline,
    mapped_counts,
    part_filter,
    partition_of_document,
    partitions_to_fold,
    probe_done,
    probe_requests,
)

NOW = 1_700_000_000.0
keys = st.one_of(st.text(max_size=40), st.binary(max_size=40), st.integers(0, 10**12))
parts = st.integers(min_value=1, max_value=MAX_PARTITIONS)


@given(keys, parts)
def test_a_key_has_one_partition_in_range(key, k):
    p = partition_of(key, k)
    assert 0 <= p < k
    assert partition_of(key, k) == p  # the same every time
    if k == 1:
        assert p == 0


@given(st.integers(0, 10**12), parts)
def test_a_whole_number_key_picks_its_partition(key, k):
    assert partition_of(key, k) == key % k


def test_a_text_key_hashes_the_same_in_every_process():
    # Pinned values: a process (or Python version) that hashed differently would put
    # one tenant's items in two partitions.
    assert [partition_of(f"tenant-{i}", 8) for i in range(6)] == [2, 3, 5, 4, 4, 6]
    assert partition_of(b"tenant-0", 8) == partition_of("tenant-0", 8)


def test_producer_ids_spread_over_the_partitions():
    # 200 queue objects' ids over 4 partitions: each partition gets producers (a hash
    # that lumped them would leave partitions without any; the chance that a fair one
    # leaves one empty is 4 x 0.75^200, about 1e-25).
    counts = [0] * 4
    for _ in range(200):
        counts[partition_of(member_id("host:123"), 4)] += 1
    assert min(counts) > 0


@settings(deadline=None, max_examples=60)
@given(
    parts.filter(lambda k: k <= 64),
    st.integers(0, 10**6),
    st.integers(1, 10),
    st.integers(1, 200),
)
def test_a_rotation_stays_where_buckets_are_then_moves_on(k, start, stay, claims):
    rot = Rotation(start, k, stay)
    assert rot.next == start % k
    for i in range(claims):
        part = rot.next
        rot.found(part)
        if (i + 1) % stay == 0:
            assert rot.next == (part + 1) % k  # at most ``stay`` in a row
        else:
            assert rot.next == part  # stays where the buckets are


@settings(deadline=None, max_examples=60)
@given(st.integers(1, 64), st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 10))
def test_a_consumer_claims_next_where_a_read_saw_a_bucket(k, start, seen, stay):
    rot = Rotation(start, k, stay)
    rot.start_at(seen)
    assert rot.next == seen % k
    for _ in range(stay - 1):
        rot.found(seen % k)
    assert rot.next == seen % k  # a count of its own there: ``stay`` claims
    rot.found(seen % k)
    assert rot.next == (seen + 1) % k


def test_the_map_read_counts_claimable_buckets_of_every_partition():
    match, group = map_pipeline(NOW)
    assert match == {"$match": candidate_request(NOW, None)}  # any partition, no $or
    # a $group, not distinct(): distinct leaves out partition 0 (no field), and a
    # consumer would wait idle beside partition 0's buckets
    assert group == {"$group": {"_id": "$part", "n": {"$sum": 1}}}
    assert mapped_counts([{"_id": None, "n": 3}, {"_id": 2, "n": 5}]) == {0: 3, 2: 5}
    assert mapped_counts([]) == {}


@settings(deadline=None, max_examples=60)
@given(
    st.integers(2, 64),
    st.dictionaries(st.integers(0, 63), st.integers(0, 50), max_size=10),
    st.integers(0, 10**6),
)
def test_a_consumer_picks_only_partitions_the_map_counts_buckets_in(k, counts, start):
    rot = Rotation(start, k)
    assert rot.pick() is None  # no map yet
    rot.mapped(counts)
    have = {p % k for p, n in counts.items() if n > 0}
    picked = {rot.pick() for _ in range(50)}
    if have:
        assert picked <= have
    else:
        assert picked == {None}
    for p in list(have):  # each claim there found nothing
        rot.dry(p)
    assert rot.pick() is None


def test_picks_follow_the_backlog():
    # 900 claimable buckets in partition 1, 100 in 2: consumers leaving a partition
    # at once spread in that proportion, not all to the first one named.
    rot = Rotation(0, 4)
    rot.mapped({1: 900, 2: 100})
    picks = [rot.pick() for _ in range(2000)]
    assert 0.8 < picks.count(1) / len(picks) < 0.97
    assert picks.count(2) > 0


@given(st.integers(2, 64), st.integers(0, 63), st.integers(1, 10))
def test_after_its_stay_a_consumer_moves_to_the_next_partition_the_map_knows(k, part, stay):
    part %= k
    rot = Rotation(part, k, stay)
    rot.mapped({part: 10, (part + k // 2) % k: 10})
    for _ in range(stay):
        rot.found(part)
    other = (part + k // 2) % k
    assert rot.next == (other if other != part else (part + 1) % k)


@given(st.integers(0, 64))
def test_the_probe_looks_from_the_consumers_own_place_then_from_the_start(start):
    reqs = probe_requests(NOW, start)
    assert reqs[0] == candidate_request(NOW, None)  # first: any partition, from 0
    if start:
        assert reqs[1] == {**candidate_request(NOW, None), "part": {"$gte": start}}
    else:
        assert len(reqs) == 1
    # the first read answers when it finds nothing or a partition from ``start`` on
    assert probe_done(None, start) and probe_done(start, start) and probe_done(start + 1, start)
    if start:
        assert not probe_done(start - 1, start)  # one before: read again from ``start``
    assert PROBE_SORT[0] == ("part", 1)  # partition order, not the oldest bucket
    assert all("$or" not in r for r in reqs)  # the embedded server scans for a $or


def test_the_partition_of_a_stored_bucket():
    assert partition_of_document({}) == 0
    assert partition_of_document({"part": None}) == 0
    assert partition_of_document({"part": 5}) == 5
    # the probe's last read has no partition term: it is not a claim
    assert "part" not in probe_requests(NOW, 0)[0]
    flt, _ = claim_request(NOW, ObjectId(), "me", 30.0)
    assert "part" not in flt


@given(st.integers(1, 64), st.integers(1, 10))
def test_a_consumer_visits_every_partition_while_all_have_buckets(k, stay):
    rot = Rotation(0, k, stay)
    seen = set()
    for _ in range(k * stay):
        p = rot.next
        seen.add(p)
        rot.found(p)
    assert seen == set(range(k))


@settings(deadline=None, max_examples=60)
@given(st.integers(2, 64), st.integers(2, 64), st.integers(1, 10))
def test_consumers_that_start_apart_claim_apart(k, consumers, stay):
    # Consumers that each find a bucket at every claim stay on distinct partitions
    # when they start on distinct ones.
    n = min(k, consumers)
    rots = [Rotation(i, k, stay) for i in range(n)]
    for _ in range(3 * k * stay):
        at = [r.next for r in rots]
        assert len(set(at)) == n
        for r, p in zip(rots, at, strict=True):
            r.found(p)


@given(st.integers(0, MAX_PARTITIONS - 1))
def test_a_bucket_matches_the_claim_of_its_partition_only(part):
    ob = OpenBucket(None, NOW, None, part)
    ob.items = [encode_item("x")]
    doc = ob.document()
    flt = part_filter(part)
    # Equality on the field ({"part": None} matches a missing field).
    assert list(flt) == ["part"]
    assert doc.get("part") == flt["part"]
    if part == 0:
        assert "part" not in doc  # partition 0: today's document layout
    other = part_filter(part + 1)
    assert doc.get("part") != other["part"]
    assert part_filter(None) == {}
    flt, _ = claim_request(NOW, ob.id, "me", 30.0, part)
    assert flt["part"] == (part or None)
    flt, _ = claim_request(NOW, ob.id, "me", 30.0)
    assert "part" not in flt


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 2.5])), max_size=200),
    st.integers(1, 20),
)
def test_the_packer_keeps_partitions_apart(specs, max_size):
    opts = QueueOptions(bucket_max_size=max_size, partitions=6)
    packer = Packer(opts, object)
    placed = []
    sealed: list[OpenBucket] = []
    for n, (part, delay) in enumerate(specs):
        ob, index, out = packer.add(encode_item(n), NOW + delay, NOW, part)
        sealed.extend(out)
        placed.append((n, part, ob, index))
    buckets = sealed + packer.take_all()
    for n, part, ob, index in placed:
        assert ob in buckets and ob.part == part
        assert ob.items[index] == encode_item(n)
    assert sum(len(b) for b in buckets) == len(specs)
    for b in buckets:
        assert len(b) <= max_size


@given(st.lists(st.one_of(st.integers(0, 100), st.none(), st.text(max_size=2))), st.integers(1, 40))
def test_folding_moves_every_partition_out_of_range_into_it(found, k):
    moves = partitions_to_fold(found, k)
    for old, new in moves.items():
        assert old >= k
        assert new is None or 0 < new < k
        assert (new or 0) == old % k
    assert set(moves) == {p for p in found if isinstance(p, int) and p >= k}


@pytest.mark.parametrize(
    "value, says",
    [(0, "from 1 to 4096"), (MAX_PARTITIONS + 1, "from 1 to 4096"), ("4", "whole number"),
     (True, "whole number"), (2.0, "whole number")],
)  # fmt: skip
def test_partitions_is_checked_with_a_clear_error(value, says):
    with pytest.raises(ConfigurationError) as err:
        QueueOptions(partitions=value)
    assert "partitions" in str(err.value) and says in str(err.value)


def test_member_numbers_spread_over_partitions_and_a_bad_count_numbers_nothing():
    # $inc left n = 1, 2, ...: members 0, 1, ... take partitions in turn
    assert [member_partition({"n": n}, 4) for n in range(1, 7)] == [0, 1, 2, 3, 0, 1]
    for bad in (None, {}, {"n": "many"}, {"n": 2.5}, {"n": True}):
        assert member_partition(bad, 4) is None
