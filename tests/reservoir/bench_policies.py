"""What the dispatch policies cost per record: ingest time and transport commands with a
dispatch delay or automatic overflow on, against the same run with them off.

::

    python tests/reservoir/bench_policies.py [--records 20000] [--batch 10] [--callers 8]
        [--transport memory --transport redis --transport bucketq] [--mongodb-uri URI]

In process: ``callers`` tasks each call ``ingest`` with ``batch`` log records (spread
over 100 projects) until ``records`` were accepted; storage is a counter that stores
nothing, so the figures are the buffer's and the transport's. For each transport and
variant it prints one JSON line: ``ingest_us_per_record`` (the callers' wall time over
the records: what ingest costs a caller), ``cycle_us_per_record`` (first ingest until
storage has every record, minus the delay itself), and for redis the commands and round
trips this process sent per record (the consumers' polling included). Variants:
``off``, ``delay`` (``DISPATCH_DELAY_BY_KIND=log=1``: every record takes the delayed
path, 1 ms), ``overflow`` (``AUTO_OVERFLOW_FAILURES=5``, nothing fails: the bookkeeping
of the common case). MongoDB: ``--mongodb-uri``, else an embedded server it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bucketq.reservoir import BufferConfig, BufferedReservoir, Reservoir

VARIANTS = {
    "off": {},
    "delay": {"dispatch_delay_by_kind": "log=1"},
    "overflow": {"auto_overflow_failures": 5},
}


class Counting(Reservoir):
    """Stores nothing, counts everything."""

    idempotent = True

    def __init__(self) -> None:
        self.n = 0
        self.done = asyncio.Event()
        self.want = 0

    async def ingest(self, logs: Any) -> dict[str, Any]:
        self.n += len(logs)
        if self.n >= self.want:
            self.done.set()
        return {"ingested": len(logs), "failed": 0, "errors": []}


class RedisCount:
    """Commands and round trips this process sends through ``client`` (the Redis server
    is shared, so its own command statistics would count other clients too)."""

    def __init__(self, client: Any) -> None:
        import redis.asyncio.client as rc

        self.commands = self.trips = 0
        plain = client.execute_command

        async def execute_command(*a: Any, **k: Any) -> Any:
            self.commands += 1
            self.trips += 1
            return await plain(*a, **k)

        client.execute_command = execute_command
        if not getattr(rc.Pipeline, "_bench_counted", False):
            execute = rc.Pipeline.execute
            counters = RedisCount.active

            async def counted(pipe: Any, *a: Any, **k: Any) -> Any:
                for c in counters:
                    c.commands += len(pipe.command_stack) + (2 if pipe.is_transaction else 0)
                    c.trips += 1
                return await execute(pipe, *a, **k)

            rc.Pipeline.execute = counted  # type: ignore[method-assign]
            rc.Pipeline._bench_counted = True  # type: ignore[attr-defined]
        RedisCount.active[:] = [self]

    active: list[RedisCount] = []


async def one(transport: str, variant: str, args: argparse.Namespace, uri: str) -> dict[str, Any]:
    prefix = f"bench_{uuid.uuid4().hex[:8]}"
    client: Any = None
    mongo: Any = None
    if transport == "memory":
        from bucketq.reservoir import MemoryTransport

        tr: Any = MemoryTransport(capacity=10 * args.records)
    elif transport == "redis":
        import redis.asyncio as aioredis

        from bucketq.reservoir import RedisTransport

        client = aioredis.Redis.from_url(args.redis_url)
        tr = RedisTransport(client, prefix=prefix)
    else:
        from pymongo import AsyncMongoClient

        from bucketq.reservoir import BucketqTransport

        mongo = AsyncMongoClient(uri)
        tr = BucketqTransport(mongo[prefix], prefix=prefix)
    cfg = BufferConfig(enabled=True, shards=4, max_batch_size=500, max_batch_age_ms=100,
                       pending_threshold=10**9, **VARIANTS[variant])  # fmt: skip
    storage = Counting()
    storage.want = args.records
    buf = BufferedReservoir(storage, tr, cfg)
    await buf.start()
    count = RedisCount(client) if client is not None else None
    sent = 0
    seq = 0

    async def caller() -> None:
        nonlocal sent, seq
        while sent < args.records:
            sent += args.batch
            seq += 1
            base = seq * args.batch
            recs = [{"project_id": f"p{(base + i) % 100}", "service": "api", "level": "info",
                     "message": f"m{base + i}"} for i in range(args.batch)]  # fmt: skip
            res = await buf.ingest(recs)
            assert res["failed"] == 0, res

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(args.callers)))
    t_ingest = time.perf_counter() - t0
    await asyncio.wait_for(storage.done.wait(), 600)
    t_cycle = time.perf_counter() - t0
    calls = (count.commands, count.trips) if count is not None else None
    await buf.stop()
    if client is not None:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
    if mongo is not None:
        await mongo.drop_database(prefix)
        await mongo.close()
    n = storage.n
    out = {
        "transport": transport,
        "variant": variant,
        "records": n,
        "ingest_us_per_record": round(t_ingest / n * 1e6, 2),
        "cycle_us_per_record": round((t_cycle - (0.001 if variant == "delay" else 0)) / n * 1e6, 2),
    }
    if calls is not None:
        out["redis_commands_per_record"] = round(calls[0] / n, 3)
        out["redis_round_trips_per_record"] = round(calls[1] / n, 3)
    return out


def micro() -> None:
    """The policies' own CPU per record, best of 7 (robust to a loaded machine)."""
    import timeit

    from bucketq.reservoir import MemoryTransport
    from bucketq.reservoir._policy import DelayPolicy, ProjectOverflow, new_entry

    def best(stmt: Any, number: int, per: int) -> float:
        return round(min(timeit.repeat(stmt, number=number, repeat=7)) / number / per * 1e6, 3)

    batch = [new_entry("log", f"p{i % 100}", {"project_id": f"p{i % 100}"}) for i in range(10)]
    tr = MemoryTransport(capacity=10**9)
    asyncio.run(tr.start(1))
    policy = DelayPolicy({"log": 5.0}, 600.0, (85500, 900))
    now = time.time()
    flush = [{"project_id": f"p{i % 100}"} for i in range(500)]
    ov = ProjectOverflow(5, 60.0, time.monotonic)

    def observe() -> None:  # a flush where one project failed (nothing is tracked otherwise)
        stored = {e.get("project_id") for e in flush}
        ov.observe(stored, {"p7"})

    off = BufferedReservoir(Counting(), MemoryTransport(), BufferConfig(enabled=True))
    on = BufferedReservoir(Counting(), MemoryTransport(),
                           BufferConfig(enabled=True, auto_overflow_failures=5))  # fmt: skip
    rec = {"project_id": "p1"}

    figures = {
        "memory_enqueue_us_per_record_no_delay": best(lambda: tr._put(0, batch), 2000, 10),
        "memory_enqueue_us_per_record_delay": best(lambda: tr._put(0, batch, 5.0), 2000, 10),
        "delay_decision_us_per_ingest_call": best(
            lambda: policy.delay("log", "api", now), 20000, 1
        ),
        "shard_of_record_us_overflow_off": best(
            lambda: off.shard_of_record("log", "p1", rec), 20000, 1
        ),
        "shard_of_record_us_overflow_on": best(
            lambda: on.shard_of_record("log", "p1", rec), 20000, 1
        ),
        "overflow_observe_us_per_record_of_a_failed_flush": best(observe, 200, 500),
    }
    print(json.dumps({"micro": figures}), flush=True)


async def main(args: argparse.Namespace, uri: str) -> None:
    for transport in args.transport or ["memory", "redis", "bucketq"]:
        records = args.records
        if transport == "bucketq":
            args.records = min(records, args.bucketq_records)
        for _ in range(args.repeat):
            for variant in VARIANTS:
                print(json.dumps(await one(transport, variant, args, uri)), flush=True)
        args.records = records


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=20000)
    p.add_argument("--bucketq-records", type=int, default=5000)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--callers", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2, help="runs of every variant, interleaved")
    p.add_argument("--transport", action="append", choices=["memory", "redis", "bucketq"])
    p.add_argument("--mongodb-uri", default=os.environ.get("BUCKETQ_MONGODB_URI"))
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--micro", action="store_true", help="only the policies' own CPU per record")
    args = p.parse_args()
    if args.micro:
        micro()
        return
    server = None
    uri = args.mongodb_uri
    if not uri and "bucketq" in (args.transport or ["bucketq"]):
        from bucketq.embedded import EmbeddedServer

        server = EmbeddedServer().start()
        uri = server.uri
    try:
        asyncio.run(main(args, uri or ""))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    cli()
