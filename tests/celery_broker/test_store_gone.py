"""The transport when its MongoDB dies under a worker (an embedded server of the test's
own, SIGKILLed)."""

from __future__ import annotations

import threading

from kombu import Connection

from celery_broker.conftest import FAST, with_database
from waiting import eventually


def test_a_connection_closed_after_its_mongodb_died_stops_its_queues(storage):
    """A worker stopping after its store died: the connection's close gives up on what
    it cannot reach (the queue's drain, the client's sessions) and still stops the queues'
    threads, which would otherwise go on retrying against a closed client for ever."""
    url = "bucketq+" + with_database(storage.uri, "celery") + "&serverSelectionTimeoutMS=3000"
    conn = Connection(url, transport_options=FAST)
    q = conn.SimpleQueue("jobs")
    q.put("x")
    assert q.get(timeout=10).payload == "x"  # held, never acknowledged
    storage.kill()
    closed = threading.Thread(target=conn.release, daemon=True)
    closed.start()
    closed.join(120)  # a bound on a hang
    assert not closed.is_alive(), "the close waited for the store that is gone"
    eventually(lambda: not [t for t in threading.enumerate()
                            if t.name.startswith("bucketq-queue-") and t.name.endswith("-jobs")],
               60, what="the queue's threads to stop")  # fmt: skip
