"""Dispatch policies configured from the environment: retry presets and per-kind
retries (issue 13)."""

from __future__ import annotations

import pytest

from bucketq.errors import ConfigurationError
from bucketq.reservoir import BufferedReservoir, from_env

from .conftest import FakeStorage
from .helpers import FAST, settled

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
    cfg = FAST.with_(retry_by_kind="span=2:20,metric=4:20")  # logs: 3 attempts (FAST)
    buf = BufferedReservoir(storage, backends.transport(transport), cfg)
    async with buf:
        await buf.ingest([{"project_id": "p", "message": "m", "bad": True}])
        await buf.ingest_spans([{"project_id": "p", "trace_id": "t", "span_id": "s", "bad": True}])
        await buf.ingest_metrics([{"project_id": "p", "name": "n", "value": 1, "bad": True}])
        await settled(buf)
        dead = await buf.dlq_inspect(10)
    assert {d["kind"]: d["attempts"] for d in dead} == {"log": 3, "span": 2, "metric": 4}
    assert storage.calls == {"log": 3, "span": 2, "metric": 4}
