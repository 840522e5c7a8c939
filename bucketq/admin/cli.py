"""``bucketq queues list|peek|dead|watch``: the queues and streams of a database.

``add_queues_parser(subparsers)`` adds the command group; ``args.func(args)`` runs it.
MongoDB: ``--mongodb-uri`` found as every command finds it (``_validate.mongodb_uri``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from .. import _validate as v
from ..errors import BucketQError
from . import _core as core

DEFAULT_DATABASE = "bucketq"
#: Seconds between two refreshes of ``watch``.
WATCH_INTERVAL = 1.0


def add_queues_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``queues`` with ``list``, ``peek``, ``dead`` and ``watch`` to ``subparsers``."""
    qp = subparsers.add_parser(
        "queues", help="list queues and streams with their counts, peek at items, dead letters"
    )
    sub = qp.add_subparsers(dest="queues_command", required=True,
                            metavar="{list,peek,dead,watch}")  # fmt: skip

    def common(p: argparse.ArgumentParser) -> None:
        v.add_mongodb_uri(p)
        p.add_argument("--database", default=None,
                       help=f"database (default: $BUCKETQ_DATABASE, else the URI's, else {DEFAULT_DATABASE})")  # fmt: skip
        p.add_argument("--json", action="store_true", help="print JSON, for scripts")

    ls = sub.add_parser("list", help="every queue and stream with ready / scheduled / leased / "
                        "dead / quarantined counts")  # fmt: skip
    common(ls)
    pk = sub.add_parser("peek", help="the first items of a queue or stream, without reserving them")
    pk.add_argument("name", help="the queue's or stream's name")
    pk.add_argument("--n", type=v.cli_count(1, core.MAX_PEEK), default=10, help="how many (10)")
    common(pk)
    dd = sub.add_parser("dead", help="a queue's dead letters: list, requeue or purge")
    dd.add_argument("name", help="the queue's name (its dead letters are in NAME.dlq)")
    dd.add_argument("action", nargs="?", choices=("list", "requeue", "purge"), default="list")
    dd.add_argument("--id", action="append", dest="ids", metavar="ID",
                    help="only this dead letter (repeatable; default: every one)")  # fmt: skip
    dd.add_argument("--n", type=v.cli_count(1, core.MAX_PEEK), default=100,
                    help="list: how many (100)")  # fmt: skip
    dd.add_argument("--yes", action="store_true", help="requeue or purge without asking")
    common(dd)
    w = sub.add_parser("watch", help="a live table of `list`, refreshed every second, with rates")
    w.add_argument(
        "--interval",
        type=v.cli_number(0, open_lo=True, unit="seconds"),
        default=WATCH_INTERVAL,
        help="seconds (1)",
    )
    w.add_argument("--count", type=v.cli_count(1), default=None,
                   help="stop after this many refreshes (default: until Ctrl-C)")  # fmt: skip
    common(w)
    for p in (ls, pk, dd, w):
        p.set_defaults(func=run_queues)
    return qp


def run_queues(args: argparse.Namespace) -> int:
    from pymongo import MongoClient

    from ..bucket.deadline import client_timeouts
    from . import Inspector

    uri = v.require_mongodb_uri(args.mongodb_uri, "read")
    client: Any = MongoClient(uri, tz_aware=True, **client_timeouts(uri))
    try:
        name = args.database or v.env_var("BUCKETQ_DATABASE", v.database_name, optional=True)
        db = client[name] if name else client.get_default_database(DEFAULT_DATABASE)
        ins = Inspector(db)
        cmd = args.queues_command
        if cmd == "list":
            return _list(args, ins)
        if cmd == "peek":
            return _items(args, ins.peek(args.name, args.n), f"{args.name}: nothing stored")
        if cmd == "dead":
            return _dead(args, ins)
        return _watch(args, ins)
    finally:
        client.close()


def _emit(args: argparse.Namespace, data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _list(args: argparse.Namespace, ins: Any) -> int:
    rows = ins.queues()
    if args.json:
        _emit(args, [r.to_json() for r in rows])
        return 0
    if not rows:
        print(f"no queues or streams in database {ins.db.name!r}")
        return 0
    _print_table(rows, {})
    return 0


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


COLUMNS = ("name", "kind", "ready", "scheduled", "leased", "dead", "quarantined", "lag",
           "oldest ready", "next mature", "consumers")  # fmt: skip


def table_rows(rows: list[core.QueueRow], rates: dict[str, core.Rates]) -> list[list[str]]:
    out = []
    for r in rows:
        cells = [r.name, r.kind, r.ready, r.scheduled, r.leased, r.dead, r.quarantined, r.lag,
                 None if r.oldest_ready_s is None else f"{r.oldest_ready_s:.1f} s",
                 f"{r.next_mature:%Y-%m-%d %H:%M:%S}" if r.next_mature else None,
                 len(r.consumers)]  # fmt: skip
        if r.name in rates:
            cells.append(f"{rates[r.name].total:+.1f}/s")
        out.append([_cell(c) for c in cells])
    return out


def _print_table(rows: list[core.QueueRow], rates: dict[str, core.Rates]) -> None:
    head = list(COLUMNS) + (["total change"] if rates else [])
    body = table_rows(rows, rates)
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    print("  ".join(h.upper().ljust(w) for h, w in zip(head, widths, strict=True)))
    for b in body:
        print("  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)))


def _items(args: argparse.Namespace, views: list[core.ItemView], empty: str) -> int:
    if args.json:
        _emit(args, [x.to_json() for x in views])
        return 0
    if not views:
        print(empty)
    for x in views:
        mature = f"{x.mature:%Y-%m-%d %H:%M:%S}" if x.mature else "-"
        held = f"  leased by {x.leased_by}" if x.leased_by else ""
        print(f"{x.id}  tries={x.tries}  mature={mature}{held}")
        if x.headers:
            print(f"    headers: {core.shorten(x.headers)}")
        print(f"    payload: {x.payload}")
    return 0


def _dead(args: argparse.Namespace, ins: Any) -> int:
    if args.action == "list":
        return _items(args, ins.dead(args.name, args.n), f"{args.name}: no dead letters")
    what = f"{len(args.ids)} dead letters" if args.ids else "every dead letter"
    if not args.yes:
        if not sys.stdin.isatty():
            print(f"bucketq queues dead: {args.action} of {what} of {args.name!r} needs "
                  "--yes when not run in a terminal", file=sys.stderr)  # fmt: skip
            return 2
        answer = input(f"{args.action} {what} of queue {args.name!r}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing done")
            return 1
    fn = ins.requeue_dead if args.action == "requeue" else ins.purge_dead
    rep = fn(args.name, args.ids)
    if args.json:
        _emit(args, rep)
    else:
        done = "requeued" if args.action == "requeue" else "purged"
        print(f"{args.name}: {done} {rep['items']} dead letters of {rep['buckets']} buckets"
              + (f"; {rep['busy']} buckets skipped (a consumer of the dead-letter queue holds them)"
                 if rep["busy"] else "")
              + (f"; {rep['missing']} not found" if rep["missing"] else ""))  # fmt: skip
    return 0 if not rep["busy"] and not rep["missing"] else 1


def _watch(args: argparse.Namespace, ins: Any) -> int:
    interval = max(0.2, float(args.interval))
    last: dict[str, core.QueueRow] = {}
    last_t = 0.0
    shown = 0
    live: Any = None
    if not args.json:
        from .._deps import require

        try:
            Live = require("rich.live", "bench", "bucketq queues watch (without --json)").Live
        except BucketQError as exc:
            print(f"bucketq queues watch: {exc}", file=sys.stderr)
            return 2
        live = Live(auto_refresh=False)
        live.start()
    try:
        while args.count is None or shown < args.count:
            t = time.monotonic()
            rows = ins.queues()
            rates = {r.name: core.Rates.between(last.get(r.name), r, t - last_t) for r in rows}
            if args.json:
                print(json.dumps({"at": time.time(), "queues": [
                    {**r.to_json(), "rates": vars(rates[r.name])} for r in rows]}), flush=True)  # fmt: skip
            else:
                live.update(_rich_table(rows, rates, ins.db.name), refresh=True)
            last, last_t = {r.name: r for r in rows}, t
            shown += 1
            if args.count is not None and shown >= args.count:
                break
            time.sleep(max(0.0, interval - (time.monotonic() - t)))
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return 0


def _rich_table(rows: list[core.QueueRow], rates: dict[str, core.Rates], db: str) -> Any:
    from rich.table import Table

    table = Table(title=f"bucketq queues in {db} ({time.strftime('%H:%M:%S')})")
    for h in (*COLUMNS, "total change", "ready change"):
        table.add_column(h, justify="left" if h in ("name", "kind", "next mature") else "right")
    for r, cells in zip(rows, table_rows(rows, {}), strict=True):
        rt = rates.get(r.name) or core.Rates()
        table.add_row(*cells, f"{rt.total:+.1f}/s", f"{rt.ready:+.1f}/s")
    return table
