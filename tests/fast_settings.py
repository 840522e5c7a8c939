"""Short periods for tests, defined once for the whole suite.

The semantics do not depend on these values; they only keep the suite fast. A test
that needs a different value says so where it passes it (``{**FAST, "lease": 30.0}``),
with the reason. Import them from any test (``tests/`` is on ``sys.path``)::

    from fast_settings import FAST
"""

from __future__ import annotations

from bucketq.reservoir import BufferConfig

#: Queue options (``Queue``, ``AsyncQueue``, ``ElementQueue``, ``AsyncElementQueue``).
FAST = {
    "bucket_max_wait": 0.05,
    "state_flush_period": 0.1,
    "poll_interval": 0.2,
    "lease": 5.0,
    "drain_timeout": 0.5,  # close() at teardown: a message left reserved is not waited on for 5 s
}

#: The fault scenarios kill or freeze consumers and wait for their lease to run out:
#: a 2 s lease keeps each of them within seconds.
FAST_FAULTS = {**FAST, "lease": 2.0}

#: Stream options. Buckets of ten items: the stream tests count items per bucket.
FAST_STREAM = {"bucket_max_size": 10, "bucket_max_wait": 0.05, "poll_interval": 0.1}

#: SDK options (``Client``, ``IngestHandler``): batches sent at once, and an endpoint
#: marked down probed again five times a second.
FAST_SDK = {"batch_wait": 0.02, "health_interval": 0.2}

#: Options of the reservoir's bucketq shard queues: a dead consumer's lease runs out
#: within seconds, so its records come back to another process.
FAST_SHARD_QUEUE = {"lease": 3.0, "state_flush_period": 0.2, "poll_interval": 0.2}

#: A reservoir buffer: few shards, small and young batches, short retry delays, a
#: breaker that stays out of the way unless a test wants it.
FAST_BUFFER = BufferConfig(
    enabled=True,
    shards=2,
    max_batch_size=50,
    max_batch_age_ms=100,
    base_delay_ms=20,
    max_delay_ms=200,
    max_retry_attempts=3,
    pending_threshold=1_000_000,
    failure_threshold=1_000_000,
    graceful_shutdown_ms=10_000,
)
