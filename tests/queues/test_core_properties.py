"""Property tests of the pure core: packing, held-bucket state, update documents, lease maths."""

from __future__ import annotations

from bson import ObjectId
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pymongo import DeleteOne, UpdateOne

from bucketq._guard import backoff
from bucketq.bucket import item_id, not_leased, parse_item_id
from bucketq.bucket.codec import encode_item
from bucketq.bucket.options import BUCKET_OVERHEAD, QueueOptions
from bucketq.bucket.packing import OpenBucket, Packer
from bucketq.bucket.times import to_datetime
from bucketq.bucket.writes import may_retry
from bucketq.queue._core.claims import claim_request
from bucketq.queue._core.counts import ready_filter
from bucketq.queue._core.held import HeldBucket, needs_renewal, plan_flush, state_write
from bucketq.queue._core.redelivery import over_tried

NOW = 1_700_000_000.0

items = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=3000), st.sampled_from([None, 0.0, 0.3, 1.7, 2.2, 9.9])
    ),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(items, st.integers(min_value=1, max_value=40), st.sampled_from([2048, 4096, 16384]))
def test_packer_never_loses_or_overfills(specs, max_size, max_bytes):
    opts = QueueOptions(
        bucket_max_size=max_size, bucket_max_bytes=max_bytes, max_pending_bytes=1 << 26
    )
    packer = Packer(opts, object)
    sealed: list[OpenBucket] = []
    placed = []
    for n, (size, delay) in enumerate(specs):
        blob = encode_item({"n": n, "pad": "x" * size})
        mature = NOW + (delay or 0.0)
        if len(blob) > max_bytes - BUCKET_OVERHEAD:
            continue
        ob, index, out = packer.add(blob, mature, NOW)
        sealed.extend(out)
        placed.append((n, mature, ob, index))
    buckets = sealed + packer.take_all()
    # Every item is in exactly one bucket, at the index it was given.
    assert sum(len(b) for b in buckets) == len(placed)
    for n, mature, ob, index in placed:
        assert ob.items[index] == encode_item({"n": n, "pad": "x" * specs[n][0]})
        # Never delivered early; at most one slot late.
        assert ob.mature >= mature
        if mature > NOW:
            assert ob.mature - mature < opts.mature_granularity
    for b in buckets:
        assert 1 <= len(b) <= max_size
        assert b.nbytes <= max_bytes - BUCKET_OVERHEAD
        assert len(b.document()["items"]) == b.nbytes


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 3000), max_size=80), max_size=6),
    st.sampled_from([None, 0.0, 1.7]),
    st.integers(min_value=1, max_value=40),
    st.sampled_from([2048, 4096, 16384]),
)
def test_packer_add_many_packs_runs_like_single_adds(batches, delay, max_size, max_bytes):
    """push_many's packing: every item once, in order, at the index its run says; no
    bucket over its count or bytes; only full buckets are sealed."""
    opts = QueueOptions(
        bucket_max_size=max_size, bucket_max_bytes=max_bytes, max_pending_bytes=1 << 26
    )
    cap = max_bytes - BUCKET_OVERHEAD
    packer = Packer(opts, object)
    sealed: list[OpenBucket] = []
    expected: list[bytes] = []
    placed: list[tuple[OpenBucket, int, bytes]] = []
    mature = NOW + (delay or 0.0)
    for b, sizes in enumerate(batches):
        blobs = [encode_item({"b": b, "n": n, "pad": "x" * size}) for n, size in enumerate(sizes)]
        blobs = [x for x in blobs if len(x) <= cap]
        runs, out = packer.add_many(blobs, [len(x) for x in blobs], mature, NOW)
        sealed.extend(out)
        flat = [(ob, k) for ob, first, count in runs for k in range(first, first + count)]
        assert len(flat) == len(blobs)
        placed.extend((ob, k, x) for (ob, k), x in zip(flat, blobs, strict=True))
        expected.extend(blobs)
    buckets = sealed + packer.take_all()
    assert [x for bkt in buckets for x in bkt.items] == expected
    position = {x: i for i, x in enumerate(expected)}
    for ob in sealed:  # sealed only when full, or when the next item would not fit
        nxt = position[ob.items[-1]] + 1
        assert len(ob) == max_size or ob.nbytes + len(expected[nxt]) > cap
    for ob, k, x in placed:
        assert ob.items[k] == x and ob.mature >= mature
    for bkt in buckets:
        assert 1 <= len(bkt) <= max_size and bkt.nbytes == sum(map(len, bkt.items)) <= cap


def _held(n: int) -> HeldBucket:
    blob = b"".join(encode_item(i) for i in range(n))
    doc = {"_id": ObjectId(), "n": n, "live": n, "mature": to_datetime(NOW), "items": blob}
    return HeldBucket(doc, ObjectId(), NOW, 30.0)


ops = st.lists(
    st.tuples(st.sampled_from(["commit", "rollback", "rollback_later"]), st.integers(0, 63)),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=64), ops)
def test_held_bucket_state_stays_consistent(n, script):
    b = _held(n)
    msgs = {m.index: m for m in b.ready_messages(NOW, None)}
    committed: set[int] = set()
    for op, i in script:
        i %= n
        if op == "commit":
            ok = b.commit(i)
            assert ok == (i in msgs and i not in committed)
            if ok:
                committed.add(i)
                msgs.pop(i)
        else:
            later = op == "rollback_later"
            ok = b.rollback(i, NOW + (5 if later else 0), NOW)
            if ok:
                msgs.pop(i)
                if not later:
                    for m in b.ready_messages(NOW, None):
                        msgs[m.index] = m
    assert b.live == n - len(committed)
    assert all(b.is_done(i) == (i in committed) for i in range(n))
    w = state_write(b, NOW, 30.0)
    if len(committed) == n:
        assert isinstance(w, DeleteOne)
    else:
        assert isinstance(w, UpdateOne)
        s = w._doc["$set"]
        assert s["live"] == n - len(committed)
        assert bytes(s["done"]) == bytes(b.done)
        assert w._filter == {"_id": b.id, "lease.tok": b.token}  # every state write is fenced
    if b.idle() and not b.finished():
        rel = state_write(b, NOW, 30.0, release=True)._doc["$set"]
        assert rel["lease"] is None
        assert rel["mature"].timestamp() == NOW + 5  # the earliest pending item decides


@given(st.integers(0, 60), st.floats(0.01, 2), st.floats(0.1, 60))
def test_backoff_is_bounded(attempt, base, cap):
    for r in (0.0, 0.5, 0.999):
        for full in (False, True):
            d = backoff(attempt, base, cap, rng=lambda r=r: r, full_jitter=full)
            ceiling = min(cap, base * 2 ** min(max(attempt - 1, 0), 32))
            assert (0 if full else ceiling / 2) <= d <= ceiling


@given(st.floats(0.3, 600), st.floats(0, 600))
def test_renewal_happens_before_the_lease_runs_out(lease, elapsed):
    assume(abs(elapsed - lease / 3) > 1e-6)  # exactly on the boundary, float rounding decides
    b = _held(1)
    b.until = NOW + lease
    due = needs_renewal(b, NOW + elapsed, lease)
    assert due == (elapsed > lease / 3)


def test_takeover_counts_a_try_for_every_pending_item():
    b = _held(4)
    doc = {
        "_id": b.id, "n": 4, "live": 3, "mature": to_datetime(NOW),
        "items": b"".join(encode_item(i) for i in range(4)),
        "done": bytes([0b0001]), "tries": {"2": 1},
        "lease": {"tok": ObjectId(), "until": to_datetime(NOW - 1)},
    }  # fmt: skip
    t = HeldBucket(doc, ObjectId(), NOW, 30.0)
    msgs = t.ready_messages(NOW, None)
    assert [(m.index, m.tries) for m in msgs] == [(1, 1), (2, 2), (3, 1)]
    assert t.dirty


def test_item_ids_round_trip():
    oid = ObjectId()
    assert parse_item_id(item_id(oid, 17)) == (oid, 17)


# -- decisions made once, in the core -------------------------------------------------


@given(st.integers(0, 100), st.one_of(st.none(), st.integers(1, 100)), st.booleans())
def test_the_over_tried_rule(tries, max_tries, rolled_back):
    why = over_tried(tries, max_tries, rolled_back=rolled_back)
    assert (why is not None) == (max_tries is not None and tries >= max_tries)
    if why is not None:
        said = "1 time " if tries == 1 else f"{tries} times "
        assert said in why and f"max_tries={max_tries}" in why
        assert why.startswith("rolled back" if rolled_back else "delivered")


def _matches_not_leased(flt, doc) -> bool:
    """Evaluate the one filter shape not_leased() builds, as the server would."""
    (alternatives,) = flt.values()
    for alt in alternatives:
        if alt == {"lease": None} and doc.get("lease") is None:
            return True
        if "lease.until" in alt and doc.get("lease") is not None:
            if doc["lease"]["until"] <= alt["lease.until"]["$lte"]:
                return True
    return False


@given(st.one_of(st.none(), st.floats(-100, 100)), st.floats(-100, 100))
def test_not_leased_is_no_lease_or_a_lease_that_ran_out(until, now):
    doc = {"lease": None if until is None else {"until": to_datetime(NOW + until)}}
    dnow = to_datetime(NOW + now)
    expect = until is None or to_datetime(NOW + until) <= dnow
    assert _matches_not_leased(not_leased(dnow), doc) == expect
    # The claim and the size queries share it.
    assert claim_request(NOW + now, ObjectId(), "o", 30.0)[0]["$or"] == not_leased(dnow)["$or"]
    assert ready_filter(NOW + now)["$or"] == not_leased(dnow)["$or"]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 8),  # items
            st.integers(0, 8),  # committed
            st.booleans(),  # dirty
            st.floats(0, 40),  # lease left
            st.booleans(),  # lost
            st.integers(0, 2),  # queued
        ),
        max_size=8,
    ),
    st.booleans(),
)
def test_flush_planning(specs, release_all):
    lease = 30.0
    buckets = []
    for n, committed, dirty, left, lost, queued in specs:
        b = _held(n)
        msgs = b.ready_messages(NOW, None)
        for m in msgs[: min(committed, n)]:
            b.commit(m.index)
        b.dirty, b.until, b.lost, b.queued = dirty, NOW + left, lost, queued
        buckets.append(b)
    before = [(b.dirty, b.finished(), b.idle()) for b in buckets]
    plan, unwritable = plan_flush(buckets, NOW, lease, release_all=release_all)
    assert unwritable == []
    kinds = {id(b): kind for b, kind, _ in plan}
    for b, (dirty, finished, idle) in zip(buckets, before, strict=True):
        kind = kinds.get(id(b))
        if b.lost:
            assert kind is None  # a lost bucket is never written
        elif finished:
            assert kind == "delete"  # the flush after the last commit deletes it
        elif release_all or (idle and b.queued == 0):
            assert kind == "release"
        elif dirty or needs_renewal(b, NOW, lease):
            assert kind == "update"
        else:
            assert kind is None
        if kind is not None:
            assert not b.dirty
    for b, kind, w in plan:
        assert isinstance(w, DeleteOne if kind == "delete" else UpdateOne)
        assert w._filter == {"_id": b.id, "lease.tok": b.token}


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 30),
    st.lists(st.tuples(st.integers(0, 29), st.floats(0, 100)), max_size=40),
    st.floats(0, 200),
    st.floats(1, 60),
)
def test_each_handed_out_item_stalls_on_its_own_clock(n, handed, now, limit):
    """reject_timeout_grace is per item: an item stalls ``limit`` after it was handed
    out, whatever happens to the other items of its bucket."""
    b = _held(n)
    b.ready_messages(NOW, None)
    at = {}
    for i, t in handed:
        i %= n
        b.handed_at[i] = at[i] = NOW + t
    committed = {i for i in list(at)[::3]}
    for i in committed:
        b.commit(i)  # activity on the bucket resets nobody else's clock
    stalled = b.stalled_items(NOW + now, limit)
    assert stalled == sorted(
        i for i, t in at.items() if i not in committed and NOW + now - t >= limit
    )


@given(st.floats(0, 100), st.floats(0.1, 100))
def test_a_write_is_never_retried_past_its_budget(elapsed, budget):
    from pymongo.errors import AutoReconnect, OperationFailure

    assert may_retry(AutoReconnect("x"), elapsed, budget) == (elapsed < budget)
    assert not may_retry(OperationFailure("bad", code=2), elapsed, budget)
