"""Property tests of the partition decisions in the pure core: which partition a key or
a producer's id goes to, the order a consumer's claims visit the partitions, the claim's
partition term, packing by partition, folding partitions a queue no longer has, and the
option's checks."""

from __future__ import annotations

import pytest
from bson import ObjectId
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketq.bucket import member_id, partition_of
from bucketq.bucket.codec import encode_item
from bucketq.bucket.options import MAX_PARTITIONS, QueueOptions
from bucketq.bucket.packing import OpenBucket, Packer
from bucketq.errors import ConfigurationError
from bucketq.queue._core.claims import (
    PROBE_SORT,
    Rotation,
    claim_request,
    claimable_filter,
    part_filter,
    partition_of_document,
    partitions_to_fold,
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
    st.lists(st.integers(0, 64), max_size=60),
)
def test_a_rotation_tries_every_partition_and_moves_on(k, start, stay, found_at):
    rot = Rotation(start, k, stay)
    assert rot.round()[0] == start % k
    in_a_row = 0
    for offset in found_at:
        order = rot.round()
        assert sorted(order) == list(range(k))  # each once per round
        assert all(order[i + 1] == (order[i] + 1) % k for i in range(k - 1))  # in turn
        part = order[offset % k]  # the claims before it found nothing
        in_a_row = in_a_row + 1 if offset % k == 0 else 1
        rot.found(part)
        if in_a_row >= stay:
            assert rot.round()[0] == (part + 1) % k  # at most ``stay`` in a row
            in_a_row = 0
        else:
            assert rot.round()[0] == part  # stays where the buckets are


@settings(deadline=None, max_examples=60)
@given(st.integers(1, 64), st.integers(0, 10**6), st.integers(0, 10**6))
def test_an_idle_consumer_starts_its_round_where_a_bucket_was_seen(k, start, seen):
    rot = Rotation(start, k)
    rot.start_at(seen)
    order = rot.round()
    assert order[0] == seen % k and sorted(order) == list(range(k))


@settings(deadline=None, max_examples=60)
@given(
    st.integers(1, 64),
    st.integers(0, 10**6),
    st.lists(st.integers(0, 63), max_size=20),
    st.floats(0.1, 10.0),
)
def test_a_round_skips_partitions_found_empty_until_their_memory_passes(k, start, empty, memory):
    rot = Rotation(start, k)
    missed = {p % k for p in empty}
    for p in missed:
        rot.missed(p, NOW, memory)
    order = rot.round(NOW)
    assert set(order) == set(range(k)) - missed  # the others, each once
    assert order == [p for p in Rotation(start, k).round() if p not in missed]  # in turn
    assert sorted(rot.round(NOW + memory)) == list(range(k))  # remembered for ``memory``
    if missed:
        p = min(missed)
        rot.start_at(p)  # an idle read saw a bucket there
        assert rot.round(NOW)[0] == p
        q = max(missed)
        rot.found(q)  # a claim found one there after all
        assert q in rot.round(NOW)


@given(st.integers(0, 64))
def test_the_idle_probe_looks_from_the_consumers_own_place_then_from_the_start(start):
    reqs = probe_requests(NOW, start)
    assert reqs[-1] == claimable_filter(NOW)  # finally: any partition, from 0
    if start:
        assert reqs[0] == {**claimable_filter(NOW), "part": {"$gte": start}}
    else:
        assert len(reqs) == 1
    assert PROBE_SORT[0] == ("part", 1)  # partition order, not the oldest bucket


def test_the_partition_of_a_stored_bucket():
    assert partition_of_document({}) == 0
    assert partition_of_document({"part": None}) == 0
    assert partition_of_document({"part": 5}) == 5
    # the read an idle consumer makes has no partition term: it is not a claim
    assert "part" not in claimable_filter(NOW)
    flt, _ = claim_request(NOW, ObjectId(), "me", 30.0)
    assert flt == claimable_filter(NOW)


@given(st.integers(1, 64), st.integers(1, 10))
def test_a_consumer_visits_every_partition_while_all_have_buckets(k, stay):
    rot = Rotation(0, k, stay)
    seen = set()
    for _ in range(k * stay):
        p = rot.round()[0]
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
        at = [r.round()[0] for r in rots]
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
