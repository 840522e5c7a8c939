"""``bucketq dlq list|requeue|purge``: the reservoir buffer's dead-letter queue.

``add_dlq_parser(subparsers)`` adds the ``dlq`` command group to an argparse
sub-parser set; the chosen command is ``args.func(args)``, which returns an exit code.
``python -m bucketq.reservoir.cli dlq ...`` runs it standalone.

Only the durable transports have a DLQ another process can reach: ``redis`` and
``bucketq`` (the ``memory`` DLQ lives in the ingest process; use the Python API there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from .. import _validate as v
from ..errors import BucketQError
from ._config import DEFAULT_STREAM_PREFIX, PREFIX, from_env


def _defaults() -> dict[str, Any]:
    try:
        cfg = from_env()
        return {
            "transport": cfg.transport if cfg.transport in ("redis", "bucketq") else None,
            "prefix": cfg.stream_prefix,
            "redis_url": cfg.redis_url or None,
        }
    except BucketQError:
        return {
            "transport": None,
            "prefix": DEFAULT_STREAM_PREFIX,
            "redis_url": None,
        }


def _common(p: argparse.ArgumentParser, d: dict[str, Any]) -> None:
    p.add_argument("--transport", choices=("redis", "bucketq"), default=d["transport"],
                   help=f"where the DLQ is (default: {PREFIX}TRANSPORT when it is redis or bucketq)")  # fmt: skip
    p.add_argument(
        "--redis-url",
        type=v.cli_url(*v.REDIS_SCHEMES),
        default=d["redis_url"],
        help="Redis URL (default: $REDIS_URL)",
    )
    v.add_mongodb_uri(p)
    p.add_argument(
        "--database", default=None, help="MongoDB database (default: the URI's, else bucketq)"
    )
    p.add_argument(
        "--prefix", default=d["prefix"], help=f"key/queue prefix (default: {PREFIX}STREAM_PREFIX)"
    )


def add_dlq_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``dlq`` with ``list``, ``requeue`` and ``purge`` (the verbs of ``queues dead``
    and ``quarantine``) to ``subparsers`` (what ``ArgumentParser.add_subparsers()``
    returned); ``inspect`` and ``replay`` are deprecated aliases. Returns the ``dlq``
    parser."""
    d = _defaults()
    dlq = subparsers.add_parser(
        "dlq", help="list, requeue or purge the reservoir buffer's dead-letter queue"
    )
    sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="{list,requeue,purge}")

    def listing(p: argparse.ArgumentParser) -> None:
        _common(p, d)
        p.add_argument(
            "--limit", type=v.cli_count(1), default=20, help="at most this many (default 20)"
        )
        p.add_argument("--json", action="store_true", help="one JSON object per line")
        p.set_defaults(func=run_dlq)

    def requeue(p: argparse.ArgumentParser) -> None:
        _common(p, d)
        p.add_argument(
            "--limit", type=v.cli_count(1), default=None, help="at most this many (default all)"
        )
        p.set_defaults(func=run_dlq)

    listing(
        sub.add_parser("list", help="print dead-lettered records with their reason (read-only)")
    )
    requeue(sub.add_parser(
        "requeue", help="put dead-lettered records back on their shard with fresh attempts"
    ))  # fmt: skip
    p = sub.add_parser("purge", help="delete every dead-lettered record")
    _common(p, d)
    p.add_argument("--yes", action="store_true", help="do it (without --yes, only say how many)")
    p.set_defaults(func=run_dlq)
    v.deprecated_alias(sub, "inspect", "list", "dlq_command", listing)
    v.deprecated_alias(sub, "replay", "requeue", "dlq_command", requeue)
    return dlq


def run_dlq(args: argparse.Namespace) -> int:
    """Run the parsed ``dlq`` command; returns the exit code."""
    # A one-shot command: its outcome is the one line below, not the queue's warnings
    # (which, with no logging configured, Python would print as extra lines).
    logging.getLogger("bucketq").setLevel(logging.ERROR)
    try:
        return asyncio.run(_run(args))
    except BucketQError as exc:
        print(f"bucketq dlq {args.dlq_command}: error: {v.one_line(exc)}", file=sys.stderr)
        return 1


async def _open(args: argparse.Namespace) -> tuple[Any, Any]:
    if args.transport is None:
        raise BucketQError(
            f"Say where the DLQ is: --transport redis|bucketq (or set {PREFIX}TRANSPORT)."
        )
    if args.transport == "redis":
        from ._redis import RedisTransport

        if not args.redis_url:
            raise BucketQError("The redis DLQ needs --redis-url or REDIS_URL.")
        t = RedisTransport(url=args.redis_url, prefix=args.prefix)
        return t, None
    from pymongo import AsyncMongoClient

    from ..bucket.deadline import client_timeouts
    from ._bucketq import BucketqTransport

    uri = v.require_mongodb_uri(args.mongodb_uri, "read the bucketq DLQ from")
    client: Any = AsyncMongoClient(uri, **client_timeouts(uri))
    db = client[args.database] if args.database else client.get_default_database("bucketq")
    return BucketqTransport(db, prefix=args.prefix), client


def _current_shard() -> Any:
    """Where a replayed record goes: its shard under today's RESERVOIR_BUFFER_SHARDS,
    OVERFLOW_PROJECTS and SHARD_KEY (the shard count may have changed since it died)."""
    from ._config import from_env
    from ._policy import record_shard

    cfg = from_env()

    def shard_of(dead: Any) -> int:
        rec = dead.get("record") if isinstance(dead.get("record"), dict) else {}
        return record_shard(str(dead.get("kind") or "log"), str(dead["project_id"]), rec,
                            cfg.shards, cfg.overflow_projects, cfg.shard_key)  # fmt: skip

    return shard_of


def _line(e: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(float(e.get("dead_at") or 0), UTC).isoformat(timespec="seconds")
    rec = e.get("record") or {}
    msg = rec.get("message") or rec.get("name") or ""
    return (
        f"{when} shard={e.get('shard')} {e.get('kind')} project={e.get('project_id')} "
        f"attempts={e.get('attempts')} id={e.get('id')}\n    reason: {e.get('reason')}\n    record: {str(msg)[:120]}"
    )


async def _run(args: argparse.Namespace) -> int:
    transport, client = await _open(args)
    try:
        if args.dlq_command == "list":
            size = await transport.dlq_size()
            rows = await transport.dlq_inspect(args.limit)
            if args.json:
                for e in rows:
                    print(json.dumps(e, default=str))
            else:
                from ._config import from_env

                dropped = await transport.dlq_dropped()
                print(
                    f"{size} dead-lettered record(s) in {args.transport} DLQ {args.prefix}:dlq; showing {len(rows)}"
                )
                print(
                    f"bound: RESERVOIR_BUFFER_DLQ_MAX={from_env().dlq_max}; "
                    f"{dropped} oldest record(s) dropped by it so far"
                )
                for e in rows:
                    print(_line(e))
        elif args.dlq_command == "requeue":
            n = await transport.dlq_replay(args.limit, _current_shard())
            print(f"requeued {n} record(s) onto their shards")
        else:
            size = await transport.dlq_size()
            if not args.yes:
                print(f"{size} record(s) would be purged; run again with --yes to delete them")
                return 0
            n = await transport.dlq_purge()
            print(f"purged {n} record(s)")
        return 0
    finally:
        await transport.stop()
        if client is not None:
            await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bucketq", description="bucketq reservoir buffer tools")
    sub = parser.add_subparsers(dest="command", required=True)
    add_dlq_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
