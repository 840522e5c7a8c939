"""Configuration from the environment, the shard function, and the docs table."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import mmh3
import pytest

from bucketq.errors import ConfigurationError
from bucketq.reservoir import (
    BufferConfig,
    BufferedReservoir,
    MongoReservoir,
    config_table,
    from_env,
    wrap_reservoir,
)
from bucketq.reservoir._policy import BatchPolicy, interpret, retry_delay, shard_for

DOC = Path(__file__).resolve().parents[2] / "docs" / "reservoir.md"


def test_defaults_are_the_seeds():
    cfg = from_env({})
    assert (cfg.enabled, cfg.transport, cfg.shards, cfg.max_batch_size, cfg.max_batch_age_ms) == (
        False, "memory", 8, 500, 1000)  # fmt: skip
    assert (cfg.graceful_shutdown_ms, cfg.pending_threshold, cfg.failure_threshold, cfg.cooldown_ms) == (
        10000, 10000, 20, 30000)  # fmt: skip
    assert (cfg.max_retry_attempts, cfg.base_delay_ms, cfg.stream_prefix) == (
        3,
        100,
        "logtide:buffer",
    )
    assert cfg == BufferConfig()


def test_values_are_read_and_invalid_ones_name_the_variable():
    cfg = from_env({"RESERVOIR_BUFFER_ENABLED": "yes", "RESERVOIR_BUFFER_TRANSPORT": "BucketQ",
                    "RESERVOIR_BUFFER_SHARDS": "4", "RESERVOIR_BUFFER_OVERFLOW_PROJECTS": "hot, hotter"})  # fmt: skip
    assert cfg.enabled and cfg.transport == "bucketq" and cfg.shards == 4
    assert cfg.overflow_projects == {"hot", "hotter"} and cfg.total_shards == 5
    for var, value in [("RESERVOIR_BUFFER_SHARDS", "0"), ("RESERVOIR_BUFFER_MAX_BATCH_SIZE", "many"),
                       ("RESERVOIR_BUFFER_TRANSPORT", "kafka"), ("RESERVOIR_BUFFER_ENABLED", "maybe")]:  # fmt: skip
        with pytest.raises(ConfigurationError, match=var):
            from_env({var: value})
    with pytest.raises(ConfigurationError, match="shards"):
        BufferConfig(shards=0)


async def test_the_bucketq_lease_reaches_every_shard_queue(adb):
    # How soon a dead process's records go to another is the shard queues' lease.
    cfg = from_env(
        {
            "RESERVOIR_BUFFER_ENABLED": "true",
            "RESERVOIR_BUFFER_TRANSPORT": "bucketq",
            "RESERVOIR_BUFFER_BUCKETQ_LEASE_MS": "4000",
        }
    )
    buffered = wrap_reservoir(MongoReservoir(adb), cfg, db=adb)
    assert isinstance(buffered, BufferedReservoir)
    transport = buffered.transport
    await transport.start(2)
    try:
        assert [q.options.lease for q in transport.queues.values()] == [4.0, 4.0]
    finally:
        await transport.stop()
    with pytest.raises(ConfigurationError, match="RESERVOIR_BUFFER_BUCKETQ_LEASE_MS"):
        from_env({"RESERVOIR_BUFFER_BUCKETQ_LEASE_MS": "1000"})  # renewals could not keep up


def test_redis_without_url_falls_back_to_memory_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="bucketq.reservoir"):
        cfg = from_env({"RESERVOIR_BUFFER_TRANSPORT": "redis"})
    assert cfg.transport == "memory"
    assert "REDIS_URL is not set" in caplog.text
    assert (
        from_env({"RESERVOIR_BUFFER_TRANSPORT": "redis", "REDIS_URL": "redis://x"}).transport
        == "redis"
    )


def test_shard_is_murmur3_of_the_project_and_hot_projects_go_to_overflow():
    for pid in ["p1", "acme", "ünïcode", ""]:
        assert shard_for(pid, 8) == mmh3.hash(pid.encode(), 0, signed=False) % 8
    assert shard_for("hot", 8, frozenset({"hot"})) == 8


def test_retry_delay_grows_is_jittered_and_capped():
    assert retry_delay(1, 0.1, 30, rng=lambda: 0.0) == pytest.approx(0.05)
    assert retry_delay(1, 0.1, 30, rng=lambda: 1.0) == pytest.approx(0.1)
    assert retry_delay(3, 0.1, 30, rng=lambda: 1.0) == pytest.approx(0.4)
    assert retry_delay(30, 0.1, 30, rng=lambda: 1.0) == pytest.approx(30)


def test_batch_policy_and_result_reading():
    b = BatchPolicy(500, 1.0)
    assert b.due(500, 0.0, 0.1) and b.due(1, 0.0, 1.0) and not b.due(499, 0.0, 0.5)
    assert interpret(3, {"ingested": 3, "failed": 0}).ok
    assert interpret(3, {"ingested": 1, "failed": 0}).failed == 2  # unaccounted records failed
    got = interpret(3, {"ingested": 2, "failed": 1, "errors": [{"index": 1, "error": "bad"}]})
    assert got.failed_indices == {1: "bad"}
    assert interpret(3, None).total_failure


def test_docs_configuration_table_is_the_rendered_one():
    text = DOC.read_text()
    m = re.search(r"<!-- config-table:start -->\n(.*?)<!-- config-table:end -->", text, re.S)
    assert m, "docs/reservoir.md lost its config-table markers"
    assert m.group(1) == config_table(), (
        "regenerate the table: python -c 'from bucketq.reservoir import config_table; print(config_table())'"
    )
