"""Each record stored once: a record's stable id reaches an idempotent storage engine as
its ``_id`` through retries, isolation rewrites and DLQ replays, so none of them stores
a record twice. Every count here counts documents, so a duplicate would show."""

from __future__ import annotations

from collections import Counter

import pytest
from stored_logs import astored_logs

from bucketq.reservoir import BufferedReservoir, MongoReservoir
from fast_settings import FAST_BUFFER

from .conftest import FakeStorage
from .helpers import logs, settled

pytestmark = pytest.mark.timeout(120)


class CountOnlyMongo(MongoReservoir):
    """Stores what MongoDB takes but reports failures only as a count (no index): the
    buffer must halve and rewrite, and every rewrite includes records already stored."""

    async def ingest(self, logs):
        res = await super().ingest(logs)
        return {"ingested": res["ingested"], "failed": res["failed"],
                "errors": [f"{res['failed']} records rejected"] if res["failed"] else []}  # fmt: skip


class StoresThenFails(MongoReservoir):
    """Stores every record, then reports the write failed (a timeout after the server
    applied it) while ``lying`` is set."""

    lying = True

    async def ingest(self, logs):
        res = await super().ingest(logs)
        if self.lying:
            raise TimeoutError("no answer from storage")
        return res


async def documents(adb) -> Counter:
    return Counter([d["message"] for d in await astored_logs(adb)])


async def test_isolating_count_only_failures_stores_each_record_once(adb):
    # Record 5, 17 and 33 carry a time MongoDB cannot store: they fail; every other
    # record is stored by the first write, then written again by each halving round.
    bad = {5, 17, 33}
    records = [
        dict(r, project_id="p", time=float("nan") if i in bad else 1.7e9)
        for i, r in enumerate(logs(40))
    ]
    buf = BufferedReservoir(CountOnlyMongo(adb), _memory(), FAST_BUFFER)
    async with buf:
        assert (await buf.ingest(records))["ingested"] == 40
        await settled(buf)
        dead = await buf.dlq_inspect(100)
        writes = buf.stats()["storage_writes"]
    docs = await documents(adb)
    assert sum(docs.values()) == len(docs) == 37  # documents == distinct
    assert set(docs) == {f"rec-{i}" for i in range(40) if i not in bad}
    assert sorted(d["record"]["message"] for d in dead) == sorted(f"rec-{i}" for i in bad)
    assert writes > 10  # the halving did rewrite stored records


@pytest.mark.parametrize("transport", ["memory", "redis", "bucketq"])
async def test_a_replayed_dlq_record_that_was_stored_is_stored_once(backends, adb, transport):
    storage = StoresThenFails(adb)
    buf = BufferedReservoir(storage, backends.transport(transport), FAST_BUFFER)
    async with buf:
        await buf.ingest(logs(12))
        await settled(buf)
        dead = await buf.dlq_inspect(100)
        assert len(dead) == 12 and all(d["attempts"] == 3 for d in dead)
        assert {d["id"] for d in dead} == {d["_id"] for d in await astored_logs(adb)}
        storage.lying = False
        assert await buf.dlq_replay() == 12
        await settled(buf)
        assert await buf.dlq_size() == 0
        stored = buf.stats()["stored"]
    docs = await documents(adb)
    assert sum(docs.values()) == len(docs) == 12
    assert stored == 12  # the replay counted them stored: the duplicate key is no failure


async def test_a_record_s_own_id_is_its_stable_id_and_a_resent_record_is_stored_once(adb):
    buf = BufferedReservoir(MongoReservoir(adb), _memory(), FAST_BUFFER)
    recs = [dict(r, _id=f"key-{i}") for i, r in enumerate(logs(10))]
    async with buf:
        assert (await buf.ingest(recs))["ingested"] == 10
        assert (await buf.ingest(recs[:4]))["ingested"] == 4  # a client's retry
        res = await buf.ingest([dict(recs[0], _id=7), dict(recs[1], _id="")])
        assert res["failed"] == 2 and all("_id" in e["error"] for e in res["errors"])
        await settled(buf)
    docs = await astored_logs(adb)
    assert sorted(d["_id"] for d in docs) == sorted(f"key-{i}" for i in range(10))
    # After stop() ingests bypass the buffer: still one document per id.
    assert (await buf.ingest(recs[:3]))["ingested"] == 3
    assert len(await astored_logs(adb)) == 10


async def test_a_storage_that_is_not_idempotent_gets_the_records_as_they_came():
    storage = FakeStorage()
    assert storage.idempotent is False
    buf = BufferedReservoir(storage, _memory(), FAST_BUFFER)
    async with buf:
        await buf.ingest(logs(5))
        await settled(buf)
    assert len(storage.stored["log"]) == 5
    assert all("_id" not in r for r in storage.stored["log"])


def _memory():
    from bucketq.reservoir import MemoryTransport

    return MemoryTransport()


async def test_passthrough_answers_a_call_that_sends_one_id_twice(adb):
    from bucketq.reservoir import PassthroughTransport

    buf = BufferedReservoir(MongoReservoir(adb), PassthroughTransport(), FAST_BUFFER)
    async with buf:
        rec = dict(logs(1)[0], _id="same")
        res = await buf.ingest([rec, rec, dict(rec, _id="other")])
    assert res == {"ingested": 3, "failed": 0, "errors": []}
    assert len(await astored_logs(adb)) == 2
