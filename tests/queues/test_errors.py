"""One error boundary: driver errors leave the public methods as bucketq errors (the
driver's attached as the cause), every error class is exported from ``bucketq``, a bug
is never passed off as "transport unavailable", and observers never raise into the
control flow."""

from __future__ import annotations

import inspect
import logging
import socket
from typing import Any

import pytest
from bson import ObjectId
from pymongo import AsyncMongoClient, MongoClient
from pymongo.errors import (
    AutoReconnect,
    ExecutionTimeout,
    NetworkTimeout,
    OperationFailure,
    ServerSelectionTimeoutError,
)

import bucketq
from bucketq import (
    AsyncQueue,
    BucketQError,
    OperationFailed,
    OperationTimeout,
    Queue,
    ServerUnavailable,
    StreamQueue,
    TransportError,
    TransportTimeout,
    TransportUnavailable,
)
from bucketq import errors as errors_module
from bucketq._driver import translate
from bucketq.reservoir import BucketqTransport
from bucketq.reservoir._breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker


def test_every_error_class_is_exported_and_all_is_sorted():
    classes = {
        name
        for name, obj in vars(errors_module).items()
        if inspect.isclass(obj) and issubclass(obj, BucketQError)
    }
    assert classes <= set(bucketq.__all__)
    public = [n for n in bucketq.__all__ if not n.startswith("_")]
    assert public == sorted(public)


@pytest.mark.parametrize(
    "driver,ours",
    [
        (ServerSelectionTimeoutError("no servers"), ServerUnavailable),
        (AutoReconnect("connection reset"), ServerUnavailable),
        (NetworkTimeout("timed out"), OperationTimeout),
        (ExecutionTimeout("operation exceeded time limit", code=50), OperationTimeout),
        (OperationFailure("not authorized", code=13), OperationFailed),
    ],
)
def test_driver_errors_map_onto_one_tree(driver, ours):
    err = translate(driver, "size()")
    assert type(err) is ours and isinstance(err, OperationFailed)
    assert "size()" in str(err)


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Each call keeps trying an absent server for its op_timeout (10 s by default); what
#: is checked here is what it raises, not how long it tries.
AWAY = {"op_timeout": 0.5}


def test_public_methods_raise_bucketq_errors_when_the_server_is_away():
    client: MongoClient = MongoClient(
        f"mongodb://127.0.0.1:{_dead_port()}/", serverSelectionTimeoutMS=200
    )
    try:
        q = Queue(client.bq, "q", **AWAY)
        for call in (q.size, q.total_size, q.next_t, lambda: q.remove(f"{ObjectId()}.0")):
            with pytest.raises(ServerUnavailable) as err:
                call()
            assert isinstance(err.value.__cause__, ServerSelectionTimeoutError)
        s = StreamQueue(client.bq, "s", **AWAY)
        with pytest.raises(ServerUnavailable):
            s.position()
        with pytest.raises(ServerUnavailable):
            s.consumer()
    finally:
        client.close()


async def test_async_public_methods_raise_bucketq_errors_when_the_server_is_away():
    client: AsyncMongoClient = AsyncMongoClient(
        f"mongodb://127.0.0.1:{_dead_port()}/", serverSelectionTimeoutMS=200
    )
    try:
        q = AsyncQueue(client.bq, "q", **AWAY)
        with pytest.raises(ServerUnavailable):
            await q.size()
        with pytest.raises(ServerUnavailable):
            await q.remove(f"{ObjectId()}.0")
    finally:
        await client.close()


def test_a_stream_whose_counter_cannot_be_written_raises_operation_failed(db, monkeypatch):
    s = StreamQueue(db, "s")
    monkeypatch.setattr(s, "_ensure_meta", lambda: None)  # the counter never appears
    with pytest.raises(OperationFailed, match="consumer epoch"):
        s.consumer()


async def test_the_bucketq_transport_translates_queue_errors_but_not_bugs(adb, monkeypatch):
    t = BucketqTransport(adb, prefix="t")
    await t.start(1)
    try:
        q = t.queues[0]

        def failing(exc: BaseException) -> Any:
            async def push_many(*a: Any, **k: Any) -> Any:
                raise exc

            return push_many

        monkeypatch.setattr(q, "push_many", failing(TypeError("a bug, not an outage")))
        with pytest.raises(TypeError):
            await t.enqueue_many(0, [{"x": 1}])
        for queue_error, transport_error in [
            (ServerUnavailable("MongoDB could not be reached"), TransportUnavailable),
            (OperationTimeout("MongoDB did not answer"), TransportTimeout),
            (OperationFailed("MongoDB refused it"), TransportError),
        ]:
            monkeypatch.setattr(q, "push_many", failing(queue_error))
            with pytest.raises(TransportError) as err:
                await t.enqueue_many(0, [{"x": 1}])
            assert type(err.value) is transport_error and err.value.__cause__ is queue_error
    finally:
        await t.stop()


def test_reading_the_breaker_changes_nothing_and_a_failing_listener_is_only_logged(caplog):
    now = [0.0]
    b = CircuitBreaker(pending_threshold=10, failure_threshold=3, cooldown=5.0, window=60.0,
                       clock=lambda: now[0])  # fmt: skip
    seen = []

    def broken(old, new, why):
        raise RuntimeError("listener bug")

    b.listeners.extend([broken, lambda old, new, why: seen.append((old, new))])
    with caplog.at_level(logging.ERROR, logger="bucketq.reservoir"):
        b.record_pending(11)
    assert b.state == OPEN and seen == [(CLOSED, OPEN)]
    assert any("listener" in r.getMessage() for r in caplog.records)
    now[0] = 6.0
    assert b.state == HALF_OPEN and b.state_name == "half-open"
    assert seen == [(CLOSED, OPEN)]  # reading it told nobody anything
    assert b.allow()
    assert seen == [(CLOSED, OPEN), (OPEN, HALF_OPEN)]
