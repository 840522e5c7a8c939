"""``bucketq worker MODULE:FUNCTION --queue NAME``: run a handler on a queue's items
(docs/worker.md).

One process runs the handler on a ``Queue`` (a sync handler, in ``--concurrency``
threads) or an ``AsyncQueue`` (an ``async def`` handler, in as many tasks); with
``--processes P`` a supervisor runs P such processes. ``--metrics-port`` serves
``/metrics`` (the queue's collector and the worker's counters) and ``/health``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from . import _validate as v
from .cli import _check_reachable
from .errors import ConfigurationError
from .worker import core

DEFAULT_DATABASE = "bucketq"
log = logging.getLogger("bucketq.worker")

DESCRIPTION = """\
Run MODULE:FUNCTION on every item of queue NAME: its return commits the item, an
exception rolls it back (delivered again after the queue's back-off; past the queue's
max_tries, to its dead-letter queue: unset by default, --queue-option max_tries=5 sets
it). SIGTERM or SIGINT: no new items, the items in hand finish within --drain-timeout,
the rest is released; exit 0. A second signal releases what is held at once. An
`async def` handler runs on an AsyncQueue in --concurrency tasks, a plain function on a
Queue in --concurrency threads.

example:  bucketq worker myapp.tasks:send_email --queue emails --concurrency 8
"""

#: Options of the queue a command line may set with --queue-option NAME=VALUE: every
#: QueueOptions field that is read from text like the others.
_TEXT_TYPES = (int, float, bool, str)


def add_worker_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "worker",
        help="run a handler (MODULE:FUNCTION) on a queue's items, with concurrency, time "
        "limits, back-off, dead letters and a clean stop on SIGTERM",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return _arguments(p)


def main(argv: list[str] | None = None) -> int:
    """``python -m bucketq.worker_cli ARGS`` is ``bucketq worker ARGS`` without building
    every other command's parser: how a supervisor starts its worker processes quickly."""
    from .cli import _Parser, _user_errors

    args = _arguments(_Parser(prog="bucketq worker", description=DESCRIPTION)).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise
        print(f"bucketq worker: error: {v.one_line(exc)}", file=sys.stderr)
        return 1


def _arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "handler", metavar="MODULE:FUNCTION", help="the handler, e.g. myapp.tasks:send_email"
    )
    p.add_argument("--queue", required=True, metavar="NAME", help="the queue's name")
    for s in core.SETTINGS:
        flag = "--" + s.field.replace("_", "-")
        if s.check is v.flag:
            p.add_argument(flag, action="store_true", help=s.help)
        else:
            default = f" (default {s.default_text})" if s.default_text else ""
            p.add_argument(flag, type=_setting_type(s), default=s.default, metavar="N",
                           help=f"{s.help}{default}")  # fmt: skip
    p.add_argument("--processes", type=v.cli_count(1, 256), default=1, metavar="P",
                   help="worker processes, each with its own queue object and "
                        "--concurrency handlers, under one supervisor (default 1)")  # fmt: skip
    p.add_argument("--queue-option", action="append", default=[], metavar="NAME=VALUE",
                   help="a queue option, e.g. max_tries=5 or lease=60 (repeatable)")  # fmt: skip
    v.add_mongodb_uri(p)
    p.add_argument("--database", help=f"database (default: $BUCKETQ_DATABASE, else the URI's, "
                   f"else {DEFAULT_DATABASE})")  # fmt: skip
    p.add_argument(
        "--metrics-port",
        type=v.cli_count(0, 65535),
        metavar="PORT",
        help="serve /metrics (Prometheus) and /health on this port (0: a free one)",
    )
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="the address /metrics listens on (default 127.0.0.1)")  # fmt: skip
    p.add_argument("--log-level", default="INFO",
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="(default INFO)")  # fmt: skip
    p.add_argument("--log-json", action="store_true",
                   help="log one JSON object a line, with the failures' fields")  # fmt: skip
    # The supervisor starts its children with the descriptor of their end of its socket.
    p.add_argument("--child-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=run_worker)
    return p


def _setting_type(s: v.Setting) -> Any:
    def read(text: str) -> Any:
        if text.strip().lower() == "none":
            text = ""  # an option that is off unless set (--time-limit none)
        try:
            return s.parse(text, "it")
        except ConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("it ").rstrip(".")) from None

    read.__name__ = "value"
    return read


def queue_options(pairs: list[str]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs as queue options, each read by its option's own check."""
    from .bucket import QueueOptions

    fields = QueueOptions.__dataclass_fields__
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        f = fields.get(name)
        if not sep or f is None or "check" not in f.metadata:
            known = sorted(k for k, x in fields.items() if "check" in x.metadata)
            raise ConfigurationError(
                f"--queue-option takes NAME=VALUE with NAME one of {', '.join(known)}; "
                f"got {pair!r}."
            )
        check, limits = f.metadata["check"]
        out[name] = v.parse(check, f"--queue-option {name}", text, **limits)
    return out


class JsonLines(logging.Formatter):
    """One JSON object a line: time, level, logger, pid, message, and a failure's fields
    (``core.LOG_FIELDS``)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": self.formatTime(record), "level": record.levelname,
               "logger": record.name, "pid": record.process, "message": record.getMessage()}  # fmt: skip
        for k in core.LOG_FIELDS:
            if k in record.__dict__:
                out[k] = record.__dict__[k]
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _setup_logging(level: str, json_lines: bool) -> None:
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(
        JsonLines()
        if json_lines
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    )
    root = logging.getLogger()
    root.addHandler(h)
    root.setLevel(level)


def _database(client: Any, args: argparse.Namespace) -> Any:
    name = args.database or v.env_var("BUCKETQ_DATABASE", v.database_name, optional=True)
    return client[name] if name else client.get_default_database(DEFAULT_DATABASE)


def _worker_options(args: argparse.Namespace) -> dict[str, Any]:
    return {s.field: getattr(args, s.field) for s in core.SETTINGS}


def run_worker(args: argparse.Namespace) -> int:
    from .worker import is_async, load_handler

    _setup_logging(args.log_level, args.log_json)
    handler = load_handler(args.handler)  # in a supervisor too: a bad name fails once, here
    qopts = queue_options(args.queue_option)
    wopts = _worker_options(args)
    core.WorkerOptions.build(**wopts)
    uri = v.require_mongodb_uri(args.mongodb_uri, "consume from")
    _check_reachable(uri)
    if args.processes > 1:
        return _supervise(args, uri, qopts)
    if is_async(handler):
        return asyncio.run(_run_async(args, uri, handler, qopts, wopts))
    return _run_sync(args, uri, handler, qopts, wopts)


def _exit_status(report: dict[str, Any]) -> int:
    return core.EXIT_STUCK if report.get("reason") == core.STUCK_REASON else 0


def _run_sync(args: argparse.Namespace, uri: str, handler: Any, qopts: dict[str, Any],
              wopts: dict[str, Any]) -> int:  # fmt: skip
    from pymongo import MongoClient

    from .bucket.deadline import client_timeouts
    from .queue import Queue
    from .worker import Worker

    client: MongoClient[dict[str, Any]] = MongoClient(uri, **client_timeouts(uri))
    try:
        q = Queue(_database(client, args), args.queue, **qopts)
        w = Worker(q, handler, **wopts, stop_when_stuck=args.child_fd is not None)
        with _Around(args, w, q, _database(client, args)):
            report = w.run()
        q.close()
        return _exit_status(report)
    finally:
        client.close()


async def _run_async(args: argparse.Namespace, uri: str, handler: Any, qopts: dict[str, Any],
                     wopts: dict[str, Any]) -> int:  # fmt: skip
    from pymongo import AsyncMongoClient, MongoClient

    from .bucket.deadline import client_timeouts
    from .queue import AsyncQueue
    from .worker import AsyncWorker

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(uri, **client_timeouts(uri))
    # The metrics' size queries are sync (bucketq.admin): a client of their own.
    sync: MongoClient[dict[str, Any]] | None = (
        MongoClient(uri, **client_timeouts(uri)) if args.metrics_port is not None else None
    )
    try:
        q = AsyncQueue(_database(client, args), args.queue, **qopts)
        w = AsyncWorker(q, handler, **wopts, stop_when_stuck=args.child_fd is not None)
        with _Around(args, w, q, None if sync is None else _database(sync, args)):
            report = await w.run()
        await q.close()
        return _exit_status(report)
    finally:
        await client.close()
        if sync is not None:
            sync.close()


class _Around:
    """What runs beside one worker process: its metrics endpoint, and its channel to a
    supervisor (``--child-fd``)."""

    def __init__(self, args: argparse.Namespace, worker: Any, queue: Any, db: Any) -> None:
        self.args, self.worker, self.queue, self.db = args, worker, queue, db
        self.endpoint: Any = None
        self.channel: Any = None

    def __enter__(self) -> _Around:
        from .worker.processes import ChildChannel

        if self.args.metrics_port is not None:
            self.endpoint = _endpoint(
                self.args, self.db, lambda: [self.worker.stats()], [self.queue],
                self.worker.health,
            ).start()  # fmt: skip
        if self.args.child_fd is not None:
            self.channel = ChildChannel(self.args.child_fd, self.worker, self.queue).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.endpoint is not None:
            self.endpoint.stop()


def _endpoint(args: argparse.Namespace, db: Any, workers: Any, objects: list[Any],
              health: Any) -> Any:  # fmt: skip
    from ._deps import require

    require("prometheus_client", "worker")
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from .metrics import QueueCollector, WorkerCollector
    from .worker.endpoint import Endpoint

    registry = CollectorRegistry()
    registry.register(QueueCollector(db, [args.queue], objects=objects))
    registry.register(WorkerCollector(workers))
    return Endpoint(args.metrics_host, args.metrics_port,
                    lambda: (generate_latest(registry), CONTENT_TYPE_LATEST), health)  # fmt: skip


class _Summed:
    """The queue counters of a supervisor's children, as one queue object's ``stats()``."""

    def __init__(self, name: str, reports: Any) -> None:
        self.name = name
        self._reports = reports

    def stats(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self._reports():
            for k, n in (r.get("queue") or {}).items():
                if isinstance(n, int):
                    out[k] = out.get(k, 0) + n
        return out


def _supervise(args: argparse.Namespace, uri: str, qopts: dict[str, Any]) -> int:
    from .worker.processes import Supervisor

    argv = [args.handler, "--queue", args.queue, "--log-level", args.log_level]
    if args.log_json:
        argv.append("--log-json")
    if args.database:
        argv += ["--database", args.database]
    for pair in args.queue_option:
        argv += ["--queue-option", pair]
    for s in core.SETTINGS:
        value = getattr(args, s.field)
        if s.check is v.flag:
            argv += [f"--{s.field.replace('_', '-')}"] if value else []
        elif value != s.default:
            text = "none" if value is None else repr(value)
            argv += [f"--{s.field.replace('_', '-')}", text]
    # The URI goes in the environment, not on a command line other users can read.
    env = {**os.environ, v.MONGODB_URI_ENV: uri}
    drain = args.drain_timeout
    if drain is None:
        from .bucket import QueueOptions

        drain = qopts.get("drain_timeout", QueueOptions().drain_timeout)
    sup = Supervisor(argv, args.processes, stop_wait=drain + 15.0, env=env)
    endpoint = None
    client = None
    if args.metrics_port is not None:
        from pymongo import MongoClient

        from .bucket.deadline import client_timeouts

        client = MongoClient(uri, **client_timeouts(uri))

        def workers() -> list[dict[str, Any]]:
            return [r["worker"] for r in sup.reports() if r.get("worker")]

        endpoint = _endpoint(args, _database(client, args), workers,
                             [_Summed(args.queue, sup.reports)], sup.health).start()  # fmt: skip
    t0 = time.monotonic()
    try:
        code = sup.run()
    finally:
        if endpoint is not None:
            endpoint.stop()
        if client is not None:
            client.close()
    log.info("supervisor: stopped after %.1f s (exit status %d)", time.monotonic() - t0, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
