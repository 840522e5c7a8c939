"""``bucketq.metrics.QueueCollector`` in a registry, as an application registers it: the
sizes a user checks against what they pushed, the process's counters, a stream's lag,
and a scrape that still answers when MongoDB does not."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bucketq.metrics import QueueCollector
from bucketq.queue import Queue
from bucketq.stream import StreamQueue
from queue_kinds import FAST


def samples(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(reg).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_sizes_counters_and_stream_lag(db):
    q = Queue(db, "jobs", **FAST)
    s = StreamQueue(db, "events")
    try:
        q.push_many(range(4))
        q.push("later", delay=3600)
        q.flush()
        m = q.reserve(timeout=10)
        assert m is not None
        q.commit(m, flush=True)
        s.push_many([1, 2], durable=True)
        reg = CollectorRegistry()
        reg.register(QueueCollector(db, ["jobs", "events"], objects=[q, s]))
        got = samples(reg)
        assert got[("bucketq_queue_inspect_up", ())] == 1
        assert (
            got[
                (
                    "bucketq_queue_items",
                    (("kind", "queue"), ("queue", "jobs"), ("state", "scheduled")),
                )
            ]
            == 1
        )
        held = got[
            ("bucketq_queue_items", (("kind", "queue"), ("queue", "jobs"), ("state", "leased")))
        ]
        ready = got[
            ("bucketq_queue_items", (("kind", "queue"), ("queue", "jobs"), ("state", "ready")))
        ]
        assert held + ready == 3  # one of four committed; the rest held by q's claim or ready
        assert got[("bucketq_queue_pushed_total", (("queue", "jobs"),))] == 5
        assert got[("bucketq_queue_committed_total", (("queue", "jobs"),))] == 1
        assert got[("bucketq_queue_pushed_total", (("queue", "events"),))] == 2
        assert got[("bucketq_stream_lag_buckets", (("queue", "events"),))] == 1
        assert got[("bucketq_queue_next_mature_timestamp_seconds", (("queue", "jobs"),))] > 0
    finally:
        s.close()
        q.close()


def test_a_scrape_answers_when_mongodb_does_not():
    from pymongo import MongoClient

    client: MongoClient = MongoClient("mongodb://127.0.0.1:1/", serverSelectionTimeoutMS=200)
    try:
        reg = CollectorRegistry()
        reg.register(QueueCollector(client["x"], ["jobs"]))
        assert samples(reg)[("bucketq_queue_inspect_up", ())] == 0
    finally:
        client.close()


def test_it_needs_something_to_export():
    with pytest.raises(TypeError):
        QueueCollector()
