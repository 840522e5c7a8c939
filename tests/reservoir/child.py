"""A child ingest process for the restart and signal tests (run as a script).

``python child.py <transport> <prefix> <mongo_uri> <db> <redis_url> <mode> [<config json>]``

The optional last argument is a JSON object of :class:`BufferConfig` fields that
replace those of ``CONFIG`` (e.g. ``{"shards": 4, "max_batch_size": 5000}``).
It ingests batches of 10 logs (``message = rec-<seq>``) into a BufferedReservoir over
a MongoDB storage engine whose writes are slowed down, and prints ``ACK <seq>`` once
the ingest holding ``seq`` returned, and ``STORED <n>`` after each storage write.
``mode=kill``: runs until killed (a write waits 0.5 s between storage and ack). ``mode=sigterm``:
installs the signal handlers, prints ``READY``, and on SIGTERM prints ``STOPPED <json>``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: fast_settings

from pymongo import AsyncMongoClient

from bucketq.reservoir import (
    BufferConfig,
    BufferedReservoir,
    MongoReservoir,
    install_signal_handlers,
)
from fast_settings import FAST_SHARD_QUEUE


class SlowMongo(MongoReservoir):
    """Storage writes take a while, so a kill lands with records in flight. After each
    write it prints ``STORED <n>`` and waits ``tail`` seconds before the buffer can ack:
    a kill in that window is the crash between a storage write and its ack."""

    tail = 0.025

    async def ingest(self, logs):
        await asyncio.sleep(0.025)
        res = await super().ingest(logs)
        print(f"STORED {res['ingested']}", flush=True)
        await asyncio.sleep(self.tail)  # stored, not yet acked: a kill here makes duplicates
        return res


def make_transport(name: str, prefix: str, db, redis_url: str, cfg: BufferConfig | None = None):
    """The transport of the child and of the process after it: a dead consumer's records
    come back within seconds, but never while a live consumer still collects its batch."""
    age = (cfg or CONFIG).max_batch_age_ms / 1000
    if name == "redis":
        from bucketq.reservoir import RedisTransport

        return RedisTransport(url=redis_url, prefix=prefix, claim_idle=max(1.0, 2 * age))
    if name == "bucketq":
        from bucketq.reservoir import BucketqTransport

        opts = dict(FAST_SHARD_QUEUE, lease=max(FAST_SHARD_QUEUE["lease"], 2 * age))
        return BucketqTransport(db, prefix=prefix, queue_options=opts)
    from bucketq.reservoir import MemoryTransport, PassthroughTransport

    return MemoryTransport() if name == "memory" else PassthroughTransport()


CONFIG = BufferConfig(enabled=True, shards=2, max_batch_size=50, max_batch_age_ms=100, base_delay_ms=20,
                      graceful_shutdown_ms=20_000)  # fmt: skip


def config(overrides: str = "") -> BufferConfig:
    return replace(CONFIG, **json.loads(overrides)) if overrides else CONFIG


async def main(
    transport: str,
    prefix: str,
    uri: str,
    dbname: str,
    redis_url: str,
    mode: str,
    overrides: str = "",
) -> None:
    client: AsyncMongoClient = AsyncMongoClient(uri)
    db = client[dbname]
    cfg = config(overrides)
    storage = SlowMongo(db)
    if mode == "kill":
        storage.tail = 0.5
    buf = BufferedReservoir(storage, make_transport(transport, prefix, db, redis_url, cfg), cfg)
    await buf.start()
    stopped = asyncio.Event()
    if mode == "sigterm":

        def done(report):
            print("STOPPED " + json.dumps(report), flush=True)
            stopped.set()

        install_signal_handlers(buf, on_stopped=done)
    seq = 0
    while not stopped.is_set():
        batch = [
            {
                "project_id": f"p{(seq + i) % 7}",
                "service": "svc",
                "level": "info",
                "message": f"rec-{seq + i}",
            }
            for i in range(10)
        ]
        res = await buf.ingest(batch)
        if buf.stats()["state"] != "running":
            break  # stopping: that batch went straight to storage; stop counting
        assert res["ingested"] == 10, res
        seq += 10
        print(f"ACK {seq - 1}", flush=True)
        if mode == "sigterm" and seq == 200:
            print("READY", flush=True)
        await asyncio.sleep(0.005)
    await stopped.wait()
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:8]))
