"""The default write concern is on disk: every write whose success bucketq reports (a push
receipt, a durable push, a stream bucket, a state flush, a dead-letter move, the
reservoir's storage write) is sent with ``j: true`` unless the user chose another
write concern; the database's own ``w`` and ``wtimeout`` are kept, its ``j`` respected,
``w=0`` refused. What a user checks: the write concern each command carried, seen with
pymongo's command monitoring."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient, monitoring
from pymongo.write_concern import WriteConcern

from bucketq import ElementQueue, Queue, StreamQueue
from bucketq.bucket.writes import durable_write_concern
from bucketq.errors import ConfigurationError
from bucketq.reservoir import MongoReservoir
from fast_settings import FAST, FAST_STREAM

WRITES = {"insert", "update", "delete", "findAndModify"}


class Writes(monitoring.CommandListener):
    """The write concern of every write command, by command name."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any] | None]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in WRITES:
            target = str(event.command.get(event.command_name))
            self.seen.append((event.command_name, target, event.command.get("writeConcern")))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def on(self, collection: str) -> list[tuple[str, dict[str, Any] | None]]:
        return [(name, wc) for name, target, wc in self.seen if target == collection]


@pytest.fixture
def watched(mongo_uri: str):
    """A client whose write commands are recorded, and a fresh database name."""
    listener = Writes()
    client: MongoClient = MongoClient(mongo_uri, event_listeners=[listener])
    name = f"wc_{uuid.uuid4().hex[:10]}"
    yield client, client[name], listener
    client.drop_database(name)
    client.close()


def test_the_rule():
    assert durable_write_concern(None, WriteConcern()).document == {"j": True}
    assert durable_write_concern(None, None).document == {"j": True}
    # the database's w and wtimeout are kept, j added
    wc = durable_write_concern(None, WriteConcern(w="majority", wtimeout=5000))
    assert wc.document == {"w": "majority", "wtimeout": 5000, "j": True}
    # a database that says j (or fsync) itself: its choice
    assert durable_write_concern(None, WriteConcern(j=False)).document == {"j": False}
    assert durable_write_concern(None, WriteConcern(fsync=True)).document == {"fsync": True}
    # a chosen write concern is used as given, a dict too
    assert durable_write_concern({"w": 1}, WriteConcern(j=True)).document == {"w": 1}
    assert durable_write_concern(WriteConcern(w=2), None).document == {"w": 2}
    with pytest.raises(ConfigurationError, match="unacknowledged"):
        durable_write_concern(None, WriteConcern(w=0))


def test_every_queue_write_waits_for_the_journal_by_default(watched):
    client, db, seen = watched
    with Queue(db, "q", **{**FAST, "max_tries": 1}) as q:
        q.push({"i": 1}, durable=True)
        q.push({"i": 2})
        q.flush()
        first = q.reserve(timeout=10)
        q.commit(first, flush=True)
        second = q.reserve(timeout=10)
        q.rollback(second, delay=0)  # its last try: moved to the dead-letter queue
        q.flush()
    assert {name for name, _ in seen.on("q")} >= {"insert", "update"}  # push, state flush
    assert seen.on("q.dlq"), "the dead letter was written"
    for collection in ("q", "q.dlq"):
        for name, wc in seen.on(collection):
            assert wc == {"j": True}, (collection, name, wc)


def test_the_per_element_queue_and_a_stream_use_the_same_default(watched):
    client, db, seen = watched
    with ElementQueue(db, "e", **FAST) as e:
        e.push({"i": 1})
        e.commit(e.reserve(timeout=10))
    with StreamQueue(db, "s", **FAST_STREAM) as s:
        s.push({"i": 1}, durable=True)
    for collection in ("e", "s"):
        assert seen.on(collection), collection
        for name, wc in seen.on(collection):
            assert wc == {"j": True}, (collection, name, wc)


def test_a_chosen_write_concern_is_kept_and_the_uri_adds_to_the_default(watched, mongo_uri):
    client, db, seen = watched
    with Queue(db, "weak", **{**FAST, "write_concern": {"w": 1}}) as q:
        q.push({"i": 1}, durable=True)
    assert [wc for _, wc in seen.on("weak")] and all(wc == {"w": 1} for _, wc in seen.on("weak"))
    # The database's own write concern (here from the client, as from a URI's w=1) is
    # kept, with j added. (A wtimeout would not be sent: bucketq's calls run under
    # pymongo.timeout, which replaces it.)
    other = client.get_database(db.name, write_concern=WriteConcern(w=1))
    with Queue(other, "uri", **FAST) as q:
        q.push({"i": 1}, durable=True)
    assert seen.on("uri") and all(wc == {"w": 1, "j": True} for _, wc in seen.on("uri")), seen.on(
        "uri"
    )
    with pytest.raises(ConfigurationError, match="unacknowledged"):
        Queue(client.get_database(db.name, write_concern=WriteConcern(w=0)), "no", **FAST)


async def test_the_reservoir_storage_writes_wait_for_the_journal(mongo_uri):
    seen = Writes()
    client: AsyncMongoClient = AsyncMongoClient(mongo_uri, event_listeners=[seen])
    db = client[f"wc_{uuid.uuid4().hex[:10]}"]
    try:
        storage = MongoReservoir(db)
        res = await storage.ingest(
            [
                {
                    "time": "2024-01-01T00:00:00Z",
                    "project_id": "p",
                    "service": "s",
                    "level": "info",
                    "message": "m",
                }
            ]  # fmt: skip
        )
        assert res["ingested"] == 1, res
        inserts = [wc for name, _target, wc in seen.seen if name == "insert"]
        assert inserts and all(wc == {"j": True} for wc in inserts), seen.seen
    finally:
        await client.drop_database(db.name)
        await client.close()
