"""Options and database checks fail with messages that say what to do. (Wake-ups by
change stream: tests/queues/test_wake.py.)"""

from __future__ import annotations

import time

import pytest
from pymongo import AsyncMongoClient

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
