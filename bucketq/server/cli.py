"""``bucketq serve``, ``bucketq keys create|list|revoke`` and ``bucketq logs convert``.

``add_parsers(subparsers)`` adds the commands to the ``bucketq`` command line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from .. import _validate as v
from ..errors import BucketQError
from ._config import DEFAULT_DATABASE, DEFAULT_HOST, DEFAULT_PORT, LOG_LEVELS

EXTRA = "bucketq[server]"


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _serve(args: argparse.Namespace) -> int:
    from .._deps import require_all

    try:
        require_all(("fastapi", "google.rpc", "opentelemetry.proto", "uvicorn"), "server")
    except BucketQError as exc:
        print(f"bucketq serve: {exc}", file=sys.stderr)
        return 2
    from ._config import from_env
    from ._run import serve

    try:
        cfg = from_env(mongodb_uri=args.mongodb_uri, database=args.database,
                       log_level=args.log_level)  # fmt: skip
    except BucketQError as exc:
        print(f"bucketq serve: {exc}", file=sys.stderr)
        return 2
    _setup_logging(cfg.log_level)
    try:
        return serve(host=args.host, port=args.port, config=cfg, data=args.data,
                     log_level=cfg.log_level, workers=args.workers)  # fmt: skip
    except (BucketQError, OSError) as exc:
        print(f"bucketq serve: {exc}", file=sys.stderr)
        return 1


def _keys_db(args: argparse.Namespace) -> tuple[Any, Any]:
    from pymongo import MongoClient

    from ..bucket.writes import durable_write_concern
    from ._config import from_env

    uri = v.require_mongodb_uri(args.mongodb_uri, "keep keys in")
    cfg = from_env(mongodb_uri=uri, database=args.database)
    client: Any = MongoClient(uri, serverSelectionTimeoutMS=cfg.mongodb_timeout_ms, tz_aware=True)
    db = client[cfg.database] if cfg.database else client.get_default_database(DEFAULT_DATABASE)
    # A key reported created (or revoked) is on disk, as every write bucketq reports.
    return client, db.with_options(write_concern=durable_write_concern(None, db.write_concern))


def _keys(args: argparse.Namespace) -> int:
    from pymongo.errors import PyMongoError

    from . import _keys as keys

    try:
        client, db = _keys_db(args)
        try:
            if args.keys_command == "create":
                if args.operator == bool(args.project):
                    raise BucketQError(
                        "Give --project NAME (an ingest key) or --operator (a console key)."
                    )
                key = keys.create_key(
                    db, args.project or "", args.name or "", operator=args.operator
                )
                whose = "an operator" if args.operator else f"project {args.project!r}"
                print(f"created a key for {whose} (database {db.name!r}); "
                      "it is shown only now:", file=sys.stderr)  # fmt: skip
                print(key, flush=True)
            elif args.keys_command == "list":
                rows = keys.list_keys(db, args.project)
                kept = keys.retention_settings(db)
                from ._config import from_env

                default = from_env().retention_days  # BUCKETQ_RETENTION_DAYS
                print(
                    f"{'KEY':<14} {'PROJECT':<20} {'RETENTION':<10} {'CREATED':<20} {'REVOKED':<20} NAME"
                )
                for r in rows:
                    created = f"{r['created_at']:%Y-%m-%d %H:%M:%S}" if r.get("created_at") else ""
                    revoked = f"{r['revoked_at']:%Y-%m-%d %H:%M:%S}" if r.get("revoked_at") else "-"
                    days = kept.get(r["project"], default)
                    ret = (
                        "-"
                        if r["project"] == keys.OPERATOR
                        else (f"{days}d" if days else "forever")
                    )
                    print(
                        f"{r['prefix'] + '...':<14} {r['project']:<20} {ret:<10} {created:<20} {revoked:<20} {r.get('name', '')}"
                    )
            elif args.keys_command == "retention":
                keys.set_retention(db, args.project, args.days)
                how = f"{args.days} days" if args.days else "forever"
                print(f"project {args.project!r} keeps its log records {how}")
            else:
                r = keys.revoke_key(db, args.key_prefix)
                print(f"revoked {r['prefix']}... of project {r['project']!r}")
        finally:
            client.close()
    except PyMongoError as exc:
        print(f"bucketq keys: MongoDB failed: {exc}", file=sys.stderr)
        return 1
    except BucketQError as exc:
        print(f"bucketq keys: {exc}", file=sys.stderr)
        return 1
    return 0


def _logs(args: argparse.Namespace) -> int:
    """``bucketq logs convert``: the old layout's records into buckets, with progress."""
    import asyncio

    from pymongo.errors import PyMongoError

    async def run() -> int:
        from pymongo import AsyncMongoClient

        from ..reservoir import MongoReservoir

        client, db = _keys_db(args)  # the checks and the database name `keys` uses
        client.close()
        aclient: Any = AsyncMongoClient(v.mongodb_uri(args.mongodb_uri), tz_aware=True)
        try:
            store = MongoReservoir(aclient[db.name]).logstore
            left = await store.legacy_left()
            print(f"{left} log records in the layout of an earlier release "
                  f"(collection {store.legacy.name!r} of database {db.name!r})", flush=True)  # fmt: skip
            if not left:
                return 0
            await store.create_indexes()

            def progress(done: int, left: int) -> None:
                print(f"converted {done} in all; {left} left", flush=True)

            n = await store.convert_legacy(batch=args.batch, progress=progress)
            print(f"done: {n} records converted by this run; {await store.legacy_left()} left")
            return 0
        finally:
            await aclient.close()

    try:
        return asyncio.run(run())
    except (PyMongoError, BucketQError, RuntimeError) as exc:
        print(f"bucketq logs convert: {exc} Run it again to go on: what it converted stays "
              "converted, once.", file=sys.stderr)  # fmt: skip
        return 1


def _db_options(p: argparse.ArgumentParser, fallback: str = v.FROM_STORE) -> None:
    v.add_mongodb_uri(p, fallback)
    p.add_argument("--database",
                   help=f"database (default: $BUCKETQ_DATABASE, else the URI's, else {DEFAULT_DATABASE})")  # fmt: skip


def add_parsers(sub: Any) -> None:
    """Add ``serve`` and ``keys`` to the ``bucketq`` sub-parsers."""
    s = sub.add_parser(
        "serve",
        help=f"run the log ingestion HTTP API (LogTide-shaped and OTLP) (needs {EXTRA})",
        description="Serve POST /api/v1/ingest, OTLP/HTTP /v1/logs and /v1/traces, GET /api/v1/logs, "
        "/metrics, /health, /ready. Storage: --mongodb-uri, else $BUCKETQ_MONGODB_URI, else an "
        "embedded store it starts. "
        "The buffer: RESERVOIR_BUFFER_* (off by default). See docs/server.md.",
    )
    s.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    s.add_argument(
        "--port",
        type=v.cli_count(0, 65535),
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0: any free)",
    )
    _db_options(s, "an embedded store it starts and keeps running")
    s.add_argument(
        "--data",
        help="embedded server's data directory (default: ~/.local/share/bucketq/serve-data)",
    )
    s.add_argument("--workers", type=v.cli_count(1), default=1,
                   help="processes serving the one port (default 1); metrics count all of them")  # fmt: skip
    s.add_argument("--log-level", choices=LOG_LEVELS,
                   help="level of the log on stderr (default: $BUCKETQ_LOG_LEVEL, else info)")  # fmt: skip
    s.set_defaults(func=_serve)

    k = sub.add_parser("keys", help="create, list or revoke ingest API keys")
    ks = k.add_subparsers(
        dest="keys_command", required=True, metavar="{create,list,retention,revoke}"
    )
    c = ks.add_parser("create", help="create a key for a project; prints it alone on the last line")
    c.add_argument("--project", help="the project the key reads and writes")
    c.add_argument("--operator", action="store_true",
                   help="a key for the console at /console instead (no project)")  # fmt: skip
    c.add_argument("--name", help="a label shown by `keys list`")
    _db_options(c)
    c.set_defaults(func=_keys)
    ls = ks.add_parser("list", help="list keys (prefix, project, created, revoked)")
    ls.add_argument("--project", help="only this project's keys")
    _db_options(ls)
    ls.set_defaults(func=_keys)
    rt = ks.add_parser("retention", help="how long a project's log records are kept")
    rt.add_argument("--project", required=True)
    rt.add_argument("--days", type=int, required=True,
                    help="days (0: forever); default for a project without one: BUCKETQ_RETENTION_DAYS")  # fmt: skip
    _db_options(rt)
    rt.set_defaults(func=_keys)
    r = ks.add_parser("revoke", help="revoke a key; it fails within a second")
    r.add_argument(
        "key_prefix", metavar="KEY_PREFIX", help="the key, or its start as `keys list` shows it"
    )
    _db_options(r)
    r.set_defaults(func=_keys)

    lg = sub.add_parser("logs", help="convert log records stored by an earlier release")
    lgs = lg.add_subparsers(dest="logs_command", required=True, metavar="{convert}")
    cv = lgs.add_parser(
        "convert",
        help="move records of the one-document-per-record layout into buckets; resumable",
        description="Moves the records of the collection `logs` (one document per record, "
        "written by releases before the bucketed log store) into `log_buckets`, a batch at a "
        "time, saying how far it got. Stopped anywhere, run it again: each record is stored "
        "once and deleted from `logs` only after its bucket is stored. `bucketq serve` may "
        "run meanwhile.",
    )
    cv.add_argument("--batch", type=v.cli_count(1, 100_000), default=1000,
                    help="records per batch (default 1000)")  # fmt: skip
    _db_options(cv)
    cv.set_defaults(func=_logs)
