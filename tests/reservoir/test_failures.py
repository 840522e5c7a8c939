"""Storage failures: records whose write failed are retried, then dead-lettered with
their reason; nothing is acked before it is stored; a poisoned record never drags its
fresh neighbours into the DLQ."""

from __future__ import annotations

from collections import Counter

import pytest

from bucketq.reservoir import BufferedReservoir
from fast_settings import FAST_BUFFER

from .conftest import FakeStorage
from .helpers import logs, settled

pytestmark = pytest.mark.timeout(120)

POISON = {7, 55, 56, 130, 199}
N = 200


class AckAudit:
    """Wraps a transport's ack to check, at the moment of every ack, that the acked
    records are already in storage."""

    def __init__(self, transport, storage: FakeStorage) -> None:
        self.unstored_acks: list[str] = []
        self.acked = 0
        inner = transport.ack

        async def ack(shard, deliveries):
            stored = set(storage.messages("log"))
            for d in deliveries:
                self.acked += 1
                if d.entry["record"]["message"] not in stored:
                    self.unstored_acks.append(d.entry["record"]["message"])
            await inner(shard, deliveries)

        transport.ack = ack


@pytest.mark.parametrize(
    "transport_name,mode",
    [
        ("memory", "report"),
        ("memory", "indexed"),
        ("memory", "raise"),
        ("redis", "report"),
        ("redis", "raise"),
        ("bucketq", "indexed"),
    ],
)
async def test_poisoned_records_are_retried_then_dead_lettered_alone(
    backends, transport_name, mode
):
    storage = FakeStorage(
        poison=lambda r: str(r.get("message", "")).startswith("poison"), mode=mode
    )
    transport = backends.transport(transport_name)
    audit = AckAudit(transport, storage)
    buf = BufferedReservoir(storage, transport, FAST_BUFFER)
    async with buf:
        records = logs(N, poison=POISON)
        results = [await buf.ingest(records[i : i + 20]) for i in range(0, N, 20)]
        assert sum(r["ingested"] for r in results) == N and all(r["failed"] == 0 for r in results)
        await settled(buf)
        dead = await buf.dlq_inspect(100)
    stored = Counter(storage.messages("log"))
    expected = {f"rec-{i}" for i in range(N) if i not in POISON}
    duplicates = sum(stored.values()) - len(stored)
    print(
        f"\n[{transport_name}/{mode}] records={N} poison={len(POISON)} stored_distinct={len(stored)} "
        f"duplicates={duplicates} dead_lettered={len(dead)} storage_calls={storage.calls['log']} "
        f"acks={audit.acked} acks_before_store={len(audit.unstored_acks)} retried={buf.stats().get('retried', 0)}"
    )
    assert set(stored) == expected  # every fresh record stored, no poison stored
    assert audit.unstored_acks == []  # no record was acked without being stored
    assert sorted(d["record"]["message"] for d in dead) == sorted(f"poison-{i}" for i in POISON)
    for d in dead:  # only the poison, each after its own three attempts, with the reason
        assert d["attempts"] == 3
        want = (
            "poison record"
            if mode == "indexed"
            else ("cannot store" if mode == "raise" else "records rejected")
        )
        assert want in d["reason"]
    if mode == "indexed":
        assert duplicates == 0
    stats = buf.stats()
    assert stats["dead_lettered"] == len(POISON) and stats["pending"] == 0


async def test_outage_dead_letters_everything_with_its_reason_then_replay_stores_it(backends):
    storage = FakeStorage()
    storage.down = True
    buf = BufferedReservoir(storage, backends.transport("memory"), FAST_BUFFER)
    async with buf:
        await buf.ingest(logs(30))
        await settled(buf)
        dead = await buf.dlq_inspect(100)
        assert len(dead) == 30 and storage.stored["log"] == []
        assert {d["reason"] for d in dead} == {"OSError: storage is down"}
        calls_during_outage = storage.calls["log"]
        storage.down = False
        assert await buf.dlq_replay() == 30
        await settled(buf)
        assert await buf.dlq_size() == 0
    assert sorted(storage.messages()) == sorted(f"rec-{i}" for i in range(30))
    # An outage is not bisected record by record: a write and its two halves, per attempt.
    print(f"\n[outage] 30 records, storage calls during the outage: {calls_during_outage}")
    assert calls_during_outage >= 3


async def test_only_the_failed_kind_is_retried(backends):
    storage = FakeStorage(poison=lambda r: r.get("name") == "bad", mode="indexed")
    buf = BufferedReservoir(storage, backends.transport("memory"), FAST_BUFFER)
    async with buf:
        await buf.ingest([dict(r, project_id="a0") for r in logs(10)])  # one shard
        await buf.ingest_spans(
            [{"project_id": "a0", "trace_id": "t", "span_id": f"s{i}"} for i in range(4)]
        )
        await buf.ingest_metrics(
            [{"project_id": "a0", "name": "bad" if i == 0 else "ok", "value": i} for i in range(3)]
        )
        await settled(buf)
    assert len(storage.stored["log"]) == 10 and len(storage.stored["span"]) == 4
    assert len(storage.stored["metric"]) == 2
    # logs and spans were written once each; metrics once plus two retries of the bad one
    assert storage.calls["log"] == 1 and storage.calls["span"] == 1
    assert storage.calls["metric"] == 3


async def test_passthrough_returns_the_storage_outcome_to_the_caller(backends):
    storage = FakeStorage(
        poison=lambda r: str(r.get("message", "")).startswith("poison"), mode="indexed"
    )
    buf = BufferedReservoir(storage, backends.transport("passthrough"), FAST_BUFFER)
    async with buf:
        res = await buf.ingest(logs(10, poison={3}))
    assert res["ingested"] == 9 and res["failed"] == 1
    assert res["errors"] == [{"index": 3, "error": "poison record"}]
    assert len(storage.stored["log"]) == 9  # written before ingest returned


async def test_records_without_a_project_fail_at_once(backends):
    storage = FakeStorage()
    buf = BufferedReservoir(storage, backends.transport("memory"), FAST_BUFFER)
    async with buf:
        res = await buf.ingest([{"message": "x"}, {"project_id": "p", "message": "y"}])
        await settled(buf)
    assert res["ingested"] == 1 and res["failed"] == 1 and res["errors"][0]["index"] == 0
    assert storage.messages() == ["y"]
