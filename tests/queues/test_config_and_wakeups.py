"""Options and database checks fail with messages that say what to do; wake-ups across
processes come from change streams where the server has them."""

from __future__ import annotations

import threading
import time

import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import OperationFailure

from bucketq import AsyncQueue, ConfigurationError, Queue


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"bucket_max_size": 0}, "bucket_max_size"),
        ({"bucket_max_bytes": 20 * 1024 * 1024}, "16 MiB"),
        ({"lease": 1, "state_flush_period": 0.5}, "3x state_flush_period"),
        ({"max_tries": 0}, "max_tries"),
        ({"pending_policy": "drop"}, "pending_policy"),
        ({"bucket_max_wiat": 1}, "Unknown queue option"),
        ({"poll_interval": -1}, "poll_interval"),
    ],
)
def test_bad_options_are_refused_with_the_reason(db, options, needle):
    with pytest.raises(ConfigurationError, match=needle):
        Queue(db, "q", **options)


def test_bad_names_and_delay_and_mature_together(db):
    with pytest.raises(ConfigurationError, match="queue name"):
        Queue(db, "")
    q = Queue(db, "q")
    with pytest.raises(ConfigurationError, match="either delay or mature"):
        q.push("x", delay=1, mature=time.time())
    with pytest.raises(ConfigurationError, match="item id"):
        q.remove("not-an-id")
    q.close()


async def test_wrong_database_flavour_says_what_to_pass(db, mongo_uri):
    with pytest.raises(ConfigurationError, match="Use Queue"):
        AsyncQueue(db, "q")
    client = AsyncMongoClient(mongo_uri)
    try:
        with pytest.raises(ConfigurationError, match="Use AsyncQueue"):
            Queue(client[db.name], "q")
    finally:
        await client.close()

    class MotorDatabase:  # what a Motor database looks like to bucketq
        __module__ = "motor.motor_asyncio"

    with pytest.raises(ConfigurationError, match="AsyncMongoClient"):
        AsyncQueue(MotorDatabase(), "q")


def test_a_push_from_another_queue_object_wakes_a_waiting_consumer(db):
    try:
        with db.watch(max_await_time_ms=10):
            pass
    except OperationFailure:
        pytest.skip("this server has no change streams; consumers poll (poll_interval)")
    consumer = Queue(db, "q", poll_interval=30.0)
    producer = Queue(db, "q")
    got = []
    t = threading.Thread(target=lambda: got.append(consumer.reserve(timeout=20)))
    t.start()
    time.sleep(1.5)  # the consumer is idle and its change stream is open
    t0 = time.time()
    producer.push("hello", durable=True)
    t.join(25)
    assert got and got[0] is not None and got[0].payload == "hello"
    # Not the 30 s poll: the insert event woke it.
    assert time.time() - t0 < 10
    consumer.close()
    producer.close()
