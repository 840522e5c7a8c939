"""Every option and argument of the queue classes and the stream is checked where it
enters: the error is a ConfigurationError (or PayloadNotEncodable for a payload) whose
message names the argument, and nothing else is harmed."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from bucketq import AckOutOfOrder, ConfigurationError, PayloadNotEncodable
from queue_kinds import resolve

NAN, INF = float("nan"), float("inf")

BAD_QUEUE_OPTIONS = [
    ("lease", NAN), ("lease", INF), ("lease", -1), ("lease", True), ("lease", "30"),
    ("lease", 1e12),
    ("bucket_max_wait", INF), ("bucket_max_wait", NAN), ("bucket_max_wait", -0.1),
    ("mature_granularity", NAN), ("mature_granularity", 0),
    ("state_flush_period", NAN), ("poll_interval", INF), ("retry_budget", NAN),
    ("retry_base", INF), ("retry_cap", 0), ("drain_timeout", NAN),
    ("reject_delta_base", INF), ("reject_delta_factor", NAN), ("reject_timeout_grace", -1),
    ("bucket_max_size", True), ("bucket_max_size", 0), ("bucket_max_size", 1.5),
    ("bucket_max_size", 70000), ("bucket_max_bytes", True), ("bucket_max_bytes", 1e6),
    ("prefetch", -1), ("prefetch", True), ("prefetch", NAN),
    ("max_tries", True), ("max_tries", 0), ("max_tries", 2.0),
    ("max_pending_bytes", True), ("max_pending_bytes", NAN),
    ("write_concern", {"x": 1}), ("write_concern", {"w": 0}), ("write_concern", "majority"),
    ("dead_letter_queue", "$x"), ("dead_letter_queue", ".lead"),
    ("dead_letter_queue", "trail."), ("dead_letter_queue", "a..b"), ("dead_letter_queue", 5),
    ("change_streams", "yes"), ("owner", ""), ("owner", 5), ("pending_policy", "drop"),
]  # fmt: skip


@pytest.mark.parametrize(("option", "value"), BAD_QUEUE_OPTIONS)
async def test_a_bad_option_names_itself(queue_kind, option, value):
    with pytest.raises(ConfigurationError, match=option):
        queue_kind.open(**{option: value})


async def test_the_dead_letter_queue_cannot_be_the_queue_itself(queue_kind):
    with pytest.raises(ConfigurationError, match="dead_letter_queue"):
        queue_kind.open("q", dead_letter_queue="q")


@pytest.mark.parametrize("name", ["", ".lead", "trail.", "a..b", "$x", "system.x", 5, "x" * 201])
async def test_a_bad_queue_name_is_refused_with_the_rule(queue_kind, name):
    with pytest.raises(ConfigurationError, match="name"):
        queue_kind.open(name)


BAD_PUSH = [
    ({"delay": NAN}, "delay"), ({"delay": INF}, "delay"), ({"delay": -1}, "delay"),
    ({"delay": 1e12}, "delay"), ({"delay": True}, "delay"), ({"delay": "5"}, "delay"),
    ({"mature": "tomorrow"}, "mature"), ({"mature": NAN}, "mature"), ({"mature": 1e20}, "mature"),
    ({"mature": True}, "mature"), ({"mature": -5}, "mature"),
    ({"delay": 1, "mature": time.time()}, "mature"),
    ({"headers": [1, 2]}, "headers"), ({"headers": "h"}, "headers"),
    ({"headers": {1: "x"}}, "headers"), ({"headers": {"": 1}}, "headers"),
    ({"durable": "yes"}, "durable"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "needle"), BAD_PUSH)
async def test_a_bad_push_argument_fails_that_push_only(queue_kind, kwargs, needle):
    q = queue_kind.open()
    before = await resolve(q.push("before", durable=True))
    with pytest.raises(ConfigurationError, match=needle):
        await resolve(q.push("bad", **kwargs))
    with pytest.raises(ConfigurationError, match=needle):
        await resolve(q.push_many(["bad1", "bad2"], **kwargs))
    after = q.push("after")
    after = await resolve(after)
    await resolve(q.flush())
    assert await resolve(after.wait(10)) and before
    got = [await resolve(q.reserve(timeout=10)) for _ in range(2)]
    assert sorted(m.payload for m in got if m is not None) == ["after", "before"]
    assert await resolve(q.total_size()) == 2


@pytest.mark.parametrize("payloads", ["abc", b"abc", {"a": 1, "b": 2}, 5, None])
async def test_push_many_wants_a_list_of_payloads(queue_kind, payloads):
    q = queue_kind.open()
    with pytest.raises(ConfigurationError, match="payloads"):
        await resolve(q.push_many(payloads))
    await resolve(q.flush())
    assert await resolve(q.total_size()) == 0


async def test_a_self_referential_payload_is_not_encodable(queue_kind):
    q = queue_kind.open()
    loop: list = []
    loop.append(loop)
    with pytest.raises(PayloadNotEncodable, match="contains itself"):
        await resolve(q.push(loop))
    d: dict = {}
    d["me"] = d
    with pytest.raises(PayloadNotEncodable):
        await resolve(q.push_many(["fine", d]))


@pytest.mark.parametrize("timeout", [NAN, INF, -1, True, "1"])
async def test_reserve_timeouts_are_checked(queue_kind, timeout):
    q = queue_kind.open()
    with pytest.raises(ConfigurationError, match="timeout"):
        await resolve(q.reserve(timeout=timeout))
    with pytest.raises(ConfigurationError, match="timeout"):
        await resolve(q.reserve_many(5, timeout=timeout))


@pytest.mark.parametrize("max_items", [True, 0, -3, "3", 2.0])
async def test_reserve_many_wants_a_count(queue_kind, max_items):
    q = queue_kind.open()
    with pytest.raises(ConfigurationError, match="max_items"):
        await resolve(q.reserve_many(max_items, timeout=0))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"delay": INF}, "delay"), ({"delay": NAN}, "delay"), ({"delay": -1}, "delay"),
        ({"delay": 1e12}, "delay"), ({"next_t": "soon"}, "next_t"), ({"next_t": INF}, "next_t"),
        ({"delay": 1, "next_t": time.time()}, "next_t"), ({"reason": 5}, "reason"),
    ],
)  # fmt: skip
async def test_bad_rollback_arguments_leave_the_message_in_hand(queue_kind, kwargs, needle):
    q = queue_kind.open()
    await resolve(q.push("x", durable=True))
    msg = await resolve(q.reserve(timeout=10))
    with pytest.raises(ConfigurationError, match=needle):
        await resolve(q.rollback(msg, **kwargs))
    assert await resolve(q.commit(msg)) is True
    await resolve(q.flush())
    assert await resolve(q.total_size()) == 0


@pytest.mark.parametrize("bad", [None, "x", 5])
async def test_commit_and_rollback_want_a_message(queue_kind, bad):
    q = queue_kind.open()
    for method in (q.commit, q.rollback):
        with pytest.raises(ConfigurationError, match="Message"):
            await resolve(method(bad))
    with pytest.raises(ConfigurationError, match="Message"):
        await resolve(q.commit_many([bad]))


async def test_a_message_from_another_queue_object_is_refused(queue_kind):
    a = queue_kind.open("a")
    b = queue_kind.open("b")
    await resolve(a.push("x", durable=True))
    msg = await resolve(a.reserve(timeout=10))
    with pytest.raises(ConfigurationError, match="another queue object"):
        await resolve(b.commit(msg))
    with pytest.raises(ConfigurationError, match="another queue object"):
        await resolve(b.rollback(msg))
    assert b.stats()["committed"] == 0
    assert await resolve(a.commit(msg)) is True


async def test_commit_after_rollback_returns_false_and_the_item_comes_back(queue_kind):
    q = queue_kind.open()
    await resolve(q.push("x", durable=True))
    first = await resolve(q.reserve(timeout=10))
    assert await resolve(q.rollback(first, delay=0)) is True
    # The rollback ended that delivery: committing it now would drop the redelivery.
    assert await resolve(q.commit(first)) is False
    assert await resolve(q.rollback(first, delay=0)) is False
    again = await resolve(q.reserve(timeout=10))
    assert again is not None and again.payload == "x" and again.tries == 1
    assert await resolve(q.commit(again)) is True
    await resolve(q.flush())
    assert await resolve(q.reserve(timeout=0.5)) is None
    assert await resolve(q.total_size()) == 0


@pytest.mark.parametrize("suffix", ["-1", "-2", "+1", " 1", "01", "1.5", "x", "65536", ""])
async def test_remove_refuses_an_index_that_is_not_one(queue_kind, suffix):
    q = queue_kind.open()
    receipts = [await resolve(q.push(i)) for i in range(6)]
    await resolve(q.flush())
    bucket = receipts[0].id.rsplit(".", 1)[0]
    with pytest.raises(ConfigurationError, match="item id"):
        await resolve(q.remove(f"{bucket}.{suffix}"))
    with pytest.raises(ConfigurationError, match="item id"):
        await resolve(q.remove(None))


async def test_remove_with_a_negative_index_loses_nothing(bucket_kind):
    q = bucket_kind.open()
    receipts = [await resolve(q.push(i)) for i in range(6)]
    await resolve(q.flush())
    bucket = receipts[0].id.rsplit(".", 1)[0]
    assert {r.id.rsplit(".", 1)[0] for r in receipts} == {bucket}
    for bad in ("-1", "-2"):
        with pytest.raises(ConfigurationError):
            await resolve(q.remove(f"{bucket}.{bad}"))
    assert await resolve(q.remove(f"{bucket}.6")) is False  # past the end: nothing there
    got = []
    while len(got) < 6 and (m := await resolve(q.reserve(timeout=10))) is not None:
        got.append(m.payload)
        await resolve(q.commit(m))
    assert sorted(got) == list(range(6))
    assert await resolve(q.reserve(timeout=0)) is None


# -- the stream ---------------------------------------------------------------------------

BAD_STREAM_OPTIONS = [
    ("poll_interval", NAN), ("hole_grace", INF), ("stage_timeout", -1), ("tombstone_ttl", NAN),
    ("read_ahead", True), ("read_ahead", 0), ("bucket_max_wait", INF), ("bucket_max_size", True),
    ("retry_budget", NAN), ("write_concern", {"x": 1}), ("max_pending_bytes", INF),
]  # fmt: skip


@pytest.mark.parametrize(("option", "value"), BAD_STREAM_OPTIONS)
async def test_a_bad_stream_option_names_itself(stream_kind, option, value):
    with pytest.raises(ConfigurationError, match=option):
        stream_kind.open(**{option: value})


@pytest.mark.parametrize("name", ["", ".lead", "trail.", "$x"])
async def test_a_bad_stream_name_is_refused(stream_kind, name):
    with pytest.raises(ConfigurationError, match="name"):
        stream_kind.open(name)


async def test_bad_stream_arguments_fail_alone(stream_kind):
    s = stream_kind.open(bucket_max_wait=0.05)
    for kwargs, needle in [({"headers": [1, 2]}, "headers"), ({"durable": 1}, "durable")]:
        with pytest.raises(ConfigurationError, match=needle):
            await resolve(s.push("bad", **kwargs))
    with pytest.raises(ConfigurationError, match="payloads"):
        await resolve(s.push_many("abc"))
    ok = await resolve(s.push("good", durable=True))
    assert ok is not None
    c = await resolve(s.consumer())
    for t in (NAN, INF, -1, True):
        with pytest.raises(ConfigurationError, match="timeout"):
            await resolve(c.next_batch(timeout=t))
    batch = await resolve(c.next_batch(timeout=10))
    assert batch is not None and batch.items == ["good"]
    for seq in (True, "1", 1.0):
        with pytest.raises(AckOutOfOrder, match="seq"):
            await resolve(c.ack(seq))
    with pytest.raises(ConfigurationError, match="after"):
        await resolve(s.consumer(after=-1))


def test_a_naive_and_an_aware_mature_mean_the_same_instant(db):
    from bucketq.bucket.times import mature_time

    aware = datetime(2030, 1, 1, tzinfo=UTC)
    assert mature_time(0.0, None, aware) == mature_time(0.0, None, aware.replace(tzinfo=None))
