"""Dispatch policies configured from the environment: retry presets and per-kind
retries."""

from __future__ import annotations

import pytest

from bucketq.errors import ConfigurationError
from bucketq.reservoir import BufferedReservoir, from_env
from fast_settings import FAST_BUFFER

from .conftest import FakeStorage
from .helpers import eventually, settled

pytestmark = pytest.mark.timeout(120)


def test_retry_presets_from_the_environment():
    seed = from_env({}).retry_policies()
    assert {k: (p.attempts, p.base, p.cap) for k, p in seed.items()} == {
        k: (3, 0.1, 30.0) for k in ("log", "span", "metric")
    }
    lf = from_env({"RESERVOIR_BUFFER_RETRY_PRESET": "langfuse"}).retry_policies()["span"]
    assert (lf.attempts, lf.base) == (6, 5.0)
    # Exponential from 5 s: the ceilings of the five waits before attempts 2..6.
    assert [lf.delay(a, rng=lambda: 1.0) for a in range(1, 6)] == [5.0, 10.0, 20.0, 40.0, 80.0]
    mixed = from_env({"RESERVOIR_BUFFER_RETRY_PRESET": "langfuse",
                      "RESERVOIR_BUFFER_RETRY_BY_KIND": "metric=2:100"}).retry_policies()  # fmt: skip
    assert (mixed["metric"].attempts, mixed["metric"].base) == (2, 0.1)
    assert mixed["log"].attempts == 6
    for bad in ("span=0:10", "trace=2:10", "span=2", "span=x:1"):
        with pytest.raises(ConfigurationError, match="RESERVOIR_BUFFER_RETRY_BY_KIND"):
            from_env({"RESERVOIR_BUFFER_RETRY_BY_KIND": bad})
    with pytest.raises(ConfigurationError, match="RESERVOIR_BUFFER_RETRY_PRESET"):
        from_env({"RESERVOIR_BUFFER_RETRY_PRESET": "fast"})


@pytest.mark.parametrize("transport", ["memory", "redis", "bucketq"])
async def test_each_kind_is_retried_as_its_policy_says(backends, transport):
    storage = FakeStorage(poison=lambda r: r.get("bad") is True, mode="indexed")
    cfg = FAST_BUFFER.with_(retry_by_kind="span=2:20,metric=4:20")  # logs: 3 attempts (FAST_BUFFER)
    buf = BufferedReservoir(storage, backends.transport(transport), cfg)
    async with buf:
        await buf.ingest([{"project_id": "p", "message": "m", "bad": True}])
        await buf.ingest_spans([{"project_id": "p", "trace_id": "t", "span_id": "s", "bad": True}])
        await buf.ingest_metrics([{"project_id": "p", "name": "n", "value": 1, "bad": True}])
        await settled(buf)
        dead = await buf.dlq_inspect(10)
    assert {d["kind"]: d["attempts"] for d in dead} == {"log": 3, "span": 2, "metric": 4}
    assert storage.calls == {"log": 3, "span": 2, "metric": 4}


@pytest.mark.parametrize("transport", ["memory", "redis", "bucketq"])
async def test_entity_shard_key_spreads_a_project_by_trace_and_keeps_each_trace_in_order(
    backends, transport
):
    storage = FakeStorage(gated=True)  # the writes wait: the transport's shards can be seen
    cfg = FAST_BUFFER.with_(shards=4, shard_key="entity", max_batch_size=1000)
    buf = BufferedReservoir(storage, backends.transport(transport), cfg)
    async with buf:
        for seq in range(5):  # five calls, each with one span of each of 12 traces
            spans = [{"project_id": "one", "trace_id": f"t{t}", "span_id": f"s{seq}",
                      "start_time": 0} for t in range(12)]  # fmt: skip
            await buf.ingest_spans(spans)
        used = {s for s, n in (await buf.transport.pending()).items() if n}
        assert len(used) > 1  # one project, several shards (project sharding: one)
        for t in range(12):
            assert buf.shard_of_record("span", "one", {"trace_id": f"t{t}"}) in used
        storage.gate.set()
        await settled(buf)
    order: dict[str, list[str]] = {}
    for r in storage.stored["span"]:
        order.setdefault(r["trace_id"], []).append(r["span_id"])
    assert order == {f"t{t}": [f"s{i}" for i in range(5)] for t in range(12)}


@pytest.mark.parametrize("transport", ["memory", "redis", "bucketq"])
async def test_dlq_replay_after_the_shard_count_changed_stores_everything(backends, transport):
    storage = FakeStorage()
    storage.down = True
    t = backends.transport(transport)
    records = [{"project_id": f"p{i}", "message": f"rec-{i}"} for i in range(40)]
    async with BufferedReservoir(
        storage, t, FAST_BUFFER.with_(shards=6, max_retry_attempts=1)
    ) as buf:
        await buf.ingest(records)
        await settled(buf)
        dead = await buf.dlq_inspect(100)
    assert len(dead) == 40 and max(d["shard"] for d in dead) >= 2
    storage.down = False
    again = t if transport == "memory" else backends.transport(transport)
    async with BufferedReservoir(storage, again, FAST_BUFFER.with_(shards=2)) as buf:
        assert await buf.dlq_replay() == 40
        await settled(buf)
        assert await buf.dlq_size() == 0
    assert sorted(storage.messages()) == sorted(r["message"] for r in records)


@pytest.mark.parametrize("transport", ["memory", "redis", "bucketq"])
async def test_the_dlq_keeps_at_most_dlq_max_records_dropping_and_counting_the_oldest(
    backends, transport
):
    storage = FakeStorage()
    storage.down = True
    cfg = FAST_BUFFER.with_(shards=1, max_retry_attempts=1, dlq_max=5)
    buf = BufferedReservoir(storage, backends.transport(transport), cfg)
    async with buf:
        for i in range(0, 12, 3):  # four rounds of three: each dead-lettered before the next
            await buf.ingest([{"project_id": "p", "message": f"rec-{j}"} for j in range(i, i + 3)])
            await eventually(lambda i=i: buf.stats()["dead_lettered"] == i + 3, timeout=30)
        assert await buf.dlq_size() == 5
        kept = sorted(d["record"]["message"] for d in await buf.dlq_inspect(100))
        assert kept == sorted(f"rec-{j}" for j in range(7, 12))  # the newest five
        assert buf.stats()["dlq_dropped"] == 7 == await buf.transport.dlq_dropped()
        assert "reservoir_buffer_dlq_dropped_total 7.0" in buf.render_metrics()
