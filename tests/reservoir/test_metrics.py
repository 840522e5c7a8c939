"""After a scripted run, ``/metrics`` shows the expected counters and breaker state."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bucketq.reservoir import BufferedReservoir, render_metrics
from fast_settings import FAST_BUFFER

from .conftest import FakeStorage
from .helpers import eventually, settled

pytestmark = pytest.mark.timeout(60)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(sm: dict, name: str, **labels: str) -> float:
    return sum(
        v
        for (n, lab), v in sm.items()
        if n == name and all((k, x) in lab for k, x in labels.items())
    )


async def test_metrics_text_after_a_scripted_run(fake_clock, backends):
    storage = FakeStorage(poison=lambda r: r.get("name") == "bad", mode="indexed")
    cfg = FAST_BUFFER.with_(shards=1, max_retry_attempts=2, failure_threshold=3)
    buf = BufferedReservoir(storage, backends.transport("memory"), cfg, clock=fake_clock)
    async with buf:
        await buf.ingest([{"project_id": "p", "message": f"m{i}"} for i in range(10)])
        await buf.ingest_spans(
            [{"project_id": "p", "trace_id": "t", "span_id": f"s{i}"} for i in range(5)]
        )
        await buf.ingest_metrics(
            [{"project_id": "p", "name": "bad" if i == 0 else "ok", "value": i} for i in range(3)]
        )
        await settled(buf)
        text = buf.render_metrics()
        sm = samples(text)
        assert total(sm, "reservoir_buffer_enqueued_total", kind="log", shard="0") == 10
        assert total(sm, "reservoir_buffer_enqueued_total", kind="span") == 5
        assert total(sm, "reservoir_buffer_enqueued_total", kind="metric") == 3
        assert total(sm, "reservoir_buffer_flush_success_total", kind="log") == 10
        assert total(sm, "reservoir_buffer_flush_success_total", kind="span") == 5
        assert total(sm, "reservoir_buffer_flush_success_total", kind="metric") == 2
        assert total(sm, "reservoir_buffer_flush_failure_total", kind="metric") == 2  # two attempts
        assert total(sm, "reservoir_buffer_dlq_total", kind="metric") == 1
        assert total(sm, "reservoir_buffer_dlq_total", kind="log") == 0
        assert total(sm, "reservoir_buffer_flush_duration_ms_count", kind="metric") == 2
        assert total(sm, "reservoir_buffer_bypass_total") == 0
        assert sm[("reservoir_buffer_breaker_state", ())] == 0
        print(
            "\n"
            + "\n".join(
                line
                for line in text.splitlines()
                if line.startswith("reservoir_buffer_") and "_bucket" not in line
            )
        )

        # Storage goes down: flush failures open the breaker, the next ingest bypasses.
        storage.down = True
        await buf.ingest([{"project_id": "p", "message": "x"}])
        await eventually(
            lambda: samples(render_metrics(buf))[("reservoir_buffer_breaker_state", ())] == 1,
            what="the breaker to open",
        )
        storage.down = False
        await buf.ingest([{"project_id": "p", "message": "y"}])
        sm = samples(render_metrics(buf))
        assert sm[("reservoir_buffer_breaker_state", ())] == 1
        assert total(sm, "reservoir_buffer_bypass_total", kind="log", shard="0") == 1
        fake_clock.advance(cfg.cooldown_ms / 1000)
        assert samples(buf.render_metrics())[("reservoir_buffer_breaker_state", ())] == 2


def test_each_buffer_has_its_own_registry_or_the_one_given(backends):
    a = BufferedReservoir(FakeStorage(), backends.transport("memory"), FAST_BUFFER)
    b = BufferedReservoir(FakeStorage(), backends.transport("memory"), FAST_BUFFER)
    assert a.metrics.registry is not b.metrics.registry
    reg = CollectorRegistry()
    c = BufferedReservoir(FakeStorage(), backends.transport("memory"), FAST_BUFFER, registry=reg)
    assert c.metrics.registry is reg
    assert "reservoir_buffer_breaker_state 0.0" in render_metrics(reg)


def test_every_metric_is_in_the_docs_table(backends):
    """docs/reservoir.md's metrics table names every family the buffer exports, with
    its type, and nothing else."""
    buf = BufferedReservoir(FakeStorage(), backends.transport("memory"), FAST_BUFFER)
    exported = {
        fam.name + ("_total" if fam.type == "counter" else ""): fam.type
        for fam in text_string_to_metric_families(render_metrics(buf))
        if not fam.name.endswith("_created")  # prometheus_client's own, beside a counter
    }
    docs = (Path(__file__).parents[2] / "docs" / "reservoir.md").read_text()
    table = docs.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = dict(re.findall(r"^\| `(reservoir_buffer_\w+)` \| (\w+):", table, re.M))
    assert documented == exported
