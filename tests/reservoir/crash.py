"""The crash scenario: SIGKILL an ingest process (``child.py``) with records in flight,
let a new process drain the transport, and count what storage holds.

Used by ``test_restart.py`` and, to measure, from the command line::

    python tests/reservoir/crash.py --transport bucketq --mongodb-uri URI \\
        --config '{"shards": 4, "max_batch_size": 5000, "max_batch_age_ms": 4000}' --kill-after 1500

It prints one JSON line: ``acked`` (records whose ingest returned before the kill),
``stored_at_kill``, ``documents`` (stored after the drain), ``distinct`` (distinct
messages), ``duplicates`` (documents - distinct), ``missing`` (acked records not stored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient, MongoClient
from stored_logs import stored_logs

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CHILD = Path(__file__).with_name("child.py")


def start_child(
    transport: str,
    prefix: str,
    mongo_uri: str,
    db: str,
    redis_url: str,
    mode: str,
    overrides: str = "",
) -> subprocess.Popen:
    args = [sys.executable, str(CHILD), transport, prefix, mongo_uri, db, redis_url, mode]
    return subprocess.Popen(
        args + ([overrides] if overrides else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def wait_for_line(proc: subprocess.Popen, predicate, timeout: float = 60.0) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited early (rc={proc.poll()}); last lines {lines[-3:]}")
        lines.append(line.strip())
        if predicate(line.strip()):
            return lines
    raise AssertionError("child too slow")


def read_rest(proc: subprocess.Popen, timeout: float = 60.0) -> str:
    """What the child wrote after the lines already read, up to its exit. Through
    ``proc.stdout`` itself: ``communicate(timeout=...)`` reads the pipe's descriptor and
    misses what ``readline()`` had already buffered (ACK lines lost that way made records
    look stored beyond the acknowledged ones)."""
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        proc.kill()
        raise AssertionError(f"the child did not exit within {timeout:g} s")
    proc.wait(timeout)
    return out[0]


def acked(lines: list[str]) -> int:
    """Records acknowledged to the caller: ``ACK <seq>`` means 0..seq were."""
    seqs = [int(x.split()[1]) for x in lines if x.startswith("ACK ")]
    return max(seqs) + 1 if seqs else 0


async def crash_and_drain(
    transport: str,
    mongo_uri: str,
    redis_url: str,
    *,
    db_name: str,
    prefix: str,
    overrides: str = "",
    kill_after: int = 800,
    kill_in_write: bool = True,
    timeout: float = 90.0,
) -> dict[str, Any]:
    """Run the scenario once; the caller drops ``db_name`` and the Redis keys."""
    from bucketq.reservoir import BufferedReservoir, MongoReservoir

    from .child import config, make_transport

    sync = MongoClient(mongo_uri)
    db = sync[db_name]
    proc = start_child(transport, prefix, mongo_uri, db_name, redis_url, "kill", overrides)
    try:
        lines = wait_for_line(
            proc, lambda x: x.startswith("ACK ") and int(x.split()[1]) >= kill_after - 1
        )
        if kill_in_write:  # the next storage write landed; its ack has not happened
            lines += wait_for_line(proc, lambda x: x.startswith("STORED ") and x != "STORED 0")
        os.kill(proc.pid, signal.SIGKILL)
        rest = read_rest(proc)
        stored_at_kill = {r["message"] for r in stored_logs(db)}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += rest.split("\n")
    n_acked = acked(lines)
    want = {f"rec-{i}" for i in range(n_acked)}

    client: AsyncMongoClient = AsyncMongoClient(mongo_uri)
    buf = BufferedReservoir(
        MongoReservoir(client[db_name]),
        make_transport(transport, prefix, client[db_name], redis_url, config(overrides)),
        config(overrides),
    )
    pending_at_restart = 0
    async with buf:
        pending_at_restart = buf.pending
        if buf.transport.durable:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if want <= {r["message"] for r in stored_logs(db)}:
                    if sum((await buf.transport.pending()).values()) == 0:
                        break
                await asyncio.sleep(0.1)
    await client.close()
    messages = [d["message"] for d in stored_logs(db)]
    distinct = set(messages)
    sync.close()
    return {
        "transport": transport,
        "acked": n_acked,
        "stored_at_kill": len(stored_at_kill),
        "pending_at_restart": pending_at_restart,
        "documents": len(messages),
        "distinct": len(distinct),
        "duplicates": len(messages) - len(distinct),
        "missing": len(want - distinct),
        "lost_from_stored": len(stored_at_kill - distinct),
        "beyond_acked": sorted(distinct - want - stored_at_kill),
        "dead_lettered": buf.stats()["dead_lettered"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="bucketq")
    ap.add_argument("--mongodb-uri", default=os.environ.get("BUCKETQ_MONGODB_URI"))
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--config", default="", help="JSON of BufferConfig fields")
    ap.add_argument("--kill-after", type=int, default=1500)
    a = ap.parse_args()
    db_name = f"crash_{uuid.uuid4().hex[:8]}"
    prefix = f"crash_{uuid.uuid4().hex[:8]}"
    try:
        out = asyncio.run(
            crash_and_drain(
                a.transport,
                a.mongodb_uri,
                a.redis_url,
                db_name=db_name,
                prefix=prefix,
                overrides=a.config,
                kill_after=a.kill_after,
            )
        )
        out["beyond_acked"] = len(out["beyond_acked"])
        print(json.dumps(out))
    finally:
        MongoClient(a.mongodb_uri).drop_database(db_name)
        if a.transport == "redis":
            import redis

            r = redis.Redis.from_url(a.redis_url)
            keys = list(r.scan_iter(match=f"{prefix}*"))
            if keys:
                r.delete(*keys)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.reservoir"
    main()
