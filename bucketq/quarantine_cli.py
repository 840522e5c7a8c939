"""``bucketq quarantine list|requeue|purge``: damaged buckets a queue set aside.

A consumer that claims a damaged bucket (its items do not decode, their count is not
the bucket's, a field is missing or ill-typed) moves it to ``<queue>.quarantine`` and
goes on; a stream consumer does so on ``consumer.quarantine(seq)``. These commands show
those buckets, put what can be recovered back (new buckets; at the end of a stream),
or delete them for good.

``add_quarantine_parser(subparsers)`` adds the command group; ``args.func(args)`` runs it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import _validate as v
from .errors import BucketQError


def add_quarantine_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``quarantine`` with ``list``, ``requeue`` and ``purge`` (the verbs of ``dlq`` and
    ``queues dead``) to ``subparsers``; ``remove`` is a deprecated alias of ``purge``."""
    qp = subparsers.add_parser(
        "quarantine", help="list, requeue or purge the damaged buckets a queue set aside"
    )
    sub = qp.add_subparsers(dest="quarantine_command", required=True,
                            metavar="{list,requeue,purge}")  # fmt: skip
    helps = {
        "list": "print each quarantined bucket: id, when, why, items recoverable and lost",
        "requeue": "put the items that can be recovered back in the queue (new buckets)",
        "purge": "delete quarantined buckets for good",
    }

    def arguments(p: argparse.ArgumentParser, cmd: str) -> None:
        v.add_mongodb_uri(p)
        p.add_argument(
            "--database", default=None, help="MongoDB database (default: the URI's, else bucketq)"
        )
        p.add_argument("--queue", required=True, help="the queue's (or stream's) name")
        p.add_argument("--stream", action="store_true", help="the queue is a stream-mode queue")
        if cmd != "list":
            p.add_argument("--id", default=None, help="only this bucket (default: every one)")
        else:
            p.add_argument("--limit", type=v.cli_count(1), default=None, help="at most this many")
        p.set_defaults(func=run_quarantine)

    for cmd, text in helps.items():
        arguments(sub.add_parser(cmd, help=text), cmd)
    v.deprecated_alias(sub, "remove", "purge", "quarantine_command",
                       lambda p: arguments(p, "purge"))  # fmt: skip
    return qp


def run_quarantine(args: argparse.Namespace) -> int:
    try:
        args.mongodb_uri = v.require_mongodb_uri(args.mongodb_uri, "read")
    except BucketQError as exc:
        print(f"bucketq quarantine: {exc}", file=sys.stderr)
        return 2
    from pymongo import MongoClient

    from .bucket.deadline import client_timeouts
    from .queue import Queue
    from .stream import StreamQueue

    client: Any = MongoClient(args.mongodb_uri, **client_timeouts(args.mongodb_uri))
    try:
        db = client[args.database] if args.database else client.get_default_database("bucketq")
        q: Any = (StreamQueue if args.stream else Queue)(db, args.queue)
        try:
            return _run(args, q)
        finally:
            q.close()
    except BucketQError as exc:
        print(f"bucketq quarantine: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


def _run(args: argparse.Namespace, q: Any) -> int:
    cmd = args.quarantine_command
    if cmd == "list":
        rows = q.quarantined(args.limit)
        if not rows:
            print(f"{args.queue}: no quarantined buckets")
        for r in rows:
            extra = f", re-queued {r['requeued']}" if "requeued" in r else ""
            print(f"{r['id']}  {r['at']:%Y-%m-%d %H:%M:%S}  n={r['n']}  recoverable="
                  f"{r['recoverable']} lost={r['lost']}{extra}  {r['reason']}")  # fmt: skip
    elif cmd == "requeue":
        rep = q.requeue_quarantined(args.id)
        print(f"{args.queue}: re-queued {rep['items']} items of {rep['buckets']} buckets; "
              f"{rep['lost']} items could not be recovered ({rep['kept']} buckets kept "
              "in quarantine until removed)")  # fmt: skip
    else:
        n = q.remove_quarantined(args.id)
        print(f"{args.queue}: purged {n} quarantined buckets")
    return 0
